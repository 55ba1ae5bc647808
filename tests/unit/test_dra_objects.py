"""Parsing resource.k8s.io/v1 objects, and which devices a node may use."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from batchsched.core.dra.objects import (
    DraError,
    Pools,
    ResourceSlice,
    parse_device_class,
    parse_resource_claim,
    parse_resource_slice,
)
from tests.unit.dra_world import DRIVER, gpu_node_slices, pools


def _slice(name: str = "s", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"driver": "nic.example.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}
    base.update(spec)
    return {"metadata": {"name": name}, "spec": base}


def test_a_device_keeps_its_attributes_qualified_by_its_driver() -> None:
    s = parse_resource_slice(gpu_node_slices(gpus=1, migs=1)[1])
    gpu = s.devices[0]
    assert gpu.attributes[f"{DRIVER}/type"] == {"string": "gpu"}
    assert gpu.attributes[f"{DRIVER}/index"] == {"int": 0}
    assert gpu.capacity["memory"].value.value == Decimal(80 * 2**30)
    assert gpu.consumes[0].counter_set == "gpu-0"
    assert gpu.consumes[0].counters["multiprocessors"] == 98
    assert s.node_name == "n1" and s.pool == "n1" and s.slice_count == 2


def test_an_attribute_of_another_domain_stays_as_written() -> None:
    s = parse_resource_slice(_slice(nodeName="n1", devices=[
        {"name": "eth0", "attributes": {"resource.kubernetes.io/pcieRoot": {"string": "pci-0"}}}]))
    assert s.devices[0].attributes == {"resource.kubernetes.io/pcieRoot": {"string": "pci-0"}}


@pytest.mark.parametrize(("patch", "message"), [
    ({"driver": None}, "ResourceSlice s: spec.driver is missing"),
    ({"pool": {"name": "p", "generation": 1, "resourceSliceCount": 0}}, "resourceSliceCount must be at least 1"),
    ({"nodeName": "n1", "allNodes": True}, "more than one of nodeName"),
    ({"nodeName": "n1", "devices": [{"name": "d", "attributes": {"x": {"ints": [1, 2]}}}]},
     "device d: attribute x: list values (ints) are not supported"),
    ({"nodeName": "n1", "devices": [{"name": "d", "attributes": {"x": {"int": "3"}}}]},
     "attribute x: int value '3' has the wrong type"),
    ({"nodeName": "n1", "devices": [{"name": "d", "capacity": {"mem": {"value": "lots"}}}]},
     "device d: capacity mem: bad quantity 'lots'"),
    ({"nodeName": "n1", "devices": [{"name": "d", "consumesCounters": [
        {"counterSet": "c", "counters": {}, "compatibilityGroups": ["a"]}]}]},
     "consumesCounters.compatibilityGroups is not supported"),
    ({"nodeName": "n1", "nodeAllocatableResources": [{"name": "cpu"}]}, "nodeAllocatableResources is not supported"),
    ({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": []}, {"matchExpressions": []}]}},
     "nodeSelector must have exactly one term"),
])
def test_a_malformed_slice_is_refused_with_the_field_named(patch: dict[str, Any], message: str) -> None:
    obj = _slice(**patch)
    with pytest.raises(DraError) as err:
        parse_resource_slice(obj)
    assert message in str(err.value)


def test_a_claim_reads_exactly_and_first_available() -> None:
    c = parse_resource_claim({
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                {"name": "acc", "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
                    {"name": "small", "deviceClassName": "mig.nvidia.com", "allocationMode": "All",
                     "tolerations": [{"key": "k", "operator": "Exists"}],
                     "capacity": {"requests": {"memory": "10Gi"}}},
                ]},
            ],
            "constraints": [{"requests": ["gpu", "acc/big"], "matchAttribute": "gpu.nvidia.com/pcieRoot"}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {}}}],
        }},
    })
    gpu, acc = c.requests
    assert (gpu.choices[0].name, gpu.choices[0].count, gpu.choices[0].all_devices) == ("gpu", 1, False)
    assert [ch.name for ch in acc.choices] == ["acc/big", "acc/small"]
    assert acc.choices[1].all_devices and acc.choices[1].tolerations[0].operator == "Exists"
    assert acc.choices[1].capacity is not None and acc.choices[1].capacity["memory"].text == "10Gi"
    assert c.constraints[0].applies("acc", "acc/big") and not c.constraints[0].applies("acc", "acc/small")
    assert c.config[0].requests == ("gpu",)


def _claim_with(request: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {"requests": [request], **devices}}}


@pytest.mark.parametrize(("obj", "message"), [
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "allocationMode": "Some"}}),
     "ResourceClaim ns/c: request gpu: allocationMode 'Some' is not ExactCount or All"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "count": 0}}), "count 0 is not between 1 and 32"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "derivedAttributes": [{"name": "a/b"}]}}),
     "request gpu: derivedAttributes is not supported"),
    (_claim_with({"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "x", "adminAccess": True}]}),
     "request gpu/a: adminAccess is not allowed in a subrequest"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x", "selectors": [{"other": {}}]}}),
     "selector #0 has no cel expression"),
    (_claim_with({"name": "gpu"}), "exactly one of exactly and firstAvailable"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x"}},
                 constraints=[{"requests": ["nic"], "matchAttribute": "a/b"}]),
     "names request 'nic', which the claim does not have"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x"}}, constraints=[{"matchAttribute": "numa"}]),
     "attribute 'numa' must be fully qualified"),
    (_claim_with({"name": "gpu", "exactly": {"deviceClassName": "x"}}, constraints=[{"matchExpression": "x"}]),
     "exactly one of matchAttribute and distinctAttribute"),
])
def test_a_malformed_claim_is_refused_with_the_field_named(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(DraError) as err:
        parse_resource_claim(obj)
    assert message in str(err.value)


def test_a_device_class_reads_selectors_config_and_extended_resource() -> None:
    c = parse_device_class({"metadata": {"name": "gpu"}, "spec": {
        "selectors": [{"cel": {"expression": "a"}}, {"cel": {"expression": "b"}}],
        "config": [{"opaque": {"driver": DRIVER, "parameters": {"x": 1}}}],
        "extendedResourceName": "nvidia.com/gpu"}})
    assert c.selectors == ("a", "b")
    assert c.config == ({"opaque": {"driver": DRIVER, "parameters": {"x": 1}}},)
    assert c.extended_resource_name == "nvidia.com/gpu"
    with pytest.raises(DraError, match="DeviceClass gpu: config #0: only opaque configuration"):
        parse_device_class({"metadata": {"name": "gpu"}, "spec": {"config": [{"other": {}}]}})


def test_an_allocated_claim_reads_its_results() -> None:
    c = parse_resource_claim({
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
        "status": {"allocation": {
            "devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"},
                {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "nic", "shareID": "s1",
                 "consumedCapacity": {"bw": "10G"}, "adminAccess": False}]},
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]},
    })
    assert c.allocation is not None
    first, second = c.allocation.results
    assert str(first.id) == f"{DRIVER}/n1/gpu-0" and first.share_id is None
    assert second.share_id == "s1" and second.consumed["bw"].value == Decimal(10**10)
    assert c.allocation.node_selector is not None
    assert c.allocation.node_selector.matches("n1", {}) and not c.allocation.node_selector.matches("n2", {})
    assert c.reserved_for[0]["name"] == "p"


# ---------------------------------------------------------------- pools


def test_a_node_uses_its_own_slices_and_not_another_nodes() -> None:
    p = pools(*gpu_node_slices("n1", gpus=2, migs=1), *gpu_node_slices("n2", gpus=1, migs=0))
    names = [d.name for d in p.for_node("n1", {}).devices]
    assert names == ["gpu-0", "gpu-0-mig-0", "gpu-1", "gpu-1-mig-0"]
    assert [d.name for d in p.for_node("n2", {}).devices] == ["gpu-0"]
    assert p.for_node("n1", {}).counter_sets[(DRIVER, "n1")]["gpu-1"]["memory"] == 80 * 2**30


def test_a_nodes_devices_are_found_without_reading_every_other_nodes_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster publishes a pool per node: finding one node's devices reads that node's
    slices and those a selector may offer it, not the slices of all 300 nodes (which made
    every node's devices cost as much as the whole cluster's)."""
    everywhere = _slice("all", pool={"name": "fabric", "generation": 1, "resourceSliceCount": 1},
                        allNodes=True, devices=[{"name": "fabric"}])
    p = pools(*(s for i in range(300) for s in gpu_node_slices(f"n{i}", gpus=1, migs=0)), everywhere)
    read: list[str] = []
    serves = ResourceSlice.serves

    def counted(self: ResourceSlice, node: str, labels: Any) -> bool:
        read.append(self.name)
        return serves(self, node, labels)

    monkeypatch.setattr(ResourceSlice, "serves", counted)
    assert [d.name for d in p.for_node("n7", {}).devices] == ["gpu-0", "fabric"]
    assert len(read) <= 3  # n7's slice of devices, and the one for every node


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = gpu_node_slices("n1", gpus=2, migs=0, generation=1)
    new = gpu_node_slices("n1", gpus=1, migs=0, generation=2)
    for s in new:
        s["metadata"]["name"] += "-v2"
    p = pools(*old, *new)
    assert [d.name for d in p.for_node("n1", {}).devices] == ["gpu-0"]


def test_an_incomplete_pool_offers_no_device_and_says_why() -> None:
    _counters, devices = gpu_node_slices("n1", gpus=1, migs=0)
    nd = pools(devices).for_node("n1", {})  # the counters slice has not arrived
    assert nd.devices == ()
    assert [pool.problem for pool in nd.unusable] == [f"pool {DRIVER}/n1 is incomplete (1 of 2 slices of generation 1)"]


def test_a_pool_whose_device_consumes_an_undeclared_counter_is_invalid() -> None:
    counters, devices = gpu_node_slices("n1", gpus=2, migs=0)
    counters = copy.deepcopy(counters)
    del counters["spec"]["sharedCounters"][1]
    nd = pools(counters, devices).for_node("n1", {})
    assert nd.devices == ()
    assert "device gpu-1 consumes counter set gpu-1, which the pool does not declare" in nd.unusable[0].problem


def test_selector_all_nodes_and_per_device_slices_reach_the_nodes_they_name() -> None:
    by_label = _slice("rack", nodeSelector={"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]}, devices=[{"name": "switch"}])
    everywhere = _slice("all", pool={"name": "q", "generation": 1, "resourceSliceCount": 1},
                        allNodes=True, devices=[{"name": "fabric"}])
    per_device = _slice("per", pool={"name": "r", "generation": 1, "resourceSliceCount": 1},
                        perDeviceNodeSelection=True, devices=[
                            {"name": "a", "nodeName": "n1"}, {"name": "b", "nodeName": "n2"}, {"name": "c", "allNodes": True}])
    p = Pools(parse_resource_slice(o) for o in (by_label, everywhere, per_device))
    assert [d.name for d in p.for_node("n1", {"rack": "r1"}).devices] == ["switch", "fabric", "a", "c"]
    assert [d.name for d in p.for_node("n2", {"rack": "r2"}).devices] == ["fabric", "b", "c"]
