"""The perf suite's DRA workload: every scheduler gets the same pods asking GPUs through
ResourceClaimTemplates, the nodes publish the driver's slices (a quarter partitionable),
and a device handed out twice is counted as a user would count it from the claims."""

from __future__ import annotations

from typing import Any

import pytest

from perf import dra
from perf.peers import PEERS
from perf.workload import WorkloadError, expand, load_workload, parse_workload


def test_both_schedulers_get_the_same_pods_asking_gpus_through_claims() -> None:
    ex = expand(load_workload("dra-gpu"), "800x4000")
    counts: dict[str, int] = {}
    for p in ex.pods:
        counts[p.klass] = counts.get(p.klass, 0) + 1
    assert counts == {"gpu1": 2000, "gpu2": 1000, "mig1g": 600, "mig3g": 400}
    assert ex.gpu_demand <= 0.7 * ex.gpu_capacity  # room enough whatever the placement
    whole = expand(load_workload("dra-gpu-whole"), "800x4000")
    assert {p.device_class for p in whole.pods} == {"gpu.nvidia.com"} and whole.workload.node.mig_share == 0
    for spec in (ex.pods[0], ex.pods[-1]):
        ours, theirs = PEERS["batchsched"].pod(spec), PEERS["kube-scheduler"].pod(spec)
        assert ours["spec"].pop("schedulerName") == "batchsched"
        assert theirs["spec"].pop("schedulerName") == "default-scheduler"
        assert ours == theirs
        [container] = ours["spec"]["containers"]
        assert "nvidia.com/gpu" not in str(container["resources"])
        assert ours["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": f"{spec.klass}-claim"}]
    specs = {b["metadata"]["name"]: b["spec"]["spec"]["devices"]["requests"][0]["exactly"]
             for _, b in dra.templates(ex, "perf")}
    assert specs["gpu2-claim"]["count"] == 2 and specs["gpu2-claim"]["deviceClassName"] == "gpu.nvidia.com"
    assert specs["mig3g-claim"]["deviceClassName"] == "mig.nvidia.com"
    assert specs["mig3g-claim"]["selectors"] == [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]
    # whole GPUs of the boards without MIG only: the MIG nodes are the MIG pods'
    assert specs["gpu1-claim"]["selectors"] == [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-40GB'"}}]


def test_a_quarter_of_the_nodes_publish_partitionable_gpus() -> None:
    wl = load_workload("dra-gpu")
    objects = dra.cluster_objects([(f"n{i}", f"uid-{i}") for i in range(8)], wl.node)
    classes = [b["metadata"]["name"] for path, b in objects if path.endswith("/deviceclasses")]
    assert classes == ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"]
    slices: dict[str, list[dict[str, Any]]] = {}
    for path, body in objects:
        if path.endswith("/resourceslices"):
            slices.setdefault(body["spec"]["nodeName"], []).append(body)
    partitionable = sorted(n for n, ss in slices.items() if any("sharedCounters" in s["spec"] for s in ss))
    assert partitionable == ["n3", "n7"]
    assert [len(ss) for n, ss in sorted(slices.items())] == [1, 1, 1, 9, 1, 1, 1, 9]
    assert len(slices["n0"][0]["spec"]["devices"]) == 8
    products = {n: {d["attributes"]["productName"]["string"] for s in ss for d in s["spec"].get("devices", ())}
                for n, ss in slices.items()}
    assert products["n0"] == {"NVIDIA A100-SXM4-40GB"} and products["n3"] == {"NVIDIA H100 80GB HBM3"}


def test_claims_on_nodes_without_dra_and_mig_beyond_the_mig_nodes_are_refused() -> None:
    base: dict[str, Any] = {"name": "w", "schedulers": ["batchsched"], "sizes": {"s": {"nodes": 4, "pods": 8}}}
    with pytest.raises(WorkloadError, match="device_class needs nodes with dra: true"):
        parse_workload({**base, "classes": [{"name": "x", "device_class": "gpu.nvidia.com"}]})
    with pytest.raises(WorkloadError, match="publish GPUs by DRA: set device_class"):
        parse_workload({**base, "node": {"dra": True}, "classes": [{"name": "x"}]})
    # one partitionable node of four: 8 GPUs, 16 pods of 3g.40gb (half a GPU each) fit, 18 do not
    mig = {**base, "node": {"dra": True, "mig_share": 0.25},
           "classes": [{"name": "m", "device_class": "mig.nvidia.com", "mig_profile": "3g.40gb"}]}
    assert len(expand(parse_workload({**mig, "sizes": {"s": {"nodes": 4, "pods": 16}}}), "s").pods) == 16
    with pytest.raises(WorkloadError, match="MIG devices worth 9 GPUs asked for, the partitionable nodes have 8"):
        expand(parse_workload({**mig, "sizes": {"s": {"nodes": 4, "pods": 18}}}), "s")
    # whole GPUs on the three others only: 24 fit, 25 do not
    whole = {**base, "node": {"dra": True, "mig_share": 0.25}, "classes": [{"name": "g", "device_class": "gpu.nvidia.com"}]}
    assert len(expand(parse_workload({**whole, "sizes": {"s": {"nodes": 4, "pods": 24}}}), "s").pods) == 24
    with pytest.raises(WorkloadError, match="whole GPUs worth 25 GPUs asked for, the other nodes have 24"):
        expand(parse_workload({**whole, "sizes": {"s": {"nodes": 4, "pods": 25}}}), "s")


def claim(*devices: str, pool: str = "n0") -> dict[str, Any]:
    results = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": d} for d in devices]
    return {"status": {"allocation": {"devices": {"results": results}}}}


def test_devices_handed_out_twice_are_counted_from_the_claims() -> None:
    # MIG 3g at memory slice 4 and 1g at slices 0..3 share nothing; another pool's gpu-0 is its own
    fine = [claim("gpu-0-mig-3g40gb-9-4"), claim("gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-3"),
            claim("gpu-0", pool="n1"), claim("gpu-1")]
    assert dra.overlaps(fine) == []
    assert dra.overlaps([*fine, claim("gpu-0-mig-1g10gb-19-5")]) == ["n0/gpu-0-mig-1g10gb-19-5"]
    # an A100's 1g.10gb (GI profile 15) holds two memory slices: 2 and 3 are taken already
    assert dra.overlaps([*fine, claim("gpu-0-mig-1g10gb-15-2")]) == ["n0/gpu-0-mig-1g10gb-15-2"]
    assert dra.overlaps([*fine, claim("gpu-0")]) == ["n0/gpu-0"]
    assert dra.overlaps([claim("gpu-2"), claim("gpu-2")]) == ["n0/gpu-2"]


def test_the_ceiling_writes_what_a_scheduler_writes_before_the_binding() -> None:
    made = {"metadata": {"name": "p-gpu-x", "uid": "c1", "resourceVersion": "42",
                         "ownerReferences": [{"kind": "Pod", "name": "p", "uid": "p1"}]}}
    assert dra.claims_by_pod([made]) == {"p1": made}
    patch = dra.reserve_patch(made, "p", "p1", "n3", "gpu-5")
    assert patch["metadata"] == {"uid": "c1", "resourceVersion": "42"}
    assert patch["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "p1"}]
    alloc = patch["status"]["allocation"]
    assert alloc["devices"]["results"] == [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n3", "device": "gpu-5"}]
    assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n3"]
