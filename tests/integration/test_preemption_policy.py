"""Preemption on the real control plane: ``preemptionPolicy: Never`` (the pod's, as the
Priority admission copies it from its PriorityClass, and a PodGroup's PriorityClass's), and
the victims that cost the fewest GPU-hours done, as ``status.startTime`` says."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    VOLCANO,
    VOLCANO_CRD,
    XK8S,
    create_group,
    create_pods,
    events_for,
    get_group,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
NEVER = "but its preemptionPolicy is Never"


@contextlib.asynccontextmanager
async def never_class(kube: KubeClient, value: int) -> AsyncIterator[str]:
    """A PriorityClass of ``value`` whose preemptionPolicy is Never, deleted after the test."""
    name = f"never-{uuid.uuid4().hex[:6]}"
    await kube.create(CLASSES, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                "metadata": {"name": name}, "value": value, "preemptionPolicy": "Never"})
    try:
        yield name
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"{CLASSES}/{name}")


def _pod(name: str, gpu: int, selector: dict[str, str], priority_class: str = "",
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": selector}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return pod_body(name, gpu=gpu, metadata={"labels": labels or {}}, spec=spec)


async def _pod_of(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except NotFoundError:
        return None


async def _running(kube: KubeClient, namespace: str, *names: str) -> bool:
    pods = [await _pod_of(kube, namespace, n) for n in names]
    return all(p is not None and p["status"].get("phase") == "Running" for p in pods)


async def _evicted(kube: KubeClient, namespace: str, name: str) -> bool:
    pod = await _pod_of(kube, namespace, name)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


def _unscheduled(pod: dict[str, Any]) -> str:
    """The message of the pod's ``PodScheduled=False`` condition ("" when none)."""
    for cond in pod["status"].get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or "")
    return ""


async def test_a_pod_whose_class_says_never_evicts_nobody_and_gets_the_node_when_it_frees(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = {"pool": uuid.uuid4().hex[:6]}
    await make_nodes(count=1, gpus=8, labels=pool)
    async with never_class(kube, 1000) as never:
        await create_pods(kube, namespace, [_pod("low", 8, pool, "low-priority")])
        async with running_scheduler(sandbox, namespace):
            await wait_for(lambda: _running(kube, namespace, "low"), timeout=60)
            await create_pods(kube, namespace, [_pod("urgent", 8, pool, never)])
            urgent = await kube.get(f"/api/v1/namespaces/{namespace}/pods/urgent")
            # the admission copied the class's policy to the pod: that is what is read
            assert (urgent["spec"]["priority"], urgent["spec"]["preemptionPolicy"]) == (1000, "Never")

            async def decided() -> str:
                """What the scheduler did: told the pod why it waits, or evicted low."""
                if await _evicted(kube, namespace, "low"):
                    return "evicted"
                pod = await _pod_of(kube, namespace, "urgent")
                return _unscheduled(pod) if pod is not None else ""

            message = await wait_for(decided, timeout=30)
            assert message != "evicted", "low was evicted for a pod whose preemptionPolicy is Never"
            assert f"it would preempt 1 pod(s) of {namespace}/low, {NEVER}" in message
            await asyncio.sleep(3)  # several cycles: still nobody evicted
            assert not await _evicted(kube, namespace, "low")
            urgent = await kube.get(f"/api/v1/namespaces/{namespace}/pods/urgent")
            assert not urgent["spec"].get("nodeName")
            assert await events_for(kube, namespace, "low", "Preempted") == []

            # the low pod ends: the node goes to the waiting pod
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/low", gracePeriodSeconds=0)

            async def bound() -> str:
                pod = await _pod_of(kube, namespace, "urgent")
                return str(pod["spec"].get("nodeName") or "") if pod is not None else ""

            assert await wait_for(bound, timeout=30)


async def test_a_gang_whose_podgroup_class_says_never_evicts_nobody(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    # the members name no PriorityClass: the PodGroup's class (a Volcano PodGroup names
    # one) gives the gang its priority (1000 > the running pods' -1) and its policy, read
    # from the PriorityClass object
    from batchsched.sandbox.cluster import apply_manifests

    await apply_manifests(kube, [VOLCANO_CRD])
    pool = {"pool": uuid.uuid4().hex[:6]}
    await make_nodes(count=2, gpus=8, labels=pool)
    async with never_class(kube, 1000) as never:
        await create_pods(kube, namespace, [_pod(f"low-{i}", 8, pool, "low-priority") for i in range(2)])
        async with running_scheduler(sandbox, namespace):
            await wait_for(lambda: _running(kube, namespace, "low-0", "low-1"), timeout=60)
            await create_group(kube, VOLCANO, namespace, "train", {"minMember": 2, "priorityClassName": never})
            await create_pods(kube, namespace, [
                _pod(f"train-{i}", 8, pool, labels={"scheduling.volcano.sh/group-name": "train"}) for i in range(2)
            ])

            async def decided() -> str:
                """What the scheduler did: told the gang why it waits, or evicted a low pod."""
                if await _evicted(kube, namespace, "low-0") or await _evicted(kube, namespace, "low-1"):
                    return "evicted"
                group = await get_group(kube, VOLCANO, namespace, "train")
                for cond in (group.get("status") or {}).get("conditions") or []:
                    if NEVER in str(cond.get("message")):
                        return str(cond["message"])
                return ""

            message = await wait_for(decided, timeout=30)
            assert message != "evicted", "a gang whose PriorityClass says Never evicted a pod"
            whom = message.split("it would preempt 2 pod(s) of ", 1)[1].split(f", {NEVER}", 1)[0]
            assert sorted(whom.split(", ")) == [f"{namespace}/low-0", f"{namespace}/low-1"]
            assert "holds a reservation on node(s)" in message  # it waits at the head, holding the nodes
            await asyncio.sleep(3)
            assert not await _evicted(kube, namespace, "low-0")
            assert not await _evicted(kube, namespace, "low-1")


def _stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_the_victims_are_the_set_that_lost_the_fewest_gpu_hours(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    # node a: one 8-GPU pod that started an hour ago (8 GPU-hours); node b: eight 1-GPU
    # pods that started 7 hours ago (56 GPU-hours, and 8 pods)
    tag = uuid.uuid4().hex[:6]
    [a] = await make_nodes(count=1, gpus=8, labels={"pool": tag, "slot": "a"})
    [b] = await make_nodes(count=1, gpus=8, labels={"pool": tag, "slot": "b"})
    old = [f"old-{i}" for i in range(8)]
    await create_pods(kube, namespace, [
        _pod("fresh", 8, {"pool": tag, "slot": "a"}, "low-priority"),
        *(_pod(name, 1, {"pool": tag, "slot": "b"}, "low-priority") for name in old),
    ])
    async with running_scheduler(sandbox, namespace):
        await wait_for(lambda: _running(kube, namespace, "fresh", *old), timeout=60)
        # what the scheduler reads as "work done": the pods' status.startTime
        now = dt.datetime.now(dt.UTC)
        for name, hours in [("fresh", 1), *((n, 7) for n in old)]:
            await kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                             {"status": {"startTime": _stamp(now - dt.timedelta(hours=hours))}})
        await asyncio.sleep(1)  # the watch delivers the start times
        await create_pods(kube, namespace, [_pod("urgent", 8, {"pool": tag}, "high-priority")])

        async def evicted() -> list[str]:
            return [n for n in ("fresh", *old) if await _evicted(kube, namespace, n)]

        assert await wait_for(evicted, timeout=30) == ["fresh"]
        [event] = await wait_for(lambda: events_for(kube, namespace, "urgent", "Preempting"), timeout=10)
        assert event["message"] == (
            f"preempting 1 pod(s) of {namespace}/fresh to place its 1 pod(s) on node(s) {a}"
        )
        for name in old:
            assert not await _evicted(kube, namespace, name), name

        async def bound() -> str:
            pod = await _pod_of(kube, namespace, "urgent")
            return str(pod["spec"].get("nodeName") or "") if pod is not None else ""

        assert await wait_for(bound, timeout=30) == a
        assert b != a


async def test_a_pod_bound_by_a_first_cycle_cut_short_is_not_the_victim_of_the_cycle_that_takes_it_up(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    """Two 1-GPU nodes; on node a runs r0 of queue qa (started an hour ago). Waiting when
    batchsched starts again: a gang of one 1-GPU pod of qa at high priority, and an
    unqueued 1-GPU pod p0 at low priority. The first cycle stops at its first placement
    (``firstWalkBudgetSeconds`` 0): p0, bound to node b (the unqueued turn comes first).
    The cycle that takes the walk up at once places the gang by evicting r0, as one walk
    would; not p0, bound a moment before, which has lost the fewest GPU-hours."""
    tag = uuid.uuid4().hex[:6]
    [a] = await make_nodes(count=1, gpus=1, labels={"pool": tag, "slot": "a"})
    [b] = await make_nodes(count=1, gpus=1, labels={"pool": tag, "slot": "b"})
    qa = f"qa-{tag}"
    queued = {"batchsched.io/queue": qa}
    async with queues(kube, (qa, {"resources": [{"name": "nvidia.com/gpu", "nominal": 2}]})):
        await create_pods(kube, namespace, [_pod("r0", 1, {"pool": tag, "slot": "a"}, "low-priority", queued)])
        async with running_scheduler(sandbox, namespace):
            await wait_for(lambda: _running(kube, namespace, "r0"), timeout=30)
        hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        await kube.patch(f"/api/v1/namespaces/{namespace}/pods/r0/status", {"status": {"startTime": _stamp(hour_ago)}})
        await create_group(kube, XK8S, namespace, "g", {"minMember": 1})
        await create_pods(kube, namespace, [_pod("g-0", 1, {"pool": tag}, "high-priority",
                                                 {**queued, "scheduling.x-k8s.io/pod-group": "g"})])
        await asyncio.sleep(1.1)  # creation times are in seconds: the gang is older
        await create_pods(kube, namespace, [_pod("p0", 1, {"pool": tag}, "low-priority")])
        async with running_scheduler(sandbox, namespace, cycle={"firstWalkBudgetSeconds": 0}):
            async def evicted() -> list[str]:
                return [n for n in ("r0", "p0") if await _evicted(kube, namespace, n)]

            assert await wait_for(evicted, timeout=30) == ["r0"]
            p0 = await _pod_of(kube, namespace, "p0")
            assert p0 is not None and p0["spec"].get("nodeName") == b
            await asyncio.sleep(2)  # the cycles after keep it so
            assert await evicted() == ["r0"]
            assert a != b
