"""Fake GPU nodes for the sandbox: shapes as data, and the Node objects kwok will manage.

A :class:`NodeShape` says how many nodes of one kind to make and what each one has. Nodes
get topology labels (block, rack, hostname) so topology-aware placement can be exercised:
``nodes_per_rack`` nodes share a rack, ``racks_per_block`` racks share a block.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SANDBOX_LABEL = "batchsched.io/sandbox-node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_MODEL_LABEL = "nvidia.com/gpu.product"
BLOCK_LABEL = "batchsched.io/block"
RACK_LABEL = "batchsched.io/rack"


@dataclass(slots=True, frozen=True)
class NodeShape:
    """``count`` identical nodes named ``{prefix}-{i}``."""

    count: int
    prefix: str = "gpu-node"
    cpu: str = "96"
    memory: str = "1024Gi"
    gpus: int = 8
    gpu_model: str = "A100"
    max_pods: int = 110
    nodes_per_rack: int = 8
    racks_per_block: int = 4
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    extended: dict[str, str] = field(default_factory=dict)
    start: int = 0

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"node count must be at least 1, got {self.count}")
        if self.gpus < 0:
            raise ValueError(f"GPUs per node must not be negative, got {self.gpus}")
        if self.max_pods < 1:
            raise ValueError(f"max pods per node must be at least 1, got {self.max_pods}")
        if self.nodes_per_rack < 1 or self.racks_per_block < 1:
            raise ValueError("nodes per rack and racks per block must be at least 1")

    def names(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.start, self.start + self.count)]

    def manifest(self, index: int) -> dict[str, Any]:
        name = f"{self.prefix}-{index}"
        rack = index // self.nodes_per_rack
        block = rack // self.racks_per_block
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            SANDBOX_LABEL: self.prefix,
            RACK_LABEL: f"{self.prefix}-rack-{rack}",
            BLOCK_LABEL: f"{self.prefix}-block-{block}",
        }
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.max_pods)}
        if self.gpus:
            labels[GPU_MODEL_LABEL] = self.gpu_model
            resources[GPU_RESOURCE] = str(self.gpus)
        resources.update(self.extended)
        labels.update(self.labels)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": [dict(t) for t in self.taints]} if self.taints else {},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "fake",
                    "kubeProxyVersion": "fake",
                },
                "phase": "Running",
            },
        }


async def create_nodes(client: KubeClient, shapes: Iterable[NodeShape], *, concurrency: int = 32) -> list[str]:
    """Create every node of ``shapes`` (an existing node of the same name is replaced)."""
    sem = asyncio.Semaphore(concurrency)
    names: list[str] = []

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            try:
                await client.create("/api/v1/nodes", body)
            except ConflictError:
                await client.delete(f"/api/v1/nodes/{body['metadata']['name']}")
                await client.create("/api/v1/nodes", body)

    tasks = []
    for shape in shapes:
        for i in range(shape.start, shape.start + shape.count):
            body = shape.manifest(i)
            names.append(body["metadata"]["name"])
            tasks.append(one(body))
    await asyncio.gather(*tasks)
    return names


def node_is_ready(node: dict[str, Any]) -> bool:
    """Ready condition True and the not-ready taint that admission adds already lifted."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    tainted = any(
        t.get("key") in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        for t in taints
    )
    return ready and not tainted


async def wait_nodes_ready(client: KubeClient, names: Iterable[str], *, timeout: float = 120.0) -> None:
    """Return once every named node is Ready and untainted; TimeoutError otherwise.

    One list, then a watch: polling a list of every node twice a second was a real share
    of the apiserver's CPU at thousands of nodes, taken from kwok's Lease renewals.
    """
    wanted = set(names)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    ready: set[str] = set()
    rv = ""
    while True:
        try:
            if not rv:
                items, rv = await client.list("/api/v1/nodes", page=1000)
                ready = {n["metadata"]["name"] for n in items if node_is_ready(n)} & wanted
            if ready >= wanted:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            async with asyncio.timeout(remaining):
                async for etype, obj in client.watch(
                    "/api/v1/nodes", rv, timeout_seconds=int(min(remaining, 300)) + 1
                ):
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    name = (obj.get("metadata") or {}).get("name")
                    if etype == "BOOKMARK" or name not in wanted:
                        continue
                    if etype != "DELETED" and node_is_ready(obj):
                        ready.add(name)
                        if ready >= wanted:
                            return
                    else:
                        ready.discard(name)
        except TimeoutError:
            break
        except KubeError:
            rv = ""  # expired or dropped: list again
            await asyncio.sleep(0.2)
    not_ready = wanted - ready
    sample = ", ".join(sorted(not_ready)[:5])
    raise TimeoutError(f"{len(not_ready)} nodes not Ready after {timeout:.0f} s ({sample} ...)")


async def delete_nodes(client: KubeClient, names: Iterable[str], *, concurrency: int = 32) -> None:
    from batchsched.kube.errors import NotFoundError

    sem = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with sem:
            with contextlib.suppress(NotFoundError):
                await client.delete(f"/api/v1/nodes/{name}")

    await asyncio.gather(*(one(n) for n in names))
