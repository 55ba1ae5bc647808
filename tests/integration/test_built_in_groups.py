"""Kubernetes 1.37's built-in pod groups on the real control plane: a pod that joins a
``scheduling.k8s.io/v1beta1`` PodGroup through ``spec.schedulingGroup`` and names batchsched
is refused with the reason (batchsched does not schedule those groups yet), never placed
alone, and the rest of the cluster is scheduled meanwhile."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BUILT_IN = "/apis/scheduling.k8s.io/v1beta1"


async def test_a_member_of_a_built_in_pod_group_is_refused_visibly_and_never_placed_alone(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    await kube.create(f"{BUILT_IN}/namespaces/{namespace}/podgroups", {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "train"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    })
    members = [pod_body(f"train-{i}", gpu=8, spec={"nodeSelector": {"pool": pool},
                                                    "schedulingGroup": {"podGroupName": "train"}})
               for i in range(2)]
    async with running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, [*members, pod_body("alone", gpu=1, spec={"nodeSelector": {"pool": pool}})])
        why = ("it joins the scheduling.k8s.io PodGroup train (spec.schedulingGroup): batchsched does "
               "not schedule Kubernetes' built-in pod groups yet; use a scheduler-plugins or Volcano PodGroup")

        async def told() -> list[dict[str, Any]] | None:
            pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
            if not pods["alone"]["spec"].get("nodeName"):
                return None
            conds = [next((c for c in (pods[f"train-{i}"].get("status") or {}).get("conditions") or []
                           if c.get("type") == "PodScheduled"), {}) for i in range(2)]
            return conds if all(why in c.get("message", "") for c in conds) else None

        conds = await wait_for(told, timeout=30)
        assert {(c["status"], c["reason"]) for c in conds} == {("False", "Unschedulable")}, conds
        [event, *_] = await wait_for(lambda: events_for(kube, namespace, "train-0", "FailedScheduling"), timeout=15)
        assert why in event["message"]
        await asyncio.sleep(2)
        assert not [p for p in await list_pods(kube, namespace)
                    if p["metadata"]["name"].startswith("train-") and p["spec"].get("nodeName")]
