"""The device search on nodes published as NVIDIA's driver publishes them: what it must
find within its bound of device checks, and that pruning never changes what it finds.

The search tries devices depth first in the node's order, as upstream's does; after a few
hundred checks it starts pruning (states that failed, room left by the shared counters,
requests ahead that can no longer be met). The worlds here come from
:mod:`tests.dra_worlds`, the same drawing the sandbox's differential test uses against
kube-scheduler, and selectors go through the real CEL evaluator.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.dra import allocator
from batchsched.core.dra.allocator import Allocated, InUse, Unallocatable, allocate
from batchsched.core.dra.objects import (
    DeviceClass,
    NodeDevices,
    Pools,
    ResourceClaim,
    parse_device_class,
    parse_resource_claim,
    parse_resource_slice,
)
from batchsched.sandbox import gpudra
from tests.dra_worlds import World, draw

CLASSES = {c.name: c for c in (parse_device_class(o) for o in gpudra.device_classes())}
#: enough for any search of these worlds to end on its own
UNBOUNDED = 10**6


def _claims(world: World) -> list[ResourceClaim]:
    return [parse_resource_claim({"metadata": {"name": c.key, "namespace": "ns", "uid": f"uid-{c.key}"},
                                  "spec": c.spec()}) for c in world.claims]


def _nodes(world: World) -> list[NodeDevices]:
    p = Pools(parse_resource_slice(s) for s in world.slices("b"))
    return [p.for_node(n, {}) for n in world.node_names("b")]


def _allocate(claims: Sequence[ResourceClaim], devices: NodeDevices, *, plain_steps: int = allocator.PLAIN_STEPS,
              max_steps: int = allocator.DEFAULT_MAX_STEPS, classes: dict[str, DeviceClass] = CLASSES,
              ) -> Allocated | Unallocatable:
    shares = iter(range(10**6))
    with mock.patch.object(allocator, "PLAIN_STEPS", plain_steps):
        return allocate(claims, devices=devices, classes=classes, in_use=InUse(), max_steps=max_steps,
                        new_share_id=lambda: f"share-{next(shares)}")


def _results(out: Allocated) -> list[list[tuple[str, str]]]:
    return [[(r["request"], r["device"]) for r in c.allocation["devices"]["results"]] for c in out.claims]


def _counters_held(out: Allocated) -> dict[str, Any]:
    return {f"{k.counter_set}/{k.counter}": v for k, v in out.delta.counters.items()}


@pytest.mark.parametrize(("seed", "index"), [(300602, 65), (301, 13)])
def test_seven_partitions_of_one_a100_asked_three_then_two_and_two_are_found_within_the_bound(
        seed: int, index: int) -> None:
    """The world a differential run found (seed 300602, world 65; and one of the same shape
    drawn since): kube-scheduler bound the pod; the search used to give up after its
    50,000 checks, having tried three large partitions first and every way to fit four
    more beside them."""
    rng = random.Random(seed)
    world = [draw(rng, i) for i in range(index + 1)][index]
    nodes = {n.kind: devices for n, devices in zip(world.nodes, _nodes(world), strict=True)}
    assert ("partitionable", 1) in [(n.kind, n.gpus) for n in world.nodes]
    claims = _claims(world)
    partitionable = nodes["partitionable"]

    out = _allocate(claims, partitionable)

    assert isinstance(out, Allocated), out
    devices = [d for claim in _results(out) for _, d in claim]
    assert len(devices) == len(set(devices)) == 7
    assert [len(c) for c in _results(out)] == [3, 4]
    # seven partitions share one GPU's 98 multiprocessors and 8 memory slices: at most 7 fit
    held = _counters_held(out)
    assert held[f"{partitionable.devices[0].consumes[0].counter_set}/multiprocessors"] == 98
    plain = _allocate(claims, partitionable, plain_steps=UNBOUNDED, max_steps=UNBOUNDED)
    assert isinstance(plain, Allocated) and _results(out) == _results(plain)
    if "static" in nodes:  # its four partitions cannot hold seven: a plain miss, not a give-up
        miss = _allocate(claims, nodes["static"])
        assert isinstance(miss, Unallocatable) and "gave up" not in miss.reason and not miss.fatal


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), index=st.integers(0, 30))
def test_pruning_finds_what_the_plain_search_finds(seed: int, index: int) -> None:
    """On drawn worlds, the search pruning from its first check and the plain one (no bound
    on either) allocate the same devices to the same requests, or both fail."""
    rng = random.Random(seed)
    world = [draw(rng, i) for i in range(index + 1)][index]
    claims = _claims(world)
    for devices in _nodes(world):
        plain = _allocate(claims, devices, plain_steps=UNBOUNDED, max_steps=UNBOUNDED)
        pruned = _allocate(claims, devices, plain_steps=0, max_steps=UNBOUNDED)
        assert type(pruned) is type(plain), (world.describe(), plain, pruned)
        if isinstance(plain, Allocated):
            assert isinstance(pruned, Allocated)
            assert _results(pruned) == _results(plain), world.describe()
            assert pruned.delta == plain.delta
        else:
            assert isinstance(pruned, Unallocatable)
            assert pruned.fatal == plain.fatal, (world.describe(), plain, pruned)
