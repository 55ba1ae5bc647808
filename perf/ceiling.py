"""The ceiling: how many Bindings per second this machine's apiserver takes.

On a fresh sandbox with the workload's nodes, for each concurrency in the sweep: create
``binds`` pending pods that no scheduler claims (``schedulerName: perf-nobody``), then
POST a Binding for each (with the pod's UID, as a scheduler does) from ``concurrency``
workers over raw aiohttp, doing nothing else. The pods are spread round-robin over the
nodes. Every scheduler's pods/s can then be read as a fraction of the best rate here.

In a live suite (:mod:`perf.suite`) the ceiling is one more member of every round (A, B,
ceiling, A, B, ceiling, ...) on a control plane of the same size and node shape as the
schedulers', so each run is divided by the ceiling measured under the same conditions
of the machine, not by one measured minutes later.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from batchsched.kube.client import KubeClient
from perf import procstat
from perf.live import StartError, create_all, ready_timeout
from perf.workload import NodeSpec

NOBODY = "perf-nobody"


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": NOBODY,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": "trainer:latest",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"},
                              "limits": {"nvidia.com/gpu": "1"}},
            }],
        },
    }


async def _bind_all(
    client: KubeClient, namespace: str, pods: list[tuple[str, str]], nodes: list[str], concurrency: int
) -> tuple[int, int]:
    """POST every binding; returns (accepted, failed)."""
    creds = client.creds
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if creds.token:
        headers["Authorization"] = creds.token
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=creds.ssl_context())
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(pods)):
        queue.put_nowait(i)
    ok = failed = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok, failed
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            name, uid = pods[i]
            body = orjson.dumps({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[i % len(nodes)]},
            })
            url = f"{creds.host}/api/v1/namespaces/{namespace}/pods/{name}/binding"
            async with session.post(url, data=body) as resp:
                await resp.read()
                if resp.status < 300:
                    ok += 1
                else:
                    failed += 1

    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return ok, failed


async def measure(
    kubeconfig: str, procs: dict[str, int], *, binds: int, concurrencies: list[int]
) -> list[dict[str, Any]]:
    client = await KubeClient.connect(kubeconfig, max_connections=72)
    results = []
    try:
        node_items, _ = await client.list("/api/v1/nodes", page=1000)
        nodes = sorted(n["metadata"]["name"] for n in node_items)
        for c in concurrencies:
            ns = f"ceiling-c{c}"
            await client.create("/api/v1/namespaces", {"metadata": {"name": ns}})
            path = f"/api/v1/namespaces/{ns}/pods"
            await create_all(client, ((path, _pod(f"b-{i:06d}")) for i in range(binds)))
            items, _ = await client.list(path)
            pods = sorted((o["metadata"]["name"], o["metadata"]["uid"]) for o in items)
            await asyncio.sleep(1.0)  # let the creation settle (kwok, watch caches)
            api = procstat.Window(procs["kube-apiserver"], started=time.monotonic())
            own_cpu = time.process_time()
            t0 = time.monotonic()
            ok, failed = await _bind_all(client, ns, pods, nodes, c)
            wall = time.monotonic() - t0
            own = time.process_time() - own_cpu
            usage = api.end(time.monotonic())
            results.append({
                "concurrency": c,
                "binds": ok,
                "failed": failed,
                "seconds": round(wall, 3),
                "binds_per_s": round(ok / wall, 1) if wall > 0 else None,
                "client_cpu_percent": round(100 * own / wall, 1) if wall > 0 else None,
                "apiserver_cpu_percent": None if usage.cpu_percent is None else round(usage.cpu_percent, 1),
                "apiserver_cpu_ms_per_bind": (
                    round(1e3 * usage.cpu_seconds / ok, 3) if ok and usage.cpu_seconds is not None else None
                ),
            })
    finally:
        await client.close()
    return results


def run_ceiling(
    *,
    nodes: int,
    binds: int,
    concurrencies: list[int],
    apiserver_args: list[str],
    sandbox_name: str,
    node: NodeSpec | None = None,
) -> dict[str, Any]:
    """The sweep on a fresh sandbox of ``nodes`` nodes shaped like ``node`` (default: 8
    GPUs); ``best`` is the highest rate of the sweep."""
    from batchsched.kube.errors import KubeError
    from batchsched.sandbox.cluster import Sandbox, SandboxError
    from batchsched.sandbox.nodes import NodeShape

    spec = node or NodeSpec()
    box = Sandbox(sandbox_name)
    t_up = time.monotonic()
    try:
        state = box.up(
            [NodeShape(count=nodes, gpus=spec.gpus, cpu=spec.cpu, memory=spec.memory, max_pods=spec.max_pods)],
            apiserver_args=apiserver_args, ready_timeout=ready_timeout(nodes),
        )
    except (SandboxError, KubeError, OSError, TimeoutError) as exc:
        raise StartError(f"the sandbox for the ceiling did not start: {exc}") from exc
    up_s = time.monotonic() - t_up
    try:
        procs = {p.name: p.pid for p in state.processes}
        sweep = asyncio.run(measure(state.kubeconfig, procs, binds=binds, concurrencies=concurrencies))
    finally:
        box.down()
    rates = [r["binds_per_s"] for r in sweep if r["binds_per_s"]]
    return {
        "nodes": nodes, "binds": binds, "sweep": sweep, "best": max(rates) if rates else None,
        "sandbox_up_s": round(up_s, 2),
    }
