"""The idle benchmark: what a scheduler costs while work waits that can never fit.

One run, on a fresh sandbox of ``nodes`` 8-GPU nodes:

1. every node but ``free_nodes`` is filled with one 8-GPU pod bound at creation
   (``spec.nodeName``: no scheduler involved), so the cluster has ``free_nodes`` whole
   nodes free;
2. waiting work is created before the scheduler starts, by ``variant``:
   ``gangs``: ``gangs`` gangs of ``gang_size`` pods of 8 GPUs, quorum = size; each member
   alone would fit a free node, but a gang needs ``gang_size`` whole nodes and only
   ``free_nodes`` exist, so no gang can ever be placed;
   ``pods``: as many single pods of 8 GPUs; the first ``free_nodes`` of them can be
   bound, the rest never (for schedulers without gangs);
3. the scheduler starts; after ``settle`` seconds (it has listed everything, tried
   everything, written its statuses) nothing changes for ``window`` seconds, and the
   scheduler's CPU over that window is read from ``/proc`` (percent of one core), with
   the apiserver's and etcd's, the binds in the window (should be none), the writes to
   Nodes in the window (kwok's status heartbeats: each node every 4-9 minutes, as a
   kubelet's every 5) and, for batchsched, how many cycles it ran (its ``/metrics``).

``python -m perf idle`` (500 nodes by default; ``--nodes 5000`` is issue 13's size)
writes ``<out>/idle/<tag>.json``. The schedulers alternate A B A B over ``runs`` rounds,
each on a fresh control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
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
    scrape,
    wait_ready,
)
from perf.peers import GANG_X_K8S, Peer, Running, apiserver_args, get_peer
from perf.workload import Expanded, NodeSpec, PodClass, PodSpec, Size, Workload

FILLER_NS = "perf-filler"
GPUS = 8


@dataclass(slots=True, frozen=True)
class IdleSize:
    nodes: int = 500
    free_nodes: int = 4
    gangs: int = 100
    gang_size: int = 8
    variant: str = "gangs"
    settle: float = 20.0
    window: float = 60.0
    sample: float = 10.0

    def __post_init__(self) -> None:
        if self.variant not in ("gangs", "pods"):
            raise ValueError(f"variant must be gangs or pods, got {self.variant!r}")
        if not 0 <= self.free_nodes < self.nodes:
            raise ValueError("free nodes must be at least 0 and fewer than the nodes")
        if self.variant == "gangs" and self.gang_size <= self.free_nodes:
            raise ValueError(f"a gang of {self.gang_size} whole nodes would fit the {self.free_nodes} free nodes")

    @property
    def tag(self) -> str:
        return f"{self.variant}-{self.nodes}n-{self.free_nodes}free-{self.gangs}x{self.gang_size}"


def waiting(size: IdleSize) -> Expanded:
    wl = Workload(
        name="idle", description="idle: work that can never fit",
        schedulers=(), node=NodeSpec(gpus=GPUS), classes=(PodClass(name="w", gpus=GPUS, gang=size.gang_size),),
        sizes={}, default_size="", oversubscribed=True,
    )
    common = {"klass": "w", "gpus": GPUS, "cpu": "100m", "memory": "128Mi", "priority_class": "", "stream": False}
    pods: list[PodSpec] = []
    for g in range(size.gangs):
        name = f"w-g{g:05d}"
        for m in range(size.gang_size):
            if size.variant == "gangs":
                pods.append(PodSpec(name=f"{name}-{m:03d}", gang=name, gang_size=size.gang_size,
                                    min_count=size.gang_size, **common))  # type: ignore[arg-type]
            else:
                pods.append(PodSpec(name=f"{name}-{m:03d}", **common))  # type: ignore[arg-type]
    return Expanded(workload=wl, size_name=size.tag, size=Size(nodes=size.nodes, pods=len(pods)), pods=tuple(pods))


def _filler(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"fill-{node}"},
        "spec": {
            "nodeName": node,
            "schedulerName": "perf-nobody",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": "trainer:latest",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(GPUS)},
                              "limits": {"nvidia.com/gpu": str(GPUS)}},
            }],
        },
    }


async def _cycles(running: Running) -> float | None:
    if not running.metrics_url or not running.alive():
        return None
    metrics = await asyncio.get_running_loop().run_in_executor(None, scrape, running.metrics_url)
    return metrics.get("batchsched_cycle_duration_seconds_count{phase=total}")


class NodeEvents:
    """Counts writes to Nodes seen by a watch (kwok's status heartbeats, the controller manager)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.count = 0

    async def run(self) -> None:
        rv = ""
        while True:
            try:
                if not rv:
                    head = await self.client.get("/api/v1/nodes", limit=1)
                    rv = str((head.get("metadata") or {}).get("resourceVersion", ""))
                async for etype, obj in self.client.watch("/api/v1/nodes", rv, timeout_seconds=300):
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if etype != "BOOKMARK":
                        self.count += 1
            except KubeError:
                rv = ""
                await asyncio.sleep(0.5)


async def _measure(peer: Peer, ex: Expanded, size: IdleSize, kubeconfig: str, procs: dict[str, int],
                   workdir: Path) -> dict[str, Any]:
    client = await KubeClient.connect(kubeconfig, max_connections=CREATE_CONCURRENCY + 8)
    running: Running | None = None
    watch_task: asyncio.Task[None] | None = None
    nodes_task: asyncio.Task[None] | None = None
    out: dict[str, Any] = {"scheduler": peer.name, "variant": size.variant, "pods": len(ex.pods)}
    try:
        if peer.gang_style == GANG_X_K8S and ex.gangs:
            await check_podgroup_crd(client)
        nodes, _ = await client.list("/api/v1/nodes", page=1000)
        names = sorted(n["metadata"]["name"] for n in nodes)
        busy = names[size.free_nodes:]
        for ns in (NAMESPACE, FILLER_NS):
            await client.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        t = time.monotonic()
        await create_all(client, ((f"/api/v1/namespaces/{FILLER_NS}/pods", _filler(n)) for n in busy))
        watch = BindWatch(client, NAMESPACE)
        watch_task = asyncio.create_task(watch.run())
        await asyncio.wait_for(watch.synced.wait(), 60)
        await create_all(client, peer.group_objects(ex, NAMESPACE))
        pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        await create_all(client, ((pod_path, peer.pod(p)) for p in ex.pods))
        out["create_s"] = round(time.monotonic() - t, 2)

        node_events = NodeEvents(client)
        nodes_task = asyncio.create_task(node_events.run())
        running = peer.start(kubeconfig, workdir)
        ready = await wait_ready(running)
        out["ready_s"] = None if ready is None else round(ready, 3)
        await asyncio.sleep(max(0.0, running.started + size.settle - time.monotonic()))
        if not running.alive():
            raise RunError(f"{peer.name} exited: {running.log_tail()}")
        out["bound_before_window"] = len(watch.bound)

        # the window: nothing changes; what does waiting cost?
        cycles0 = await _cycles(running)
        pids = {"scheduler": running.pid, **{n: p for n, p in procs.items() if n in ("kube-apiserver", "etcd")}}
        t0 = time.monotonic()
        windows = {n: procstat.Window(p, started=t0) for n, p in pids.items()}
        step = procstat.Window(running.pid, started=t0)
        events0 = node_events.count
        series: list[float] = []
        while (left := t0 + size.window - time.monotonic()) > 0:
            await asyncio.sleep(min(size.sample, left))
            now = time.monotonic()
            u = step.end(now)
            series.append(round(u.cpu_percent or 0.0, 1))
            step = procstat.Window(running.pid, started=now)
        t1 = time.monotonic()
        events1 = node_events.count
        cycles1 = await _cycles(running)
        usage = {n: w.end(t1).to_json() for n, w in windows.items()}
        if not running.alive():
            raise RunError(f"{peer.name} exited during the window: {running.log_tail()}")
        out.update({
            "ok": True, "error": "",
            "window_s": round(t1 - t0, 2),
            "scheduler_cpu_percent": round(usage["scheduler"]["cpu_percent"] or 0.0, 2),
            "scheduler_cpu_s": round(usage["scheduler"]["cpu_seconds"] or 0.0, 3),
            "scheduler_cpu_percent_series": series,
            "apiserver_cpu_percent": round(usage.get("kube-apiserver", {}).get("cpu_percent") or 0.0, 2),
            "etcd_cpu_percent": round(usage.get("etcd", {}).get("cpu_percent") or 0.0, 2),
            "scheduler_rss_bytes": procstat.rss(running.pid),
            "binds_in_window": sum(1 for b, _ in watch.bound.values() if t0 <= b <= t1),
            # kwok posts each node's status every 4-9 minutes (as a kubelet does every 5):
            # the only writes a scheduler could see in the window
            "node_writes_in_window": events1 - events0,
            "bound_at_end": len(watch.bound),
            "cycles_in_window": None if cycles0 is None or cycles1 is None else cycles1 - cycles0,
            "usage": usage,
        })
    finally:
        for task in (watch_task, nodes_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if running is not None:
            await asyncio.get_running_loop().run_in_executor(None, running.stop)
        await client.close()
    return out


def run_idle(
    *, size: IdleSize, schedulers: list[str], runs: int, out: Path, log: Callable[[str], None],
    strict: bool = False,
) -> dict[str, Any]:
    """Every peer, A B A B, each on a fresh sandbox; writes and returns the data."""
    from perf.suite import machine, write_json

    ex = waiting(size)
    peers = [get_peer(n) for n in schedulers]
    for p in peers:
        if size.variant == "gangs" and p.gang_style is None:
            raise ValueError(f"{p.name} has no gangs: run it with --variant pods")
        p.check()
    args = apiserver_args(peers)
    data: dict[str, Any] = {
        "benchmark": "idle", "size": size.tag, "variant": size.variant, "nodes": size.nodes,
        "free_nodes": size.free_nodes, "gangs": size.gangs, "gang_size": size.gang_size, "pods": len(ex.pods),
        "settle_s": size.settle, "window_s": size.window, "apiserver_args": args,
        "peers": {p.name: {"settings": p.settings} for p in peers},
        "machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": [],
    }
    path = out / "idle" / f"{size.tag}.json"
    workdir = out / "work" / f"idle-{size.tag}"
    shutil.rmtree(workdir, ignore_errors=True)
    for r in range(runs):
        for peer in peers:
            log(f"idle {size.tag}: round {r + 1}/{runs}: {peer.name} ...")
            try:
                with fresh_sandbox(f"perf-{os.getpid()}", size.nodes, ex.workload.node, args) as state:
                    procs = {p.name: p.pid for p in state.processes}
                    result = asyncio.run(_measure(peer, ex, size, state.kubeconfig, procs, workdir / f"{peer.name}-{r}"))
            except (RunError, KubeError, TimeoutError) as exc:
                if strict:
                    raise
                result = {"scheduler": peer.name, "ok": False, "error": str(exc)}
            result["round"] = r
            data["runs"].append(result)
            write_json(path, data)
            if result["ok"]:
                log(f"idle {size.tag}: {peer.name}: {result['scheduler_cpu_percent']}% of a core over "
                    f"{result['window_s']} s (per {size.sample:.0f} s: {result['scheduler_cpu_percent_series']}); "
                    f"apiserver {result['apiserver_cpu_percent']}%; {result['binds_in_window']} binds; "
                    f"{result['node_writes_in_window']} node writes; "
                    f"cycles {result['cycles_in_window']}")
            else:
                log(f"idle {size.tag}: {peer.name}: FAILED: {result['error']}")
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json(path, data)
    return data
