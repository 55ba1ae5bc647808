"""GPU node health on the real control plane, with nodes labelled as IBM Autopilot labels
them (``autopilot.ibm.com/gpuhealth``): a node marked ERR gets no GPU pod but still CPU
pods, and when a node running a gang is marked EVICT the whole gang is evicted, with Events
saying why, to restart elsewhere."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    create_group,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

LABEL = "autopilot.ibm.com/gpuhealth"


async def test_unhealthy_gpus_get_no_work_and_evict_marks_restart_the_gang(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"health-{uuid.uuid4().hex[:6]}"
    sick, well = await make_nodes(count=2, gpus=8, labels={"pool": pool})
    await kube.patch(f"/api/v1/nodes/{sick}", {"metadata": {"labels": {LABEL: "ERR"}}})
    in_pool = {"nodeSelector": {"pool": pool}}
    async with running_scheduler(sandbox, namespace):
        await create_group(kube, XK8S, namespace, "train", {"minMember": 2})
        await create_pods(kube, namespace, [
            *[pod_body(f"train-{i}", gpu=4, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "train"}}, spec=in_pool)
              for i in range(2)],
            pod_body("etl", cpu="2", spec={**in_pool, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [sick]}]}]}}}}),
        ])

        async def placed() -> dict[str, str] | None:
            nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in await list_pods(kube, namespace)}
            return nodes if all(nodes.values()) else None

        nodes = await wait_for(placed, timeout=60)
        assert nodes == {"train-0": well, "train-1": well, "etl": sick}  # the gang avoided the ERR GPUs

        # the healthy node's GPUs fail their test: Autopilot marks it EVICT
        await kube.patch(f"/api/v1/nodes/{well}", {"metadata": {"labels": {LABEL: "EVICT"}}})

        async def gang_gone() -> bool:
            names = {p["metadata"]["name"] for p in await list_pods(kube, namespace)}
            return not ({"train-0", "train-1"} & names)

        await wait_for(gang_gone, timeout=60)
        await asyncio.sleep(1.0)
        assert {p["metadata"]["name"] for p in await list_pods(kube, namespace)} == {"etl"}
        evicted = await events_for(kube, namespace, "train", "GangEvicted")
        assert len(evicted) == 2
        assert all(f"node {well}'s GPUs are marked {LABEL}=EVICT" in e["message"] for e in evicted)
