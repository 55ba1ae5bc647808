"""The sandbox at scale: how long N fake nodes take to become Ready, and what idling costs.

For each node count, on a fresh sandbox (``batchsched.sandbox``, the same code as
``batchsched sandbox up``):

1. the control plane starts with no nodes;
2. a list + watch on Nodes (and, when kwok holds Leases, on ``kube-node-lease``) starts;
3. the nodes are created and waited for exactly as ``Sandbox.up`` does
   (:func:`batchsched.sandbox.nodes.create_nodes`, :func:`~batchsched.sandbox.nodes.wait_nodes_ready`);
   every ``--sample`` seconds: nodes created, Ready, CPU of each process over the interval,
   Lease renewals and Node writes per second seen by the watch;
4. then the cluster idles for ``--idle`` seconds with nothing to do: CPU of each process
   (percent of one core) and every node that left Ready (a flap: the controller manager
   marked it NotReady/Unknown, or kwok failed to keep it Ready).

``python -m perf sandbox --nodes 1000,5000,10000 --idle 120`` writes
``<out>/sandbox/<nodes>.json`` per count and prints a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import KubeError
from perf import procstat

LEASE_NS = "kube-node-lease"


def _ready(node: dict[str, Any]) -> bool:
    from batchsched.sandbox.nodes import node_is_ready

    return node_is_ready(node)


class NodeWatch:
    """Which nodes are Ready now, how many writes to Nodes and Leases the watch sees."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.ready: dict[str, bool] = {}
        self.node_events = 0
        self.lease_events = 0
        #: (monotonic time, node) of every Ready -> not Ready transition
        self.flaps: list[tuple[float, str]] = []
        self.synced = asyncio.Event()

    def _see(self, obj: dict[str, Any], deleted: bool = False) -> None:
        name = obj["metadata"]["name"]
        if deleted:
            self.ready.pop(name, None)
            return
        now_ready = _ready(obj)
        if self.ready.get(name) and not now_ready:
            self.flaps.append((time.monotonic(), name))
        self.ready[name] = now_ready

    async def _loop(self, path: str, on_event: Callable[[str, dict[str, Any]], None], *, initial: bool) -> None:
        rv = ""
        while True:
            try:
                if not rv:
                    items, rv = await self.client.list(path, page=1000)
                    if initial:
                        for obj in items:
                            on_event("ADDED", obj)
                        self.synced.set()
                async for etype, obj in self.client.watch(path, rv, timeout_seconds=300):
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if etype != "BOOKMARK":
                        on_event(etype, obj)
            except KubeError:
                rv = ""
                await asyncio.sleep(0.5)

    def _node_event(self, etype: str, obj: dict[str, Any]) -> None:
        self.node_events += 1
        self._see(obj, deleted=etype == "DELETED")

    def _lease_event(self, etype: str, obj: dict[str, Any]) -> None:
        self.lease_events += 1

    async def run(self) -> None:
        await asyncio.gather(
            self._loop("/api/v1/nodes", self._node_event, initial=True),
            self._loop(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases", self._lease_event, initial=False),
        )

    def count_ready(self) -> int:
        return sum(self.ready.values())


class CpuSampler:
    """CPU seconds of a set of processes, read from /proc at each call of :meth:`sample`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.last = {n: procstat.cpu_seconds(p) or 0.0 for n, p in pids.items()}
        self.t = time.monotonic()

    def sample(self) -> dict[str, float]:
        """Percent of one core each process used since the last call."""
        now = time.monotonic()
        cur = {n: procstat.cpu_seconds(p) or 0.0 for n, p in self.pids.items()}
        wall = max(now - self.t, 1e-9)
        out = {n: round(100 * (cur[n] - self.last[n]) / wall, 1) for n in self.pids}
        self.last, self.t = cur, now
        return out


async def _measure(
    kubeconfig: str, pids: dict[str, int], nodes: int, *, idle: float, sample: float, timeout: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    from batchsched.sandbox.nodes import NodeShape, create_nodes, wait_nodes_ready

    pids = {**pids, "client (this process)": os.getpid()}
    client = await KubeClient.connect(kubeconfig)
    watch = NodeWatch(client)
    task = asyncio.create_task(watch.run())
    samples: list[dict[str, Any]] = []
    result: dict[str, Any] = {"nodes": nodes}
    try:
        await asyncio.wait_for(watch.synced.wait(), 60)
        t0 = time.monotonic()
        created = 0

        async def make() -> None:
            nonlocal created
            names = await create_nodes(client, [NodeShape(count=nodes)])
            created = len(names)
            result["create_s"] = round(time.monotonic() - t0, 2)
            await wait_nodes_ready(client, names, timeout=timeout)

        cpu = CpuSampler(pids)
        maker = asyncio.create_task(make())
        last_events = (0, 0)
        error = ""
        while True:
            done, _ = await asyncio.wait({maker}, timeout=sample)
            pct = cpu.sample()
            ev = (watch.node_events, watch.lease_events)
            row = {
                "t": round(time.monotonic() - t0, 1), "phase": "up",
                "nodes": len(watch.ready), "ready": watch.count_ready(),
                "node_writes_per_s": round((ev[0] - last_events[0]) / sample, 1),
                "lease_writes_per_s": round((ev[1] - last_events[1]) / sample, 1),
                "cpu_percent": pct,
            }
            last_events = ev
            samples.append(row)
            log(f"{nodes} nodes: t={row['t']} s: {row['nodes']} exist, {row['ready']} Ready; "
                f"writes/s nodes {row['node_writes_per_s']} leases {row['lease_writes_per_s']}; cpu {pct}")
            if done:
                exc = maker.exception()
                if exc is not None:
                    error = str(exc)
                break
        result["ready_s"] = None if error else round(time.monotonic() - t0, 2)
        result["error"] = error
        result["created"] = created
        result["flaps_during_up"] = len(watch.flaps)
        # idle: nothing to do; what does keeping N nodes alive cost?
        flaps_before = len(watch.flaps)
        idle_cpu = CpuSampler(pids)
        t_idle = time.monotonic()
        ev0 = (watch.node_events, watch.lease_events)
        min_ready = watch.count_ready()
        while time.monotonic() - t_idle < idle:
            await asyncio.sleep(min(sample, idle - (time.monotonic() - t_idle)))
            min_ready = min(min_ready, watch.count_ready())
            samples.append({"t": round(time.monotonic() - t0, 1), "phase": "idle",
                            "nodes": len(watch.ready), "ready": watch.count_ready()})
        span = time.monotonic() - t_idle
        result["idle_s"] = round(span, 1)
        result["idle_cpu_percent"] = idle_cpu.sample() if idle > 0 else {}
        result["idle_node_writes_per_s"] = round((watch.node_events - ev0[0]) / span, 1) if idle > 0 else None
        result["idle_lease_writes_per_s"] = round((watch.lease_events - ev0[1]) / span, 1) if idle > 0 else None
        result["idle_flaps"] = len(watch.flaps) - flaps_before
        result["idle_min_ready"] = min_ready
        result["samples"] = samples
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await client.close()
    return result


def run_one(nodes: int, *, idle: float, sample: float, timeout: float, log: Callable[[str], None]) -> dict[str, Any]:
    """One node count on a fresh sandbox; the sandbox is stopped afterwards."""
    from batchsched.sandbox.cluster import Sandbox

    box = Sandbox(f"perf-scale-{os.getpid()}")
    t = time.monotonic()
    state = box.up([])
    control_plane_s = time.monotonic() - t
    try:
        pids = {p.name: p.pid for p in state.processes}
        result = asyncio.run(_measure(state.kubeconfig, pids, nodes, idle=idle, sample=sample, timeout=timeout, log=log))
    finally:
        box.down()
    result["control_plane_s"] = round(control_plane_s, 2)
    result["load_before"] = os.getloadavg()[0]
    return result


def table(results: list[dict[str, Any]]) -> list[str]:
    procs = ["kube-apiserver", "etcd", "kube-controller-manager", "kwok"]
    lines = [
        "| nodes | control plane s | create s | all Ready s | flaps during up | idle s | idle flaps | "
        + " | ".join(f"idle {p} CPU %" for p in procs) + " | idle lease writes/s | idle node writes/s |",
        "|---" * (8 + len(procs)) + "|",
    ]
    for r in results:
        cpu = r.get("idle_cpu_percent") or {}
        lines.append(
            f"| {r['nodes']:,} | {r['control_plane_s']} | {r.get('create_s', '-')} | "
            f"{r['ready_s'] if r.get('ready_s') is not None else 'FAILED: ' + r.get('error', '')} | "
            f"{r.get('flaps_during_up', '-')} | {r.get('idle_s', '-')} | {r.get('idle_flaps', '-')} | "
            + " | ".join(str(cpu.get(p, "-")) for p in procs)
            + f" | {r.get('idle_lease_writes_per_s', '-')} | {r.get('idle_node_writes_per_s', '-')} |"
        )
    return lines
