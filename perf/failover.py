"""The failover benchmark: two replicas of batchsched with leader election, the leader
stopped, the time until the standby binds.

One run, on a fresh sandbox of ``nodes`` 8-GPU nodes:

1. a backlog created before any scheduler starts (:func:`perf.restart.backlog`: ``pods``
   single pods of ``pod_gpus`` GPUs, and ``gangs`` gangs if asked);
2. two replicas start together, each with leader election on the same Lease
   (``batchsched-system/batchsched``), its own identity and its own ports; whichever takes
   the Lease first leads, the other stands by with its watches running;
3. once the watch has seen ``kill_fraction`` of the pods bound by the leader (each Binding
   names the replica that sent it, :data:`~batchsched.kube.binder.BOUND_BY`), the leader
   is stopped: with SIGKILL (``kill``: no release, the Lease must lapse) or SIGTERM
   (``term``: a graceful stop that drains what is in flight and releases the Lease);
4. recorded, in seconds from the signal: when the Lease was seen released (``term``),
   when it was seen held by the standby, and when the watch saw the standby's first
   Binding; with the Lease's last renewal before the signal (a lapse comes
   ``leaseDurationSeconds`` after it) and what the standby logged about its catch-up.

The Lease is read every :data:`LEASE_POLL_SECONDS` by the harness, so its times are late
by up to that. ``python -m perf failover`` writes ``<out>/failover/<tag>.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchsched.kube.binder import BOUND_BY
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError
from batchsched.kube.leader import parse_time
from perf.live import (
    CREATE_CONCURRENCY,
    NAMESPACE,
    BindWatch,
    RunError,
    create_all,
    fresh_sandbox,
    wait_ready,
)
from perf.peers import Running, apiserver_args, free_port, get_peer
from perf.restart import RestartSize, backlog

LEASE_NAMESPACE = "batchsched-system"
LEASE_NAME = "batchsched"
LEASE_POLL_SECONDS = 0.05
MODES = ("kill", "term")
#: what a replica logs when it lists collections again before its first step, or while
#: its leader is silent (batchsched/app.py)
_CATCH_UP = re.compile(r"read (\d+) collections again (before leading|while the leader is silent) \(([\d.]+) s\): "
                       r"(\d+) shown current by their watches, (\d+) listed")


@dataclass(slots=True, frozen=True)
class FailoverSize:
    nodes: int = 200
    pods: int = 2000
    pod_gpus: int = 2
    gangs: int = 0
    gang_size: int = 64
    #: stop the leader once it has bound this fraction of all pods
    kill_fraction: float = 0.1
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    timeout: float = 600.0

    @property
    def tag(self) -> str:
        return (f"{self.nodes}n-{self.gangs}x{self.gang_size}g-{self.pods}p{self.pod_gpus}"
                f"-lease{self.lease_duration:g}")

    def backlog_size(self) -> RestartSize:
        return RestartSize(nodes=self.nodes, gangs=self.gangs, gang_size=self.gang_size, pods=self.pods,
                           pod_gpus=self.pod_gpus)


class ReplicaBindWatch(BindWatch):
    """A :class:`~perf.live.BindWatch` that also records which replica bound each pod."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        super().__init__(client, namespace)
        #: pod name -> the identity its Binding carried ("" when none)
        self.by: dict[str, str] = {}

    def _see(self, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        if (obj.get("spec") or {}).get("nodeName") and meta.get("name") not in self.bound:
            self.by[meta["name"]] = (meta.get("annotations") or {}).get(BOUND_BY, "")
        super()._see(obj, now)

    def first_by(self, identity: str) -> float | None:
        """Monotonic time the first pod bound by ``identity`` was seen."""
        return min((t for name, (t, _) in self.bound.items() if self.by.get(name) == identity), default=None)

    def count_by(self, identity: str) -> int:
        return sum(1 for who in self.by.values() if who == identity)


@dataclass(slots=True)
class LeaseSeen:
    """One read of the Lease: when (monotonic and wall clock), its holder, its renewTime."""

    at: float
    wall: float
    holder: str
    renewed: float | None


class LeaseWatch:
    """Reads the Lease every :data:`LEASE_POLL_SECONDS` and keeps each change of holder."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}"
        self.last: LeaseSeen | None = None
        self.changes: list[LeaseSeen] = []
        self.changed = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                lease = await self.client.get(self.path)
            except NotFoundError:
                lease = {}
            except KubeError:
                await asyncio.sleep(LEASE_POLL_SECONDS)
                continue
            spec = lease.get("spec") or {}
            seen = LeaseSeen(at=time.monotonic(), wall=time.time(), holder=str(spec.get("holderIdentity") or ""),
                             renewed=parse_time(spec.get("renewTime")))
            if self.last is None or seen.holder != self.last.holder:
                self.changes.append(seen)
                self.changed.set()
            self.last = seen
            await asyncio.sleep(LEASE_POLL_SECONDS)

    def first(self, holder: str, after: float) -> float | None:
        """Monotonic time the Lease was first seen held by ``holder`` after ``after``."""
        return next((c.at for c in self.changes if c.at > after and c.holder == holder), None)


def start_replica(kubeconfig: str, workdir: Path, identity: str, size: FailoverSize) -> Running:
    """One batchsched replica with leader election on the shared Lease, on ports of its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "identity": identity,
        "metricsAddress": f"127.0.0.1:{port}",
        "explain": {"address": f"127.0.0.1:{free_port()}"},
        "leaderElection": {
            "enabled": True, "namespace": LEASE_NAMESPACE, "leaseName": LEASE_NAME,
            "leaseDurationSeconds": size.lease_duration, "renewDeadlineSeconds": size.renew_deadline,
            "retryPeriodSeconds": size.retry_period,
        },
    }))
    log_path = workdir / "batchsched.log"
    with open(log_path, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "batchsched", "run", "--kubeconfig", kubeconfig, "--config", str(cfg)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir,
        )
    return Running(peer=get_peer("batchsched"), proc=proc, log=log_path, started=started,
                   metrics_url=f"http://127.0.0.1:{port}/metrics", ready_url=f"http://127.0.0.1:{port}/readyz")


async def _until(what: str, cond: Callable[[], bool], deadline: float, event: asyncio.Event,
                 alive: Callable[[], str]) -> None:
    """Wait for ``cond()``; RunError once ``deadline`` passes or ``alive()`` names a problem."""
    while not cond():
        problem = alive()
        if problem:
            raise RunError(f"{problem} while waiting for {what}")
        if time.monotonic() > deadline:
            raise RunError(f"no {what} by the deadline")
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), 0.05)


def catch_up_logged(running: Running) -> list[dict[str, Any]]:
    """What a replica logged about listing collections again: when (before leading, or
    while its leader was silent), how many, in how many seconds."""
    try:
        text = running.log.read_text(errors="replace")
    except OSError:
        return []
    return [{"when": m.group(2), "collections": int(m.group(1)), "seconds": float(m.group(3)),
             "by_watch": int(m.group(4)), "listed": int(m.group(5))} for m in _CATCH_UP.finditer(text)]


def _since(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 3)


async def _measure(mode: str, size: FailoverSize, kubeconfig: str, workdir: Path) -> dict[str, Any]:
    ex = backlog(size.backlog_size())
    peer = get_peer("batchsched")
    client = await KubeClient.connect(kubeconfig, max_connections=CREATE_CONCURRENCY + 8)
    replicas: dict[str, Running] = {}
    tasks: list[asyncio.Task[None]] = []
    out: dict[str, Any] = {"mode": mode, "pods": len(ex.pods), "gpu_demand": ex.gpu_demand,
                           "gpu_capacity": ex.gpu_capacity}
    try:
        for ns in (NAMESPACE, LEASE_NAMESPACE):
            with contextlib.suppress(ConflictError):  # the Lease's may come with the sandbox
                await client.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        watch = ReplicaBindWatch(client, NAMESPACE)
        lease = LeaseWatch(client)
        tasks += [asyncio.create_task(watch.run()), asyncio.create_task(lease.run())]
        await asyncio.wait_for(watch.synced.wait(), 60)
        t = time.monotonic()
        await create_all(client, peer.group_objects(ex, NAMESPACE))
        await create_all(client, ((f"/api/v1/namespaces/{NAMESPACE}/pods", peer.pod(p)) for p in ex.pods))
        out["create_s"] = round(time.monotonic() - t, 2)

        for identity in ("replica-a", "replica-b"):
            replicas[identity] = start_replica(kubeconfig, workdir / identity, identity, size)
        started = min(r.started for r in replicas.values())
        ready = {name: asyncio.create_task(wait_ready(r)) for name, r in replicas.items()}

        def exited() -> str:
            gone = [n for n, r in replicas.items() if not r.alive()]
            return f"{gone[0]} exited: {replicas[gone[0]].log_tail()}" if gone else ""

        deadline = started + size.timeout
        await _until("leader", lambda: lease.last is not None and lease.last.holder in replicas,
                     deadline, lease.changed, exited)
        assert lease.last is not None
        leader = lease.last.holder
        standby = next(n for n in replicas if n != leader)
        kill_at = max(1, int(len(ex.pods) * size.kill_fraction))
        await _until(f"{kill_at} pods bound by {leader}", lambda: watch.count_by(leader) >= kill_at,
                     deadline, watch.changed, exited)
        await _until(f"{standby} ready", lambda: ready[standby].done(), deadline, watch.changed, exited)
        before = lease.last
        t_stop = time.monotonic()
        os.killpg(replicas[leader].pid, signal.SIGKILL if mode == "kill" else signal.SIGTERM)
        wall_stop = time.time()
        bound_at_stop, by_leader_at_stop = len(watch.bound), watch.count_by(leader)
        exit_seen = asyncio.create_task(_exit_seen(replicas[leader], t_stop + 60))
        # the Lease as the signal left it (a SIGKILLed leader renews no more; the harness's
        # last poll may predate a renewal made just before the signal)
        with contextlib.suppress(KubeError):
            spec = (await client.get(lease.path)).get("spec") or {}
            if spec.get("holderIdentity") == leader:
                before = LeaseSeen(at=t_stop, wall=wall_stop, holder=leader, renewed=parse_time(spec.get("renewTime")))

        def standby_gone() -> str:
            s = replicas[standby]
            return "" if s.alive() else f"{standby} exited: {s.log_tail()}"

        await _until(f"a Binding by {standby}", lambda: watch.first_by(standby) is not None,
                     t_stop + size.timeout, watch.changed, standby_gone)
        first_bind = watch.first_by(standby)
        exited_at = await exit_seen
        took = lease.first(standby, t_stop)
        renewed = before.renewed if before is not None else None
        out.update({
            "leader": leader, "standby": standby,
            "ready_s": {n: _round(task.result()) if task.done() else None for n, task in ready.items()},
            "leader_first_bind_s": _since(watch.first_by(leader), started),
            "bound_by_leader_at_stop": by_leader_at_stop, "bound_at_stop": bound_at_stop,
            "pending_at_stop": len(ex.pods) - bound_at_stop,
            "last_renew_before_stop_s": None if renewed is None else round(wall_stop - renewed, 3),
            "leader_exited_s": _since(exited_at, t_stop),
            "released_s": _since(lease.first("", t_stop), t_stop),
            "taken_s": _since(took, t_stop),
            "first_bind_s": _since(first_bind, t_stop),
            "first_bind_after_taken_s": None if took is None or first_bind is None else round(first_bind - took, 3),
            "bound_by_leader_after_stop": watch.count_by(leader) - by_leader_at_stop,
            "catch_up": catch_up_logged(replicas[standby]),
        })
        for task in ready.values():
            task.cancel()
        out["ok"] = True
        out["error"] = ""
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for running in replicas.values():
            if running.alive():
                await asyncio.get_running_loop().run_in_executor(None, running.stop)
        await client.close()
    return out


async def _exit_seen(running: Running, deadline: float) -> float | None:
    """When the stopped leader was seen gone (polled every 50 ms; None: still there at ``deadline``)."""
    while running.alive():
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.05)
    return time.monotonic()


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def table(data: dict[str, Any]) -> list[str]:
    """One line per run: the figures, in seconds from the stop signal."""
    head = (f"{'mode':<5} {'run':>3} {'pending':>8} {'renewed':>8} {'released':>9} {'taken':>7} "
            f"{'1st bind':>9} {'after take':>10} {'relist':>7}")
    lines = [f"lease {data['lease_duration_s']:g} s, renew deadline {data['renew_deadline_s']:g} s, "
             f"retry {data['retry_period_s']:g} s; seconds from the signal ('renewed': the last renewal, before it)",
             head]

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}"

    for r in data["runs"]:
        if not r.get("ok"):
            lines.append(f"{r['mode']:<5} {r['round']:>3} FAILED: {r['error']}")
            continue
        cu = sum(c["seconds"] for c in r.get("catch_up") or [] if c["when"] == "before leading")
        lines.append(
            f"{r['mode']:<5} {r['round']:>3} {r['pending_at_stop']:>8} {f(r['last_renew_before_stop_s']):>8} "
            f"{f(r['released_s']):>9} {f(r['taken_s']):>7} {f(r['first_bind_s']):>9} "
            f"{f(r['first_bind_after_taken_s']):>10} {f(cu):>7}")
    return lines


def run_failover(*, size: FailoverSize, modes: list[str], runs: int, out: Path,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """Each mode ``runs`` times, each run on a fresh sandbox; writes and returns the data."""
    from perf.suite import machine, write_json

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode {bad[0]!r}: expected some of {', '.join(MODES)}")
    ex = backlog(size.backlog_size())
    args = apiserver_args([get_peer("batchsched")])
    data: dict[str, Any] = {
        "benchmark": "failover", "size": size.tag, "nodes": size.nodes, "single_pods": size.pods,
        "pod_gpus": size.pod_gpus, "gangs": size.gangs, "gang_size": size.gang_size, "pods": len(ex.pods),
        "kill_fraction": size.kill_fraction, "lease_duration_s": size.lease_duration,
        "renew_deadline_s": size.renew_deadline, "retry_period_s": size.retry_period,
        "lease_poll_s": LEASE_POLL_SECONDS, "apiserver_args": args,
        "machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": [],
    }
    path = out / "failover" / f"{size.tag}.json"
    workdir = out / "work" / f"failover-{size.tag}"
    shutil.rmtree(workdir, ignore_errors=True)
    for r in range(runs):
        for mode in modes:
            log(f"failover {size.tag}: round {r + 1}/{runs}: {mode} ...")
            t_up = time.monotonic()
            try:
                with fresh_sandbox(f"perf-{os.getpid()}", size.nodes, ex.workload.node, args) as state:
                    up_s = time.monotonic() - t_up
                    result = asyncio.run(_measure(mode, size, state.kubeconfig, workdir / f"{mode}-{r}"))
                    result["sandbox_up_s"] = round(up_s, 1)
            except (RunError, KubeError, TimeoutError) as exc:
                result = {"mode": mode, "ok": False, "error": str(exc)}
            result["round"] = r
            result["load_after"] = os.getloadavg()[0]
            data["runs"].append(result)
            write_json(path, data)
            if result["ok"]:
                log(f"failover {size.tag}: {mode}: lease taken {result['taken_s']} s, "
                    f"first bind {result['first_bind_s']} s after the signal")
            else:
                log(f"failover {size.tag}: {mode}: FAILED: {result['error']}")
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json(path, data)
    return data
