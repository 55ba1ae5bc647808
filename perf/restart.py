"""The restart benchmark: SIGKILL a scheduler mid-run, start it again, time its return.

One run, on a fresh sandbox of ``nodes`` 8-GPU nodes:

1. a backlog bigger than the cluster, created before any scheduler starts: ``gangs``
   gangs of ``gang_size`` single-GPU pods (quorum = size) and ``pods`` single pods of
   ``pod_gpus`` GPUs each (the defaults ask for more GPUs than exist, so work is still
   waiting when the cluster is full);
2. the scheduler starts (time zero of the first start) and binds;
3. once the watch has seen ``kill_fraction`` of the pods bound, the scheduler is killed
   with SIGKILL (no clean shutdown: no lease release, binds in flight lost);
4. the harness waits until no new bind has been seen for ``quiet`` seconds (Bindings the
   killed process had already sent may still land), so every later bind is the new
   process's own;
5. the same scheduler starts again, with the same configuration (time zero of the
   restart); recorded: seconds until its ``/readyz`` answers, until its first bind, its CPU
   seconds until that bind, and the pods it bound in the ``after`` seconds that follow.

Every peer of :mod:`perf.peers` can run it; for kube-scheduler the gangs are ordinary pods
(it has no gangs), for kube-scheduler-gang and coscheduling they are their own PodGroups.
Peers alternate A B A B over ``runs`` rounds, each run on a fresh control plane.
``python -m perf restart`` (small by default; ``--nodes 5000 --gangs 100 --pods 20000``
is issue 13's size) writes ``<out>/restart/<tag>.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import KubeError
from perf import procstat
from perf.live import (
    CREATE_CONCURRENCY,
    NAMESPACE,
    BindWatch,
    RunError,
    check_podgroup_crd,
    create_all,
    fresh_sandbox,
    wait_ready,
)
from perf.peers import GANG_X_K8S, Peer, Running, apiserver_args, get_peer
from perf.workload import Expanded, NodeSpec, PodClass, PodSpec, Size, Workload


@dataclass(slots=True, frozen=True)
class RestartSize:
    nodes: int = 500
    gangs: int = 10
    gang_size: int = 64
    pods: int = 2000
    pod_gpus: int = 2
    #: kill once this fraction of all pods is bound
    kill_fraction: float = 0.25
    #: after a kill, wait until no bind was seen for this long before restarting
    quiet: float = 2.0
    #: after the restart's first bind, keep counting binds this long
    after: float = 10.0
    timeout: float = 600.0

    @property
    def tag(self) -> str:
        return f"{self.nodes}n-{self.gangs}x{self.gang_size}g-{self.pods}p{self.pod_gpus}"


def backlog(size: RestartSize) -> Expanded:
    """The pods: the gangs, then the single pods (more GPUs asked than exist by default)."""
    node = NodeSpec()
    gang = PodClass(name="g", gpus=1, gang=size.gang_size)
    single = PodClass(name="p", gpus=size.pod_gpus)
    wl = Workload(
        name="restart", description="restart: a backlog larger than the cluster",
        schedulers=(), node=node, classes=(gang, single),
        sizes={}, default_size="", oversubscribed=True,
    )
    pods: list[PodSpec] = []
    common = {"cpu": "100m", "memory": "128Mi", "priority_class": "", "stream": False}
    for g in range(size.gangs):
        name = f"g-g{g:05d}"
        for m in range(size.gang_size):
            pods.append(PodSpec(name=f"{name}-{m:03d}", klass="g", gpus=1, gang=name,
                                gang_size=size.gang_size, min_count=size.gang_size, **common))  # type: ignore[arg-type]
    for i in range(size.pods):
        pods.append(PodSpec(name=f"p-{i:06d}", klass="p", gpus=size.pod_gpus, **common))  # type: ignore[arg-type]
    return Expanded(workload=wl, size_name=size.tag, size=Size(nodes=size.nodes, pods=len(pods)), pods=tuple(pods))


def _kill(running: Running) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(running.proc.pid, signal.SIGKILL)
    running.proc.wait()


async def _first_bind_after(watch: BindWatch, t: float, running: Running, deadline: float) -> float | None:
    """Monotonic time of the first bind the watch saw after ``t`` (None: exited or deadline)."""
    while True:
        later = [b for b, _ in watch.bound.values() if b > t]
        if later:
            return min(later)
        if not running.alive() or time.monotonic() > deadline:
            return None
        watch.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch.changed.wait(), 0.05)


async def _measure(peer: Peer, ex: Expanded, size: RestartSize, kubeconfig: str, workdir: Path) -> dict[str, Any]:
    client = await KubeClient.connect(kubeconfig, max_connections=CREATE_CONCURRENCY + 8)
    first: Running | None = None
    second: Running | None = None
    watch_task: asyncio.Task[None] | None = None
    out: dict[str, Any] = {"scheduler": peer.name, "pods": len(ex.pods), "gangs": len(ex.gangs),
                           "gpu_demand": ex.gpu_demand, "gpu_capacity": ex.gpu_capacity}
    try:
        if peer.gang_style == GANG_X_K8S and ex.gangs:
            await check_podgroup_crd(client)
        await client.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        watch = BindWatch(client, NAMESPACE)
        watch_task = asyncio.create_task(watch.run())
        await asyncio.wait_for(watch.synced.wait(), 60)
        t = time.monotonic()
        await create_all(client, peer.group_objects(ex, NAMESPACE))
        pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        await create_all(client, ((pod_path, peer.pod(p)) for p in ex.pods))
        out["create_s"] = round(time.monotonic() - t, 2)

        # the first start, killed mid-run
        first = peer.start(kubeconfig, workdir / "start-1")
        ready1 = asyncio.create_task(wait_ready(first))
        kill_at = max(1, int(len(ex.pods) * size.kill_fraction))
        deadline = first.started + size.timeout
        while len(watch.bound) < kill_at:
            if not first.alive():
                raise RunError(f"{peer.name} exited before the kill: {first.log_tail()}")
            if time.monotonic() > deadline:
                raise RunError(f"{peer.name} bound {len(watch.bound)} of {kill_at} pods in {size.timeout:.0f} s")
            watch.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.changed.wait(), 0.05)
        t_kill = time.monotonic()
        _kill(first)
        times = sorted(b for b, _ in watch.bound.values())
        out["first_start"] = {
            "ready_s": _round(ready1.result() if ready1.done() else None),
            "first_bind_s": _round(times[0] - first.started) if times else None,
            "killed_at_s": _round(t_kill - first.started),
            "bound_at_kill": len(watch.bound),
        }
        ready1.cancel()

        # let binds already sent by the killed process land, so later binds are the new one's
        while True:
            last = max((b for b, _ in watch.bound.values()), default=t_kill)
            if time.monotonic() - max(last, t_kill) >= size.quiet:
                break
            await asyncio.sleep(0.05)
        out["first_start"]["bound_before_restart"] = len(watch.bound)
        out["quiet_wait_s"] = _round(time.monotonic() - t_kill)
        if not _work_fits(ex, watch):
            raise RunError(
                f"the first start had bound all that fits ({len(watch.bound)} pods, with the Bindings it had sent "
                "before the kill) so nothing is left to time after the restart: use a larger backlog or a "
                "smaller --kill-fraction"
            )

        # the restart
        second = peer.start(kubeconfig, workdir / "start-2")
        cpu = procstat.Window(second.pid, start_cpu=0.0, started=second.started)
        ready2 = asyncio.create_task(wait_ready(second))
        pending = len(ex.pods) - len(watch.bound)
        first_bind = await _first_bind_after(watch, second.started, second, second.started + size.timeout)
        usage_to_first = cpu.end(time.monotonic())
        if first_bind is None:
            err = f"{peer.name} exited after the restart: {second.log_tail()}" if not second.alive() \
                else f"{peer.name} bound nothing within {size.timeout:.0f} s of its restart"
            raise RunError(err)
        bound_at_first = len(watch.bound)
        await asyncio.sleep(max(0.0, first_bind + size.after - time.monotonic()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready2, 5)
        in_window = sum(1 for b, _ in watch.bound.values() if first_bind <= b <= first_bind + size.after)
        out["restart"] = {
            "ready_s": _round(ready2.result() if ready2.done() else None),
            "first_bind_s": _round(first_bind - second.started),
            "cpu_s_to_first_bind": _round(usage_to_first.cpu_seconds),
            "pending_at_restart": pending,
            "bound_at_first_bind": bound_at_first,
            "after_s": size.after,
            "bound_in_after": in_window,
            "pods_per_s_after": _round(in_window / size.after) if size.after else None,
            "peak_rss_bytes": procstat.peak_rss(second.pid),
        }
        # gangs partly bound when the run ends (a kill mid-gang can leave one; a restarted
        # scheduler that completes or evicts it clears it later): informational
        members: dict[str, int] = {}
        for name in watch.bound:
            gang = name.rsplit("-", 1)[0] if name.startswith("g-") else ""
            if gang:
                members[gang] = members.get(gang, 0) + 1
        out["partial_gangs_at_end"] = sum(1 for n in members.values() if 0 < n < size.gang_size)
        out["bound_at_end"] = len(watch.bound)
        out["ok"] = True
        out["error"] = ""
    finally:
        if watch_task is not None:
            watch_task.cancel()
            with contextlib.suppress(BaseException):
                await watch_task
        for running in (first, second):
            if running is not None and running.alive():
                await asyncio.get_running_loop().run_in_executor(None, running.stop)
        await client.close()
    return out


def _work_fits(ex: Expanded, watch: BindWatch) -> bool:
    """Could some pending pod (or whole gang of one-GPU pods) still be placed?"""
    gpus = {p.name: p.gpus for p in ex.pods}
    used: dict[str, int] = {}
    for name, (_, node) in watch.bound.items():
        used[node] = used.get(node, 0) + gpus.get(name, 0)
    per_node = ex.workload.node.gpus
    free = [per_node - used.get(f"gpu-node-{i}", 0) for i in range(ex.size.nodes)]
    pending = [p for p in ex.pods if p.name not in watch.bound]
    if any(not p.gang and any(f >= p.gpus for f in free) for p in pending):
        return True
    gangs_left = {p.gang for p in pending if p.gang}
    return any(sum(f for f in free if f > 0) >= ex.gangs[g][1] for g in gangs_left)


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def run_restart(
    *, size: RestartSize, schedulers: list[str], runs: int, out: Path, log: Callable[[str], None],
    strict: bool = False,
) -> dict[str, Any]:
    """Every peer, A B A B, each run on a fresh sandbox; writes and returns the data."""
    from perf.suite import machine, write_json

    ex = backlog(size)
    peers = [get_peer(n) for n in schedulers]
    for p in peers:
        p.check()
    args = apiserver_args(peers)
    data: dict[str, Any] = {
        "benchmark": "restart", "size": size.tag, "nodes": size.nodes, "gangs": size.gangs,
        "gang_size": size.gang_size, "single_pods": size.pods, "pod_gpus": size.pod_gpus,
        "pods": len(ex.pods), "gpu_demand": ex.gpu_demand, "gpu_capacity": ex.gpu_capacity,
        "kill_fraction": size.kill_fraction, "quiet_s": size.quiet, "after_s": size.after,
        "apiserver_args": args,
        "peers": {p.name: {"settings": p.settings, "gangs": p.gang_style or "none (gang pods are plain pods)"} for p in peers},
        "machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": [],
    }
    path = out / "restart" / f"{size.tag}.json"
    workdir = out / "work" / f"restart-{size.tag}"
    shutil.rmtree(workdir, ignore_errors=True)
    for r in range(runs):
        for peer in peers:
            log(f"restart {size.tag}: round {r + 1}/{runs}: {peer.name} ...")
            t_up = time.monotonic()
            try:
                with fresh_sandbox(f"perf-{os.getpid()}", size.nodes, ex.workload.node, args) as state:
                    up_s = time.monotonic() - t_up
                    result = asyncio.run(_measure(peer, ex, size, state.kubeconfig, workdir / f"{peer.name}-{r}"))
                    result["sandbox_up_s"] = round(up_s, 1)
            except (RunError, KubeError, TimeoutError) as exc:
                if strict:
                    raise
                result = {"scheduler": peer.name, "ok": False, "error": str(exc)}
            result["round"] = r
            data["runs"].append(result)
            write_json(path, data)
            if result["ok"]:
                f, s = result["first_start"], result["restart"]
                log(f"restart {size.tag}: {peer.name}: killed at {f['bound_at_kill']} bound "
                    f"({f['killed_at_s']} s); restart: ready {s['ready_s']} s, first bind {s['first_bind_s']} s, "
                    f"{s['pending_at_restart']} pending, {s['pods_per_s_after']} pods/s after")
            else:
                log(f"restart {size.tag}: {peer.name}: FAILED: {result['error']}")
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json(path, data)
    return data
