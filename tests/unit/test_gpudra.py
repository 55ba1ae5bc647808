"""The NVIDIA DRA fixtures: what a test, the demo or the perf suite relies on when it
publishes them (the apiserver's own verdict is in tests/integration/test_dra_sandbox.py)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import pytest

from batchsched.core.quantity import parse_quantity
from batchsched.sandbox import gpudra

FORMS = [(model, mig) for model in gpudra.MODELS for mig in gpudra.MIG_MODES]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Decimal]]:
    return {cs["name"]: {k: parse_quantity(v["value"]) for k, v in cs["counters"].items()}
            for s in slices for cs in s["spec"].get("sharedCounters", [])}


def consumption(chosen: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Decimal]:
    """What the devices ``chosen`` consume together, per (counter set, counter)."""
    total: dict[tuple[str, str], Decimal] = {}
    for device in chosen:
        for use in device.get("consumesCounters", []):
            for name, counter in use["counters"].items():
                key = (use["counterSet"], name)
                total[key] = total.get(key, Decimal(0)) + parse_quantity(counter["value"])
    return total


def fits(slices: list[dict[str, Any]], names: Iterable[str]) -> bool:
    by_name = {d["name"]: d for d in devices(slices)}
    sets = counter_sets(slices)
    return all(used <= sets[cs][c] for (cs, c), used in consumption(by_name[n] for n in names).items())


@pytest.mark.parametrize(("model", "mig"), FORMS)
def test_one_pool_of_valid_slices(model: str, mig: str) -> None:
    """One pool per node, complete, with device names unique and DNS labels, within the
    API's limits per slice and per device."""
    slices = gpudra.gpu_node_slices("node-a", product=model, mig=mig, generation=3)
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
             for s in slices}
    assert pools == {("node-a", 3, len(slices))}
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    names = [d["name"] for d in devices(slices)]
    assert len(set(names)) == len(names)
    assert all(DNS_LABEL.match(n) for n in names), [n for n in names if not DNS_LABEL.match(n)]
    for s in slices:
        assert not (s["spec"].get("devices") and s["spec"].get("sharedCounters")), "1.35+ refuses both in one slice"
        with_counters = any("consumesCounters" in d for d in s["spec"].get("devices", []))
        assert len(s["spec"].get("devices", [])) <= (gpudra.MAX_DEVICES_WITH_COUNTERS if with_counters else 128)
        assert len(s["spec"].get("sharedCounters", [])) <= gpudra.MAX_COUNTER_SETS
        assert all(len(cs["counters"]) <= 32 for cs in s["spec"].get("sharedCounters", []))
    assert all(len(d["attributes"]) + len(d["capacity"]) <= 32 for d in devices(slices))


@pytest.mark.parametrize(("model", "mig"), FORMS)
def test_every_device_is_selected_by_one_class(model: str, mig: str) -> None:
    """The chart's classes select by ``type``: every published device has one of theirs."""
    kinds = {re.search(r"\.type == '(\w+)'", c["spec"]["selectors"][0]["cel"]["expression"]).group(1)  # type: ignore[union-attr]
             for c in gpudra.device_classes()}
    published = Counter(d["attributes"]["type"]["string"] for d in devices(
        gpudra.gpu_node_slices("n", product=model, mig=mig)))
    assert set(published) <= kinds
    assert ("gpu" in published) == (mig != "static")
    assert ("mig" in published) == (mig != "none")


@pytest.mark.parametrize("model", list(gpudra.MODELS))
def test_partitions_consume_only_counters_of_their_gpu(model: str) -> None:
    """Every consumption names its own GPU's counter set and only counters in it, and the
    whole GPU alone takes all of them."""
    slices = gpudra.gpu_node_slices("n", gpus=8, product=model, mig="partitionable")
    sets = counter_sets(slices)
    for device in devices(slices):
        [use] = device["consumesCounters"]
        gpu = device["name"].split("-mig-")[0]
        assert use["counterSet"] == f"{gpu}-counter-set"
        assert set(use["counters"]) <= set(sets[use["counterSet"]])
    assert consumption([d for d in devices(slices) if d["name"] == "gpu-0"]) == {
        ("gpu-0-counter-set", c): v for c, v in sets["gpu-0-counter-set"].items()}


#: layouts mig-parted configures (config-default.yaml), as (profile, placement start)
A100_LAYOUTS = {
    "all-1g.5gb": [("1g.5gb", i) for i in range(7)],
    "all-1g.10gb": [("1g.10gb", i) for i in (0, 2, 4, 6)],
    "all-2g.10gb": [("2g.10gb", i) for i in (0, 2, 4)],
    "all-3g.20gb": [("3g.20gb", 0), ("3g.20gb", 4)],
    "all-balanced": list(gpudra.A100_40GB.balanced),
    "4g+3g": [("4g.20gb", 0), ("3g.20gb", 4)],
    "one +me and six 1g": [("1g.5gb+me", 0)] + [("1g.5gb", i) for i in range(1, 7)],
    "all-7g.40gb": [("7g.40gb", 0)],
}


@pytest.mark.parametrize("layout", list(A100_LAYOUTS))
def test_what_the_hardware_allows_fits_the_counters(layout: str) -> None:
    """A layout an A100 takes is one allocation of the partitionable devices: nothing sums
    past a counter of the GPU."""
    slices = gpudra.gpu_node_slices("n", gpus=1, mig="partitionable")
    gpu = gpudra.A100_40GB
    names = [f"gpu-0-mig-{p.replace('.', '').replace('+', '-')}-{gpu.profile(p).profile_id}-{s}"
             for p, s in A100_LAYOUTS[layout]]
    assert fits(slices, names)


def test_what_the_hardware_refuses_passes_a_counter() -> None:
    """Two devices on one memory slice, a MIG device beside the whole GPU, two media
    extensions: each passes a counter, so no allocation can hold both."""
    slices = gpudra.gpu_node_slices("n", gpus=2, mig="partitionable")
    migs = [d for d in devices(slices) if "-mig-" in d["name"] and d["name"].startswith("gpu-0-")]
    pairs = 0
    for a in migs:
        for b in migs:
            if a is not b and memory_slices(a["name"]) & memory_slices(b["name"]):
                pairs += 1
                assert not fits(slices, [a["name"], b["name"]]), (a["name"], b["name"])
        assert not fits(slices, ["gpu-0", a["name"]])
        assert fits(slices, ["gpu-1", a["name"]])
    assert not fits(slices, ["gpu-0-mig-1g5gb-me-20-0", "gpu-0-mig-1g5gb-me-20-1"])
    assert pairs > 100


def memory_slices(name: str) -> set[int]:
    """The memory slices an A100 MIG device holds, from its name (profile id, start)."""
    profile_id, start = (int(x) for x in name.rsplit("-", 2)[1:])
    [profile] = [p for p in gpudra.A100_40GB.profiles if p.profile_id == profile_id]
    return set(range(start, start + profile.size))


@pytest.mark.parametrize(("model", "mig"), FORMS)
def test_gpus_are_told_apart(model: str, mig: str) -> None:
    """UUIDs and PCI bus IDs differ between the GPUs of a node (what a claim's
    ``distinctAttribute`` relies on), UUIDs between nodes too; MIG devices name their parent."""
    def boards(node: str) -> dict[str, str]:
        found = {}
        for d in devices(gpudra.gpu_node_slices(node, product=model, mig=mig)):
            a = d["attributes"]
            found[(a.get("parentUUID") or a["uuid"])["string"]] = a[gpudra.PCI_BUS_ID]["string"]
        return found

    here, there = boards("n1"), boards("n2")
    assert len(here) == len(set(here.values())) == 8
    assert not set(here) & set(there)


def test_static_mig_devices_hold_their_memory_slices() -> None:
    """Static MIG: the layout's devices, each with its UUID and the memory slices of its
    placement; a layout the GPU cannot take is refused with the reason."""
    slices = gpudra.gpu_node_slices("n", gpus=2, mig="static")
    assert len(slices) == 1
    by_name = {d["name"]: d for d in devices(slices)}
    assert len(by_name) == 2 * len(gpudra.A100_40GB.balanced)
    three = by_name["gpu-1-mig-3g20gb-9-4"]
    assert sorted(k for k in three["capacity"] if k.startswith("memorySlice")) == [f"memorySlice{i}" for i in range(4, 8)]
    assert three["attributes"]["uuid"]["string"].startswith("MIG-")
    assert three["attributes"]["parentUUID"] != by_name["gpu-0-mig-3g20gb-9-4"]["attributes"]["parentUUID"]
    with pytest.raises(ValueError, match="overlaps"):
        gpudra.gpu_node_slices("n", mig="static", layout=[("3g.20gb", 4), ("4g.20gb", 0), ("1g.5gb", 0)])
    with pytest.raises(ValueError, match="cannot start at memory slice 1"):
        gpudra.gpu_node_slices("n", mig="static", layout=[("2g.10gb", 1)])


def test_bad_arguments_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="at most 8"):
        gpudra.gpu_node_slices("n", gpus=9, mig="partitionable")
    with pytest.raises(ValueError, match="mig must be one of"):
        gpudra.gpu_node_slices("n", mig="dynamic")
    with pytest.raises(ValueError, match="no GPU model 'B200'"):
        gpudra.gpu_node_slices("n", product="B200")
    assert len(devices(gpudra.gpu_node_slices("n", gpus=16))) == 16


def test_slices_name_their_node_and_owner() -> None:
    """Node-local slices: nodeName set, owned by the Node when its UID is known, names as
    the resourceslice controller generates them."""
    [owned] = gpudra.gpu_node_slices("n7", node_uid="uid-1")
    assert owned["spec"]["nodeName"] == "n7"
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n7", "uid": "uid-1", "controller": True}]
    assert owned["metadata"]["name"].startswith(owned["metadata"]["generateName"])
    assert owned["metadata"]["generateName"] == "00000-gpu.nvidia.com-n7-"
    assert "ownerReferences" not in gpudra.gpu_node_slices("n7")[0]["metadata"]
    assert gpudra.gpu_node_slices("n7") == gpudra.gpu_node_slices("n7")


def test_shared_gpus_allow_requests_within_their_capacity() -> None:
    [shared] = gpudra.shared_gpu_slices("n", gpus=2, memory_step_gi=4)
    for device in shared["spec"]["devices"]:
        assert device["allowMultipleAllocations"] is True
        for capacity in device["capacity"].values():
            policy = capacity["requestPolicy"]
            low, high = parse_quantity(policy["validRange"]["min"]), parse_quantity(policy["validRange"]["max"])
            assert low <= parse_quantity(policy["default"]) <= high <= parse_quantity(capacity["value"])
    assert shared["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] == "40Gi"


def test_pod_uses_the_claims_it_names() -> None:
    template = gpudra.claim_template("t", "mig.nvidia.com", 2, ["device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"],
                                     match_attribute="gpu.nvidia.com/parentUUID")
    devices_claim = template["spec"]["spec"]["devices"]
    assert devices_claim["requests"][0]["exactly"]["count"] == 2
    assert devices_claim["constraints"] == [{"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]
    pod = gpudra.pod_with_claims("p", templates={"a": "t"}, claims={"b": "shared"}, containers=2)
    declared = [c["name"] for c in pod["spec"]["resourceClaims"]]
    assert declared == ["a", "b"]
    assert all([c["name"] for c in ctr["resources"]["claims"]] == declared for ctr in pod["spec"]["containers"])
    with pytest.raises(ValueError, match="unique"):
        gpudra.pod_with_claims("p", templates={"a": "t"}, claims={"a": "shared"})


def test_quantities_and_versions_as_the_driver_writes_them() -> None:
    assert [gpudra.quantity(n) for n in (0, 14, 4864 * 2**20, 40 * 2**30, 1500)] == ["0", "14", "4864Mi", "40Gi", "1500"]
    assert [gpudra.semver(v) for v in ("570.124.06", "8.0", "12")] == ["570.124.6", "8.0.0", "12.0.0"]
