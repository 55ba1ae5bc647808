"""Small DRA worlds for the allocator tests: NVIDIA-shaped nodes (8 GPUs, each with 7
MIG partitions consuming its counters), classes, claims, and a stand-in for the CEL
compiler so these tests do not need the CEL library.

The stand-in reads ``left op right`` clauses joined by ``&&``; ``left`` is ``driver``,
``multi`` (allowMultipleAllocations) or a fully qualified attribute name; ``op`` is
``==``, ``!=`` or ``>=`` (ints); the expression ``boom`` fails like a CEL runtime error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from batchsched.core.dra.allocator import Allocated, InUse, Unallocatable, allocate
from batchsched.core.dra.objects import (
    Device,
    DeviceClass,
    NodeDevices,
    Pools,
    ResourceClaim,
    parse_allocation,
    parse_device_class,
    parse_resource_claim,
    parse_resource_slice,
)

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"


class FakeSelector:
    def __init__(self, expression: str) -> None:
        if expression.strip() == "":
            raise ValueError("empty expression")
        self.expression = expression

    def matches(self, device: Device) -> bool:
        if self.expression == "boom":
            raise ValueError("no such key: model")
        return all(_clause(c.strip(), device) for c in self.expression.split("&&"))


def _clause(clause: str, device: Device) -> bool:
    if clause == "true":
        return True
    for op in ("==", "!=", ">="):
        if op in clause:
            left, right = (p.strip() for p in clause.split(op, 1))
            break
    else:
        raise ValueError(f"cannot read {clause!r}")
    have: Any
    if left == "driver":
        have = device.driver
    elif left == "multi":
        have = str(device.allow_multiple).lower()
    else:
        attr = device.attributes.get(left)
        if attr is None:
            return False
        have = next(iter(attr.values()))
    if op == ">=":
        return isinstance(have, int) and have >= int(right)
    return (str(have).lower() == right.lower()) == (op == "==")


def fake_compile(expression: str) -> FakeSelector:
    return FakeSelector(expression)


def gpu_node_slices(node: str = "n1", gpus: int = 8, migs: int = 7, generation: int = 1) -> list[dict[str, Any]]:
    """The two slices a node publishes: its counter sets, and its devices (each full
    GPU consumes all of its set; each 1g.10gb MIG partition a seventh)."""
    counters = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-counters"},
        "spec": {
            "driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 2},
            "sharedCounters": [
                {"name": f"gpu-{i}", "counters": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "98"}}}
                for i in range(gpus)
            ],
        },
    }
    devices: list[dict[str, Any]] = []
    for i in range(gpus):
        common = {"index": {"int": i}, "pcieRoot": {"string": f"pci-{i // 4}"}, "productName": {"string": "H100"}}
        devices.append({
            "name": f"gpu-{i}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node}-{i}"}, **common},
            "capacity": {"memory": {"value": "80Gi"}},
            "consumesCounters": [{"counterSet": f"gpu-{i}", "counters": {
                "memory": {"value": "80Gi"}, "multiprocessors": {"value": "98"}}}],
        })
        for j in range(migs):
            devices.append({
                "name": f"gpu-{i}-mig-{j}",
                "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}, **common},
                "capacity": {"memory": {"value": "10Gi"}},
                "consumesCounters": [{"counterSet": f"gpu-{i}", "counters": {
                    "memory": {"value": "10Gi"}, "multiprocessors": {"value": "14"}}}],
            })
    device_slice = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpus"},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 2},
                 "devices": devices},
    }
    return [counters, device_slice]


def classes(*extra: dict[str, Any]) -> dict[str, DeviceClass]:
    objs = [
        {"metadata": {"name": GPU_CLASS}, "spec": {
            "selectors": [{"cel": {"expression": f"driver == {DRIVER} && {DRIVER}/type == gpu"}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {"sharing": "none"}}}]}},
        {"metadata": {"name": MIG_CLASS}, "spec": {
            "selectors": [{"cel": {"expression": f"driver == {DRIVER} && {DRIVER}/type == mig"}}]}},
        *extra,
    ]
    return {c.name: c for c in (parse_device_class(o) for o in objs)}


def claim(name: str, *requests: dict[str, Any], namespace: str = "ns", constraints: list[dict[str, Any]] | None = None,
          config: list[dict[str, Any]] | None = None, status: dict[str, Any] | None = None) -> ResourceClaim:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
                           "spec": {"devices": {"requests": list(requests)}}}
    if constraints:
        obj["spec"]["devices"]["constraints"] = constraints
    if config:
        obj["spec"]["devices"]["config"] = config
    if status:
        obj["status"] = status
    return parse_resource_claim(obj)


def exactly(name: str, device_class: str = GPU_CLASS, count: int | None = None, *, mode: str | None = None,
            selectors: list[str] = (), **extra: Any) -> dict[str, Any]:  # type: ignore[assignment]
    e: dict[str, Any] = {"deviceClassName": device_class, **extra}
    if count is not None:
        e["count"] = count
    if mode is not None:
        e["allocationMode"] = mode
    if selectors:
        e["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": e}


def sub(name: str, device_class: str = GPU_CLASS, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": name, "deviceClassName": device_class, "count": count, **extra}


def pools(*slice_objs: Mapping[str, Any]) -> Pools:
    return Pools(parse_resource_slice(o) for o in slice_objs)


def node_devices(p: Pools, node: str = "n1", labels: Mapping[str, str] | None = None) -> NodeDevices:
    return p.for_node(node, labels or {})


def run(claims: list[ResourceClaim], devices: NodeDevices, in_use: InUse | None = None,
        device_classes: Mapping[str, DeviceClass] | None = None, **kw: Any) -> Allocated | Unallocatable:
    counter = iter(range(1, 1_000_000))
    kw.setdefault("compile_selector", fake_compile)
    return allocate(
        claims, devices=devices, classes=device_classes if device_classes is not None else classes(),
        in_use=in_use or InUse(), device_env=lambda d: d, new_share_id=lambda: f"share-{next(counter)}", **kw,
    )


def ok(outcome: Allocated | Unallocatable) -> Allocated:
    assert isinstance(outcome, Allocated), outcome
    return outcome


def failed(outcome: Allocated | Unallocatable) -> Unallocatable:
    assert isinstance(outcome, Unallocatable), outcome
    return outcome


def devices_of(outcome: Allocated, claim_index: int = 0) -> list[str]:
    return [r["device"] for r in outcome.claims[claim_index].allocation["devices"]["results"]]


def written(claim_obj: ResourceClaim, outcome: Allocated, claim_index: int = 0) -> ResourceClaim:
    """The claim as it reads once the allocation is written to its status."""
    alloc = parse_allocation(dict(outcome.claims[claim_index].allocation))
    return dataclasses.replace(claim_obj, allocation=alloc)
