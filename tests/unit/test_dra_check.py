"""The differential test's checker (tests/dra_check.py) finds what is wrong in a claim's
allocation: it must not pass an allocation that breaks the rules, or agreement between
the two schedulers would prove nothing."""

from __future__ import annotations

import copy
from typing import Any

from tests.dra_check import problems
from tests.dra_worlds import Claim, Constraint, Node, Request, Shape, World, _memory

D = "gpu.nvidia.com"


def _world(count: int = 2, constraints: list[Constraint] | None = None) -> World:
    shape = Shape("gpu.nvidia.com", count, [_memory(20)])
    return World(0, [Node("whole", "NVIDIA A100-SXM4-40GB", 2)], [Claim("c0", False, [Request("r0", [shape])],
                                                                       constraints or [])])


def _bound(world: World, devices: list[str], node: str = "w000k-0") -> tuple[dict[str, Any], dict[str, Any]]:
    pod = {"metadata": {"uid": "u1"}, "spec": {"nodeName": node}}
    claim = {"status": {
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
        "allocation": {
            "devices": {"results": [{"request": "r0", "driver": D, "pool": node, "device": d} for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }}}
    return pod, {"c0": claim}


def test_a_right_allocation_has_no_problem() -> None:
    w = _world()
    assert problems(w, "k", w.slices("k"), *_bound(w, ["gpu-0", "gpu-1"])) == []


def test_a_wrong_count_a_device_twice_and_a_device_of_another_node_are_found() -> None:
    w = _world()
    assert problems(w, "k", w.slices("k"), *_bound(w, ["gpu-0"])) == ["c0: request r0: 1 devices, count is 2"]
    twice = problems(w, "k", w.slices("k"), *_bound(w, ["gpu-0", "gpu-0"]))
    assert "w000k-0/gpu-0 allocated whole 2 times" in twice
    pod, claims = _bound(w, ["gpu-0", "gpu-1"])
    claims["c0"]["status"]["allocation"]["devices"]["results"][1]["pool"] = "elsewhere"
    assert "c0: elsewhere/gpu-1 is not a device of w000k-0" in problems(w, "k", w.slices("k"), pod, claims)


def test_a_selector_and_a_constraint_not_held_are_found() -> None:
    w = _world(1)
    w.claims[0].requests[0].shapes[0].selectors = [_memory(64)]  # an A100 has 40 GiB
    assert problems(w, "k", w.slices("k"), *_bound(w, ["gpu-0"])) == ["c0: gpu-0 does not match request r0"]
    w = _world(2, [Constraint([], "resource.kubernetes.io/pciBusID", distinct=False)])
    assert problems(w, "k", w.slices("k"), *_bound(w, ["gpu-0", "gpu-1"])) == [
        "c0: matchAttribute resource.kubernetes.io/pciBusID: ['0000:07:00.0', '0000:0f:00.0']"]


def test_an_allocation_of_a_pod_not_bound_is_found() -> None:
    w = _world()
    pod, claims = _bound(w, ["gpu-0", "gpu-1"])
    unbound = copy.deepcopy(pod)
    unbound["spec"]["nodeName"] = None
    assert problems(w, "k", w.slices("k"), unbound, claims) == ["c0: allocated, pod not bound"]
