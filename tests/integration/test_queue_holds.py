"""What a queue holds back, on the real control plane: a queue stopped while its preemptor
waits for a victim to terminate admits that preemptor no more than any other work (its
``nominatedNodeName`` is cleared, an Event says why, also after a restart); and the GPUs of
an unhealthy node are withheld from queues whatever GPU resource their quota names.

Queues are cluster-scoped: each test makes its own, under names no other test uses. A
victim annotated ``batchsched.io/sim-hold`` stays terminating until the test removes the
annotation (the sandbox's kwok stages)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
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
SHARES = "batchsched.io/gpu"
HOLD = "batchsched.io/sim-hold"
HEALTH = "autopilot.ibm.com/gpuhealth"


def _pod(name: str, pool: str, queue: str, priority_class: str, gpu: int = 8, **annotations: str) -> dict[str, Any]:
    return pod_body(name, gpu=gpu, metadata={"labels": {"batchsched.io/queue": queue}, "annotations": annotations},
                    spec={"nodeSelector": {"pool": pool}, "priorityClassName": priority_class})


async def _get(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except NotFoundError:
        return None


async def _nominated(kube: KubeClient, namespace: str, name: str) -> str:
    pod = await _get(kube, namespace, name)
    return str((pod or {}).get("status", {}).get("nominatedNodeName") or "")


async def _cleared(kube: KubeClient, namespace: str, name: str) -> bool:
    """The pod is still there, pending, with no nominated node."""
    pod = await _get(kube, namespace, name)
    return pod is not None and not pod["spec"].get("nodeName") and not pod["status"].get("nominatedNodeName")


async def _node_of(kube: KubeClient, namespace: str, name: str) -> str:
    pod = await _get(kube, namespace, name)
    return str((pod or {}).get("spec", {}).get("nodeName") or "")


async def _preempting(kube: KubeClient, namespace: str, pool: str, team: str, node: str) -> None:
    """``low`` runs on ``node``; ``urgent`` preempts it, and it stays terminating."""
    await create_pods(kube, namespace, [_pod("low", pool, team, "low-priority", **{HOLD: "true"})])
    await wait_for(lambda: _node_of(kube, namespace, "low"), timeout=60)
    await create_pods(kube, namespace, [_pod("urgent", pool, team, "high-priority")])

    async def nominated() -> bool:
        low = await _get(kube, namespace, "low")
        return (await _nominated(kube, namespace, "urgent") == node
                and low is not None and bool(low["metadata"].get("deletionTimestamp")))

    await wait_for(nominated, timeout=30)


async def _release(kube: KubeClient, namespace: str, name: str) -> None:
    """Let a terminating victim finish, and wait until it is gone."""
    await kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"annotations": {HOLD: None}}})

    async def gone() -> bool:
        return await _get(kube, namespace, name) is None

    await wait_for(gone, timeout=30)


def _dropped(team: str, node: str, policy: str = "Hold") -> str:
    return (f"gave up the capacity held for it on node(s) {node}: queue {team} is stopped "
            f"(stopPolicy {policy}); it is tried again once its queue admits work")


async def test_a_queue_stopped_while_its_preemptor_waits_admits_it_only_when_it_runs_again(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"hold-{uuid.uuid4().hex[:6]}"
    [node] = await make_nodes(count=1, gpus=8, labels={"pool": pool})
    team = f"team-{pool}"
    async with queues(kube, (team, {"resources": [{"name": GPU, "nominal": "16"}]})), \
            running_scheduler(sandbox, namespace):
        await _preempting(kube, namespace, pool, team, node)
        await kube.patch(f"{QUEUES}/{team}", {"spec": {"stopPolicy": "Hold"}})

        await wait_for(lambda: _cleared(kube, namespace, "urgent"), timeout=30)
        dropped = await wait_for(lambda: events_for(kube, namespace, "urgent", "NominationDropped"), timeout=30)
        assert [e["message"] for e in dropped] == [_dropped(team, node)]

        # the victim is gone and the node free: neither the preemptor nor new work of the
        # held queue is placed (the new work has a lower priority, so that which of the two
        # goes first once the queue runs again does not hang on their creation times)
        await _release(kube, namespace, "low")
        await create_pods(kube, namespace, [_pod("late", pool, team, "low-priority")])
        await asyncio.sleep(5)  # several cycles
        assert await _cleared(kube, namespace, "urgent") and await _cleared(kube, namespace, "late")
        urgent = await _get(kube, namespace, "urgent")
        assert urgent is not None
        [scheduled] = [c for c in urgent["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        assert scheduled["message"] == (
            f"queue {team} is stopped (stopPolicy Hold): it admits no new work until its stopPolicy is None"
        )

        await kube.patch(f"{QUEUES}/{team}", {"spec": {"stopPolicy": "None"}})
        assert await wait_for(lambda: _node_of(kube, namespace, "urgent"), timeout=60) == node
        assert await _node_of(kube, namespace, "late") == ""


async def test_a_restarted_scheduler_does_not_revive_the_nomination_of_a_stopped_queue(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"restart-{uuid.uuid4().hex[:6]}"
    [node] = await make_nodes(count=1, gpus=8, labels={"pool": pool})
    team = f"team-{pool}"
    async with queues(kube, (team, {"resources": [{"name": GPU, "nominal": "16"}]})):
        async with running_scheduler(sandbox, namespace):
            await _preempting(kube, namespace, pool, team, node)
        # while no scheduler runs, the queue is stopped and the victim finishes
        await kube.patch(f"{QUEUES}/{team}", {"spec": {"stopPolicy": "HoldAndDrain"}})
        await _release(kube, namespace, "low")
        assert await _nominated(kube, namespace, "urgent") == node
        async with running_scheduler(sandbox, namespace):

            await wait_for(lambda: _cleared(kube, namespace, "urgent"), timeout=30)
            await asyncio.sleep(3)  # several cycles: neither bound nor drained
            assert await _cleared(kube, namespace, "urgent")
            dropped = await events_for(kube, namespace, "urgent", "NominationDropped")
            assert [e["message"] for e in dropped] == [_dropped(team, node, "HoldAndDrain")]

            await kube.patch(f"{QUEUES}/{team}", {"spec": {"stopPolicy": "None"}})
            assert await wait_for(lambda: _node_of(kube, namespace, "urgent"), timeout=60) == node


async def _cluster_gpus(kube: KubeClient) -> int:
    nodes = (await kube.get("/api/v1/nodes"))["items"]
    return sum(int((n.get("status") or {}).get("allocatable", {}).get(GPU, "0")) for n in nodes)


async def test_an_unhealthy_nodes_gpus_are_withheld_from_exact_card_quotas(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    sick, _ = await make_nodes(count=2, gpus=8)
    await kube.patch(f"/api/v1/nodes/{sick}", {"metadata": {"labels": {HEALTH: "ERR"}}})
    half = await _cluster_gpus(kube) // 2  # the two roots promise every GPU of the cluster
    a, b = f"team-a-{tag}", f"team-b-{tag}"
    quota = {"resources": [{"name": SHARES, "nominal": str(half)}]}

    def one_gpu(name: str, team: str) -> dict[str, Any]:
        return pod_body(name, gpu=1, metadata={"labels": {"batchsched.io/queue": team}})

    async def bound(prefix: str) -> list[str]:
        return [p["metadata"]["name"] for p in await list_pods(kube, namespace)
                if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")]

    async with queues(kube, (a, quota), (b, quota)), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        # 8 GPUs of the promised are on the ERR node: each root is backed for 4 fewer
        await create_pods(kube, namespace, [one_gpu(f"a-{i}", a) for i in range(half)])
        await wait_for(lambda: _count(bound, "a-", half - 4), timeout=60)
        await create_pods(kube, namespace, [one_gpu(f"b-{i}", b) for i in range(half)])
        await wait_for(lambda: _count(bound, "b-", half - 4), timeout=60)
        await asyncio.sleep(2)  # a few more cycles: nothing more is admitted
        assert (len(await bound("a-")), len(await bound("b-"))) == (half - 4, half - 4)

        for team in (a, b):
            async def reduced(team: str = team) -> dict[str, Any] | None:
                st = (await kube.get(f"{QUEUES}/{team}")).get("status") or {}
                return st if st.get("unavailable") else None

            status = await wait_for(reduced, timeout=30)
            assert status["unavailable"] == {SHARES: "4"}
            assert status["nominal"] == {SHARES: str(half)}
            [cond] = [c for c in status["conditions"] if c["type"] == "CapacityReduced"]
            assert cond["status"] == "True" and cond["reason"] == "UnhealthyNodes"
            assert cond["message"].startswith(f"4 {SHARES} of its nominal is withheld")


async def _count(bound, prefix: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    return len(await bound(prefix)) == n
