"""GPU node health on the real control plane, with nodes labelled as IBM Autopilot labels
them (``autopilot.ibm.com/gpuhealth``): a node marked ERR gets no GPU pod but still CPU
pods, when a node running a gang is marked EVICT the whole gang is evicted, with Events
saying why, to restart elsewhere, and the GPUs unhealthy nodes cannot give are shown
withheld in the status of the queues that promised them."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    QUEUES,
    XK8S,
    create_group,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    queues,
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


async def _cluster_gpus(kube: KubeClient) -> int:
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    return sum(int((n.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", "0")) for n in nodes)


async def test_gpus_on_unhealthy_nodes_are_withheld_from_the_queues_that_promised_them(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    first, second = await make_nodes(count=2, gpus=8)
    total = await _cluster_gpus(kube)  # the quotas promise every GPU of the cluster, as MLBatch's do
    org, a, b = f"org-{tag}", f"a-{tag}", f"b-{tag}"
    async with queues(kube, (org, {}),
                      (a, {"parent": org, "resources": [{"name": "nvidia.com/gpu", "nominal": str(total - 8)}]}),
                      (b, {"parent": org, "resources": [{"name": "nvidia.com/gpu", "nominal": "8"}]})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):

        async def status() -> dict[str, object]:
            return (await kube.get(f"{QUEUES}/{org}")).get("status") or {}

        await wait_for(lambda: _with(status, "nominal"), timeout=30)
        assert "unavailable" not in await status()

        await kube.patch(f"/api/v1/nodes/{first}", {"metadata": {"labels": {LABEL: "ERR"}}})
        got = await wait_for(lambda: _with(status, "unavailable"), timeout=30)
        assert got["unavailable"] == {"nvidia.com/gpu": "8"}
        assert got["nominal"] == {"nvidia.com/gpu": str(total)}
        [cond] = [c for c in got["conditions"] if c["type"] == "CapacityReduced"]
        assert cond["status"] == "True" and cond["reason"] == "UnhealthyNodes"
        assert cond["message"].startswith("8 nvidia.com/gpu of its nominal is withheld")

        await kube.patch(f"/api/v1/nodes/{second}", {"metadata": {"labels": {LABEL: "TESTING"}}})
        got = await wait_for(lambda: _with(status, "unavailable", {"nvidia.com/gpu": "16"}), timeout=30)

        for name in (first, second):
            await kube.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {LABEL: "PASS"}}})

        async def recovered() -> bool:
            st = await status()
            return "unavailable" not in st and not any(
                c["type"] == "CapacityReduced" and c["status"] == "True" for c in st.get("conditions") or [])

        await wait_for(recovered, timeout=30)


async def _with(status, key: str, value: object = None) -> dict[str, object] | None:  # type: ignore[no-untyped-def]
    st = await status()
    if key in st and (value is None or st[key] == value):
        return st  # type: ignore[no-any-return]
    return None
