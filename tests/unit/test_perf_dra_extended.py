"""The perf suite's extended-resource DRA workload: pods ask ``nvidia.com/gpu`` with no
claim of their own, the GPU DeviceClass names that resource, and after the run each bound
pod must hold exactly one allocated claim made for it, on its node, with its GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from perf import dra
from perf.peers import PEERS
from perf.workload import WorkloadError, expand, load_workload, parse_workload


def test_pods_ask_nvidia_gpu_and_the_gpu_class_names_it() -> None:
    ex = expand(load_workload("dra-gpu-extended"), "800x4000")
    counts: dict[str, int] = {}
    for p in ex.pods:
        counts[p.klass] = counts.get(p.klass, 0) + 1
    assert counts == {"gpu1": 3000, "gpu2": 1000}
    assert ex.extended and ex.dra and ex.gpu_demand <= 0.8 * ex.gpu_capacity
    assert dra.templates(ex, "perf") == []
    for spec in (ex.pods[0], ex.pods[-1]):
        ours, theirs = PEERS["batchsched"].pod(spec), PEERS["kube-scheduler"].pod(spec)
        assert ours["spec"].pop("schedulerName") == "batchsched"
        assert theirs["spec"].pop("schedulerName") == "default-scheduler"
        assert ours == theirs
        assert "resourceClaims" not in ours["spec"]
        [container] = ours["spec"]["containers"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == str(spec.gpus)
        assert container["resources"]["limits"] == {"nvidia.com/gpu": str(spec.gpus)}
    objects = dra.cluster_objects([("n0", "u0")], ex.workload.node, extended=True)
    classes = {b["metadata"]["name"]: b["spec"] for path, b in objects if path.endswith("/deviceclasses")}
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    # the template workloads keep their classes as they were measured
    plain = dra.cluster_objects([("n0", "u0")], load_workload("dra-gpu-whole").node)
    assert not any("extendedResourceName" in b["spec"] for path, b in plain if path.endswith("/deviceclasses"))


def test_extended_only_on_the_gpu_class_of_nodes_without_mig() -> None:
    base: dict[str, Any] = {"name": "w", "schedulers": ["batchsched"], "sizes": {"s": {"nodes": 4, "pods": 8}}}
    with pytest.raises(WorkloadError, match=r"extended needs device_class gpu\.nvidia\.com"):
        parse_workload({**base, "classes": [{"name": "x", "extended": True}]})
    with pytest.raises(WorkloadError, match=r"extended needs device_class gpu\.nvidia\.com"):
        parse_workload({**base, "node": {"dra": True, "mig_share": 0.25}, "classes": [
            {"name": "x", "device_class": "mig.nvidia.com", "mig_profile": "1g.10gb", "extended": True}]})
    with pytest.raises(WorkloadError, match="extended classes need nodes without MIG"):
        parse_workload({**base, "node": {"dra": True, "mig_share": 0.25}, "classes": [
            {"name": "x", "device_class": "gpu.nvidia.com", "extended": True}]})


def _pod(name: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {"nodeName": node} if node else {}}


def _claim(owner: str, node: str | None, devices: int = 1, *, marked: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{owner}-extended-resources-x",
                            "ownerReferences": [{"kind": "Pod", "name": owner, "uid": f"uid-{owner}"}]}
    if marked:
        meta["annotations"] = {dra.EXTENDED_MARK: "true"}
    status = {}
    if node:
        status["allocation"] = {"devices": {"results": [
            {"request": dra.EXTENDED_REQUEST, "driver": "gpu.nvidia.com", "pool": node, "device": f"gpu-{i}"}
            for i in range(devices)]}}
    return {"metadata": meta, "status": status}


def test_each_bound_pod_needs_one_allocated_claim_of_its_own_on_its_node() -> None:
    pods = [_pod("ok", "n1"), _pod("none", "n1"), _pod("two", "n1"), _pod("elsewhere", "n1"),
            _pod("short", "n2"), _pod("unmarked", "n2"), _pod("pending", None), _pod("pending-made", None)]
    claims = [
        _claim("ok", "n1"),
        _claim("two", "n1"), _claim("two", "n1"),
        _claim("elsewhere", "n2"),
        _claim("short", "n2", devices=1),
        _claim("unmarked", "n2", marked=False),
        _claim("pending-made", "n3"),
        _claim("ok", None),  # made and never allocated: not one the pod holds
    ]
    asked = {p["metadata"]["name"]: 1 for p in pods} | {"short": 2}
    assert dra.extended_faults(pods, claims, asked) == [
        "elsewhere on n1 asks 1 GPUs, its claim holds 1 on n2",
        "none: 0 allocated claims made for it",
        "short on n2 asks 2 GPUs, its claim holds 1 on n2",
        "two: 2 allocated claims made for it",
        "unmarked: 0 allocated claims made for it",
    ]
    # pods of template classes are not asked about
    assert dra.extended_faults(pods, claims, {"ok": 1}) == []


def test_the_ceiling_writes_what_a_scheduler_writes_for_an_extended_pod() -> None:
    claim = dra.extended_claim("p", "uid-p", 2)
    assert claim["metadata"]["annotations"] == {dra.EXTENDED_MARK: "true"}
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-p"
    [request] = claim["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}
    made = {**claim, "metadata": {**claim["metadata"], "name": "p-extended-resources-abc", "uid": "c1",
                                  "resourceVersion": "7"}}
    patch = dra.reserve_patch(made, "p", "uid-p", "n1", "gpu-3", request=dra.EXTENDED_REQUEST)
    assert patch["metadata"] == {"uid": "c1", "resourceVersion": "7"}
    assert dra.extended_faults([_pod("p", "n1")], [{**made, "status": patch["status"]}], {"p": 1}) == []
    status = dra.extended_status_patch("uid-p", "p-extended-resources-abc")
    assert status["status"]["extendedResourceClaimStatus"]["resourceClaimName"] == "p-extended-resources-abc"
