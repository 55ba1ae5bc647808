"""What a list makes is kept out of the cyclic collector's walks (it is the mirror, long
lived): such objects are still freed by their reference counts, so a scheduler that lists
its pods again and again (a watch expired, a new leader catching up) holds one mirror's
worth of objects, not one per list."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from batchsched.app import Scheduler
from batchsched.config import Config
from batchsched.kube.fake import FakeKube

NODES = 50
PODS = 1500


def node(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"n{i}", "uid": f"n-{i}", "labels": {"kubernetes.io/hostname": f"n{i}"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "batchsched",
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}},
                        "volumeMounts": [{"name": f"kube-api-access-{i:05x}", "mountPath": "/var/run/secrets"}]}],
    }
    labels = {"app": "train"}
    phase = "Pending"
    if i % 3 == 0:  # running
        spec["nodeName"] = f"n{i % NODES}"
        phase = "Running"
    elif i % 3 == 1:  # a member of a gang of 10
        labels["scheduling.x-k8s.io/pod-group"] = f"g{i // 30}"
    return {"metadata": {"name": f"p{i}", "namespace": "team", "uid": f"p-{i}", "labels": labels,
                         "resourceVersion": str(100 + i), "creationTimestamp": "2026-11-27T00:00:00Z"},
            "spec": spec, "status": {"phase": phase}}


def tracked() -> int:
    gc.collect()
    return len(gc.get_objects()) + gc.get_freeze_count()


def test_listing_the_pods_again_and_again_holds_one_mirror_not_one_per_list() -> None:
    kube = FakeKube()
    for i in range(NODES):
        kube.objects[f"/api/v1/nodes/n{i}"] = node(i)
    for i in range(PODS):
        kube.objects[f"/api/v1/pods/p{i}"] = pod(i)
    scheduler = Scheduler(kube, Config())
    by_name = {r.name: r for r in scheduler.reflectors}

    async def main() -> list[int]:
        await by_name["nodes"]._list()
        counts = []
        for _ in range(6):
            await by_name["pods"]._list()
            counts.append(tracked())
        return counts

    try:
        counts = asyncio.run(main())
    finally:
        gc.unfreeze()
    state = scheduler.session.state
    assert len(state.pods) == PODS and len(state.pending) == PODS - PODS // 3
    # a mirror of 1,500 pods is tens of thousands of objects: one leaked per list would show
    assert max(counts[1:]) - min(counts[1:]) < PODS, counts
