"""AppWrapper (MLBatch) on the real control plane, with objects shaped as its controller
makes them (no AppWrapper binary): the controller creates each wrapped component with the
label ``workload.codeflare.dev/appwrapper: <name>`` and puts the same label on the pod
templates it wraps. A wrapped scheduler-plugins PodGroup and pods naming it
(``scheduling.x-k8s.io/pod-group``) are one gang, as MLBatch documents; the
``schedulerName`` the controller writes (``scheduler-plugins-scheduler`` in MLBatch) is
batchsched's when its config claims that name."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    create_pods,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

AW = "workload.codeflare.dev/appwrapper"
MLBATCH_SCHEDULER = "scheduler-plugins-scheduler"


async def wrapped(kube: KubeClient, namespace: str, aw: str, pool: str, *, pods: int, gpu: int,
                  scheduler: str = MLBATCH_SCHEDULER) -> list[str]:
    """One AppWrapper's components as its controller creates them: a PodGroup and its pods."""
    await kube.create(f"{XK8S}/namespaces/{namespace}/podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": aw, "labels": {AW: aw}}, "spec": {"minMember": pods},
    })
    names = [f"{aw}-{i}" for i in range(pods)]
    bodies: list[dict[str, Any]] = [
        pod_body(name, gpu=gpu, scheduler=scheduler,
                 metadata={"labels": {AW: aw, "scheduling.x-k8s.io/pod-group": aw}},
                 spec={"nodeSelector": {"pool": pool}})
        for name in names
    ]
    await create_pods(kube, namespace, bodies)
    return names


async def test_an_appwrappers_pods_are_one_gang_under_the_schedulername_it_writes(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"aw-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace, schedulerNames=["batchsched", MLBATCH_SCHEDULER]):
        first = await wrapped(kube, namespace, "aw-train", pool, pods=4, gpu=3)  # 12 of 16 GPUs
        second = await wrapped(kube, namespace, "aw-tune", pool, pods=3, gpu=2)  # 6 more: 2 fit, not 3
        other = await wrapped(kube, namespace, "aw-elsewhere", pool, pods=1, gpu=1, scheduler="another-scheduler")

        async def placed() -> dict[str, str] | None:
            nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in await list_pods(kube, namespace)}
            return nodes if all(nodes.get(n) for n in first) else None

        nodes = await wait_for(placed, timeout=60)
        await asyncio.sleep(3.0)  # the second wrapper was tried and left whole
        nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in await list_pods(kube, namespace)}
        assert all(nodes[n] for n in first)
        assert not any(nodes[n] for n in second), "an AppWrapper's gang was placed in part"
        assert not any(nodes[n] for n in other)  # not ours: another scheduler's name
        group = await kube.get(f"{XK8S}/namespaces/{namespace}/podgroups/aw-tune")
        assert "gang needs 3 pods" in group["status"]["conditions"][0]["message"]
