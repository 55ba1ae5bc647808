"""Kueue beside batchsched, on the real control plane, with pods shaped as Kueue's pod
integration makes them (no Kueue binary: the objects it would write): the label
``kueue.x-k8s.io/managed: "true"`` and the queue-name label, held by the scheduling gate
``kueue.x-k8s.io/admission`` until Kueue admits them (it removes the gate and sets
``kueue.x-k8s.io/podset``). batchsched places them once admitted, charges them to none of
its Queues (not even one their labels name), and its preemption leaves them alone. A
Kueue pod group (pods labelled ``kueue.x-k8s.io/pod-group-name`` and annotated
``kueue.x-k8s.io/pod-group-total-count``) is one gang: none of it is bound until all of it
can be, however Kueue's ungating of its members is spread out."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    QUEUES,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"


def kueue_pod(name: str, pool: str, team: str) -> dict[str, Any]:
    return pod_body(name, gpu=8, metadata={
        "labels": {"kueue.x-k8s.io/managed": "true", "kueue.x-k8s.io/queue-name": "user-queue",
                   "batchsched.io/queue": team},
    }, spec={"nodeSelector": {"pool": pool}, "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]})


async def node_of(kube: KubeClient, namespace: str, name: str) -> str:
    pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return str(pod["spec"].get("nodeName") or "")


async def test_kueue_admitted_pods_are_placed_uncharged_and_not_preempted(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    pool, team = f"kueue-{tag}", f"team-{tag}"
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    # team may hold 4 GPUs: the 8-GPU pod, were it charged to the queue its label names, would not fit
    async with queues(kube, (team, {"resources": [{"name": GPU, "nominal": 4}]})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        await create_pods(kube, namespace, [kueue_pod("trainer", pool, team)])
        await asyncio.sleep(3.0)
        assert await node_of(kube, namespace, "trainer") == ""  # gated until Kueue admits it

        # Kueue admits it: the gate goes, the podset label comes
        await kube.patch(f"/api/v1/namespaces/{namespace}/pods/trainer", {
            "metadata": {"labels": {"kueue.x-k8s.io/podset": "main"}}, "spec": {"schedulingGates": None},
        })

        async def placed() -> str:
            return await node_of(kube, namespace, "trainer")

        assert await wait_for(placed, timeout=30)

        async def status() -> dict[str, Any] | None:
            st: dict[str, Any] | None = (await kube.get(f"{QUEUES}/{team}")).get("status")
            return st if st and "admitted" in st else None

        st = await wait_for(status, timeout=30)
        assert st["admitted"] == 0 and (st.get("used") or {}).get(GPU, "0") == "0"

        # an urgent pod of ours (unqueued, as the Kueue pod counts for us), with nowhere else to
        # go, does not evict it: it would evict lower-priority unqueued work of ours
        await create_pods(kube, namespace, [pod_body("urgent", gpu=8, spec={
            "nodeSelector": {"pool": pool}, "priorityClassName": "high-priority"})])
        await asyncio.sleep(5.0)
        pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
        assert pods["trainer"]["spec"].get("nodeName") and not pods["trainer"]["metadata"].get("deletionTimestamp")
        assert not pods["urgent"]["spec"].get("nodeName")


def group_member(name: str, pool: str, group: str, total: int) -> dict[str, Any]:
    return pod_body(name, gpu=8, metadata={
        "labels": {"kueue.x-k8s.io/managed": "true", "kueue.x-k8s.io/queue-name": "user-queue",
                   "kueue.x-k8s.io/pod-group-name": group},
        "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(total)},
        "finalizers": ["kueue.x-k8s.io/managed"],
    }, spec={"nodeSelector": {"pool": pool}, "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]})


async def _admit(kube: KubeClient, namespace: str, name: str) -> None:
    """What Kueue does to each member of an admitted group: the gate goes, the podset label comes."""
    await kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", {
        "metadata": {"labels": {"kueue.x-k8s.io/podset": "main"}}, "spec": {"schedulingGates": None},
    })


async def test_a_kueue_pod_group_is_bound_whole_once_every_member_is_admitted(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"kueue-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    names = ["group-0", "group-1"]
    try:
        async with running_scheduler(sandbox, namespace):
            await create_pods(kube, namespace, [group_member(n, pool, "group", 2) for n in names])
            await _admit(kube, namespace, "group-0")
            await asyncio.sleep(3.0)
            # one of two admitted: a pod alone would fit, but the gang is not all there
            assert [await node_of(kube, namespace, n) for n in names] == ["", ""]

            await _admit(kube, namespace, "group-1")

            async def both() -> list[str] | None:
                nodes = [await node_of(kube, namespace, n) for n in names]
                return nodes if all(nodes) else None

            nodes = await wait_for(both, timeout=30)
            assert len(set(nodes)) == 2
            # what batchsched says of the group goes to the Workload Kueue made for it
            [placed] = await wait_for(lambda: events_for(kube, namespace, "group", "Scheduled"), timeout=20)
            assert placed["involvedObject"]["kind"] == "Workload"
            assert placed["involvedObject"]["apiVersion"].startswith("kueue.x-k8s.io/")
    finally:
        for n in names:  # Kueue's finalizer would hold them past the namespace's deletion
            await kube.patch(f"/api/v1/namespaces/{namespace}/pods/{n}", {"metadata": {"finalizers": None}})
