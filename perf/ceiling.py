"""The ceiling: how many Bindings per second this machine's apiserver takes.

On a fresh sandbox with the workload's nodes, for each concurrency in the sweep: create
``binds`` pending pods that no scheduler claims (``schedulerName: perf-nobody``), then
POST a Binding for each (with the pod's UID, as a scheduler does) from ``concurrency``
workers over raw aiohttp, doing nothing else. The pods are spread round-robin over the
nodes. Every scheduler's pods/s can then be read as a fraction of the best rate here.

On a DRA workload's nodes (``dra: true``, :mod:`perf.dra`) the slices are published as
for the schedulers, each pod asks one GPU through a claim made from a template, and each
worker writes per pod what a scheduler must: a merge patch of the claim's status (one GPU
of the node allocated, the claim reserved for the pod, under the claim's UID and
resourceVersion), then, once it landed, the Binding. The rate is pods per second, two
writes each. For a workload of extended-resource pods (``extended`` classes: the pods ask
``nvidia.com/gpu``, the GPU DeviceClass names it), each worker makes the pod's claim
(owned by the pod, marked as its extended-resource claim), writes its status, names it in
the pod's ``status.extendedResourceClaimStatus``, then binds: four writes per pod, one
after another, as a scheduler must.

In a live suite (:mod:`perf.suite`) the ceiling is one more member of every round (A, B,
ceiling, A, B, ceiling, ...) on a control plane of the same size and node shape as the
schedulers', so each run is divided by the ceiling measured under the same conditions
of the machine, not by one measured minutes later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import Any

import aiohttp
import orjson

from batchsched.kube.client import KubeClient
from batchsched.sandbox import gpudra
from perf import dra, procstat
from perf.live import StartError, create_all, ready_timeout
from perf.neighbour import Neighbour
from perf.workload import GPU_CLASS, NodeSpec, PodSpec

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


def _scheduled_event(namespace: str, name: str, uid: str, node: str) -> dict[str, Any]:
    """The Event a scheduler writes once a pod is bound (the shape batchsched's status
    writer gives it)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name}.{uid[:16]}", "namespace": namespace},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": name, "namespace": namespace, "uid": uid},
        "reason": "Scheduled", "message": f"Successfully assigned {namespace}/{name} to {node}", "type": "Normal",
        "source": {"component": NOBODY}, "reportingComponent": NOBODY, "reportingInstance": NOBODY,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


async def _send(session: aiohttp.ClientSession, method: str, url: str, body: dict[str, Any],
                merge: bool = False) -> dict[str, Any] | None:
    """One write; its answer, or None when the apiserver refused it."""
    headers = {"Content-Type": "application/merge-patch+json"} if merge else None
    async with session.request(method, url, data=orjson.dumps(body), headers=headers) as resp:
        raw = await resp.read()
        if resp.status >= 300:
            return None
        answer = orjson.loads(raw) if raw else {}
        return answer if isinstance(answer, dict) else {}


async def _bind_all(
    client: KubeClient, namespace: str, pods: list[tuple[str, str]], nodes: list[str], concurrency: int,
    claims: dict[str, dict[str, Any]] | None = None, gpus: int = 8, extended: bool = False,
    events: bool = False,
) -> tuple[int, int]:
    """POST every binding; with ``claims`` (pod UID -> its ResourceClaim), PATCH the claim's
    status first (one of the node's GPUs allocated, reserved for the pod), and bind only
    once that landed; with ``extended``, first make the pod's extended-resource claim, write
    its status, then name it in the pod's status, then bind (four writes, in that order);
    with ``events``, each Binding accepted is followed by the pod's Scheduled Event, as a
    scheduler tells it. Returns (accepted, failed)."""
    creds = client.creds
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if creds.token:
        headers["Authorization"] = creds.token
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=creds.ssl_context())
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(pods)):
        queue.put_nowait(i)
    ok = failed = 0
    claims_url = f"{creds.host}{dra.RESOURCE}/namespaces/{namespace}/resourceclaims"
    pods_url = f"{creds.host}/api/v1/namespaces/{namespace}/pods"
    events_url = f"{creds.host}/api/v1/namespaces/{namespace}/events"

    async def one(session: aiohttp.ClientSession, i: int) -> bool:
        name, uid = pods[i]
        node = nodes[i % len(nodes)]
        device = f"gpu-{(i // len(nodes)) % gpus}"
        claim = claims[uid] if claims is not None else None
        if extended:
            claim = await _send(session, "POST", claims_url, dra.extended_claim(name, uid, 1))
            if claim is None:
                return False
        if claim is not None:
            request = dra.EXTENDED_REQUEST if extended else dra.CLAIM
            patch = dra.reserve_patch(claim, name, uid, node, device, request=request)
            url = f"{claims_url}/{claim['metadata']['name']}/status"
            if await _send(session, "PATCH", url, patch, merge=True) is None:
                return False
        if extended and claim is not None:
            patch = dra.extended_status_patch(uid, claim["metadata"]["name"])
            if await _send(session, "PATCH", f"{pods_url}/{name}/status", patch, merge=True) is None:
                return False
        body = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if await _send(session, "POST", f"{pods_url}/{name}/binding", body) is None:
            return False
        if events:
            await _send(session, "POST", events_url, _scheduled_event(namespace, name, uid, node))
        return True

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok, failed
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if await one(session, i):
                ok += 1
            else:
                failed += 1

    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return ok, failed


async def _claim_pods(client: KubeClient, ns: str, binds: int, gpus: int) -> dict[str, dict[str, Any]]:
    """``binds`` pods no scheduler claims, each with one GPU asked by a claim made from a
    template; once kube-controller-manager has made every claim, pod UID -> its claim."""
    template = gpudra.claim_template(dra.template_name("ceiling"), GPU_CLASS, 1, request=dra.CLAIM)
    await client.create(f"{dra.RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template)
    spec = PodSpec(name="", klass="ceiling", gpus=1, cpu="100m", memory="128Mi", priority_class="", stream=False,
                   device_class=GPU_CLASS)
    path = f"/api/v1/namespaces/{ns}/pods"
    await create_all(client, ((path, dra.pod(replace(spec, name=f"b-{i:06d}"), NOBODY, {})) for i in range(binds)))
    await dra.wait_claims(client, ns, binds)
    claims, _ = await client.list(f"{dra.RESOURCE}/namespaces/{ns}/resourceclaims", page=1000)
    return dra.claims_by_pod(claims)


def _writes(dra_nodes: bool, extended: bool) -> str:
    if extended:
        return "claim create + claim status + pod status + Binding"
    return "claim status + Binding" if dra_nodes else "Binding"


async def measure(
    kubeconfig: str, procs: dict[str, int], *, binds: int, concurrencies: list[int], node: NodeSpec | None = None,
    extended: bool = False, neighbour_cpu: float | None = None, events: bool = False,
) -> list[dict[str, Any]]:
    """The sweep; on DRA nodes (``node.dra``), the slices published first and each pod's
    claim status written before its Binding; with ``extended`` (DRA nodes), the pods ask
    ``nvidia.com/gpu`` and each pod's claim is made by the sweep (:func:`_bind_all`).
    With ``neighbour_cpu``, each concurrency is measured again beside a
    :class:`~perf.neighbour.Neighbour` of that CPU (its rows carry ``neighbour_cpu``): the
    most a scheduler of that size could bind here; with ``events`` too, each of those
    Bindings is followed by the pod's Scheduled Event, written by the same worker."""
    spec = node or NodeSpec()
    extended = extended and spec.dra
    client = await KubeClient.connect(kubeconfig, max_connections=72)
    results = []
    try:
        node_items, _ = await client.list("/api/v1/nodes", page=1000)
        nodes = sorted(n["metadata"]["name"] for n in node_items)
        if spec.dra:
            await dra.publish(client, spec, extended=extended)
        loads: list[float | None] = [None] if not neighbour_cpu else [None, neighbour_cpu]
        for c, load in ((c, load) for c in concurrencies for load in loads):
            ns = f"ceiling-c{c}" + (f"-n{round(100 * load)}" if load else "")
            await client.create("/api/v1/namespaces", {"metadata": {"name": ns}})
            path = f"/api/v1/namespaces/{ns}/pods"
            claims = None
            if spec.dra and not extended:
                claims = await _claim_pods(client, ns, binds, spec.gpus)
            else:
                await create_all(client, ((path, _pod(f"b-{i:06d}")) for i in range(binds)))
            items, _ = await client.list(path, page=1000)
            pods = sorted((o["metadata"]["name"], o["metadata"]["uid"]) for o in items)
            await asyncio.sleep(1.0)  # let the creation settle (kwok, watch caches)
            with contextlib.ExitStack() as beside:
                if load:
                    beside.enter_context(Neighbour(kubeconfig, load))
                api = procstat.Window(procs["kube-apiserver"], started=time.monotonic())
                own_cpu = time.process_time()
                t0 = time.monotonic()
                ok, failed = await _bind_all(client, ns, pods, nodes, c, claims, spec.gpus, extended,
                                             events=events and bool(load))
                wall = time.monotonic() - t0
                own = time.process_time() - own_cpu
                usage = api.end(time.monotonic())
            results.append({
                "concurrency": c,
                "neighbour_cpu": load,
                "writes": _writes(spec.dra, extended) + (", then the Scheduled Event" if events and load else ""),
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
    extended: bool = False,
    neighbour_cpu: float | None = None,
    events: bool = False,
) -> dict[str, Any]:
    """The sweep on a fresh sandbox of ``nodes`` nodes shaped like ``node`` (default: 8
    GPUs; ``extended``: see :func:`measure`); ``best`` is the highest rate of the sweep
    alone, ``best_beside`` the highest beside a neighbour of ``neighbour_cpu`` cores."""
    from batchsched.kube.errors import KubeError
    from batchsched.sandbox.cluster import Sandbox, SandboxError
    from batchsched.sandbox.nodes import NodeShape

    spec = node or NodeSpec()
    box = Sandbox(sandbox_name)
    t_up = time.monotonic()
    try:
        state = box.up(
            [NodeShape(count=nodes, gpus=0 if spec.dra else spec.gpus, cpu=spec.cpu, memory=spec.memory,
                       max_pods=spec.max_pods)],
            apiserver_args=apiserver_args, ready_timeout=ready_timeout(nodes),
        )
    except (SandboxError, KubeError, OSError, TimeoutError) as exc:
        raise StartError(f"the sandbox for the ceiling did not start: {exc}") from exc
    up_s = time.monotonic() - t_up
    try:
        procs = {p.name: p.pid for p in state.processes}
        sweep = asyncio.run(measure(state.kubeconfig, procs, binds=binds, concurrencies=concurrencies, node=spec,
                                    extended=extended, neighbour_cpu=neighbour_cpu, events=events))
    finally:
        box.down()
    rates = [r["binds_per_s"] for r in sweep if r["binds_per_s"] and not r["neighbour_cpu"]]
    beside = [r["binds_per_s"] for r in sweep if r["binds_per_s"] and r["neighbour_cpu"]]
    return {
        "nodes": nodes, "binds": binds, "sweep": [r for r in sweep if not r["neighbour_cpu"]],
        "best": max(rates) if rates else None,
        "neighbour_cpu": neighbour_cpu,
        "sweep_beside": [r for r in sweep if r["neighbour_cpu"]],
        "best_beside": max(beside) if beside else None,
        "sandbox_up_s": round(up_s, 2),
    }
