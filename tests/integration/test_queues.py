"""Queues, reclaim and preemption on the real control plane.

Queues are cluster-scoped: each test makes its own, under names no other test uses, and
deletes them. Pods are pinned to the test's nodes with a node selector, so the capacity a
test counts on is its own. kwok deletes an evicted pod at once, so a victim's
``DisruptionTarget`` condition is read from a watch started before the preemption.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    QUEUES,
    XK8S,
    assert_no_overcommit,
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


def gpu_queue(parent: str | None, nominal: int, **preemption: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": [{"name": GPU, "nominal": nominal}]}
    if parent:
        spec["parent"] = parent
    if preemption:
        spec["preemption"] = preemption
    return spec


def job(name: str, pool: str, *, gpu: int = 8, queue: str | None = None, priority_class: str = "",
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    all_labels = dict(labels or {})
    if queue:
        all_labels["batchsched.io/queue"] = queue
    spec: dict[str, Any] = {"nodeSelector": {"pool": pool}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return pod_body(name, gpu=gpu, metadata={"labels": all_labels}, spec=spec)


async def bound_names(kube: KubeClient, namespace: str, prefix: str) -> list[str]:
    return sorted(
        p["metadata"]["name"] for p in await list_pods(kube, namespace)
        if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
    )


class PodWatch:
    """Every version of every pod of a namespace seen from now on (victims vanish fast)."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.seen: list[dict[str, Any]] = []
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PodWatch:
        _, rv = await self.kube.list(f"/api/v1/namespaces/{self.namespace}/pods")

        async def run() -> None:
            while True:
                with contextlib.suppress(Exception):
                    async for _, obj in self.kube.watch(f"/api/v1/namespaces/{self.namespace}/pods", rv,
                                                        timeout_seconds=120):
                        self.seen.append(obj)

        self.task = asyncio.get_running_loop().create_task(run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task

    def disruption(self, name: str) -> dict[str, Any] | None:
        for obj in self.seen:
            if obj["metadata"]["name"] != name:
                continue
            for c in (obj.get("status") or {}).get("conditions") or []:
                if c.get("type") == "DisruptionTarget":
                    return dict(c)
        return None


async def test_reclaim_gives_a_team_its_nominal_back_from_a_borrower(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    org, team_a, team_b = f"org-{tag}", f"team-a-{tag}", f"team-b-{tag}"
    await make_nodes(count=4, gpus=8, labels={"pool": tag})
    async with queues(kube, (org, {}), (team_a, gpu_queue(org, 16)), (team_b, gpu_queue(org, 16))), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        # team-b borrows all of team-a's idle GPUs
        await create_pods(kube, namespace, [job(f"b-{i}", tag, queue=team_b) for i in range(4)])
        await wait_for(lambda: _count(bound_names(kube, namespace, "b-"), 4), timeout=30)

        async def status(name: str, **want: Any) -> dict[str, Any] | None:
            st = (await kube.get(f"{QUEUES}/{name}")).get("status") or {}
            return st if all(st.get(k) == v for k, v in want.items()) else None

        st = await wait_for(lambda: status(team_b, used={GPU: "32"}), timeout=15)
        assert st["nominal"] == {GPU: "16"} and st["borrowed"] == {GPU: "16"} and st["admitted"] == 4
        assert st["conditions"][0]["type"] == "Active" and st["conditions"][0]["status"] == "True"
        st_a = await wait_for(lambda: status(team_a, lent={GPU: "16"}), timeout=15)
        assert st_a["used"] == {GPU: "0"}
        # team-a wants its nominal back
        async with PodWatch(kube, namespace) as watch:
            await create_pods(kube, namespace, [job(f"a-{i}", tag, queue=team_a) for i in range(2)])
            await wait_for(lambda: _count(bound_names(kube, namespace, "a-"), 2), timeout=60)
            kept = await wait_for(lambda: _count(bound_names(kube, namespace, "b-"), 2), timeout=30)
            evicted = sorted({f"b-{i}" for i in range(4)} - set(kept))
            for name in evicted:
                cond = await wait_for(lambda name=name: _is(watch.disruption(name)), timeout=10)
                assert cond["status"] == "True" and cond["reason"] == "PreemptionByScheduler"
                assert cond["message"].startswith(f"Preempted by {namespace}/a-")
                assert f"to give queue {team_a} back its nominal quota: queue {team_b} was borrowing {GPU}" in cond["message"]
                [ev] = await wait_for(lambda name=name: events_for(kube, namespace, name, "Preempted"), timeout=10)
                assert ev["message"] == cond["message"]
        preempting = await wait_for(lambda: _any_events(kube, namespace, ["a-0", "a-1"], "Preempting"), timeout=10)
        assert any("preempting 1 pod(s) of" in e["message"] for e in preempting)
        # team-b keeps its nominal: 16 GPUs still run, and its queue says so
        await asyncio.sleep(1)
        assert len(await bound_names(kube, namespace, "b-")) == 2
        st = await wait_for(lambda: status(team_b, used={GPU: "16"}, borrowed={GPU: "0"}), timeout=15)
        assert st["admitted"] == 2
        await wait_for(lambda: status(team_a, used={GPU: "16"}), timeout=15)
        await assert_no_overcommit(kube)


async def test_a_high_priority_job_preempts_a_whole_low_priority_gang(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    research = f"research-{tag}"
    await make_nodes(count=4, gpus=8, labels={"pool": tag})
    await kube.create(f"{XK8S}/namespaces/{namespace}/podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "low"}, "spec": {"minMember": 4},
    })
    low = [job(f"low-{i}", tag, queue=research, priority_class="low-priority",
               labels={"scheduling.x-k8s.io/pod-group": "low"}) for i in range(4)]
    async with queues(kube, (research, gpu_queue(None, 32, withinQueue="LowerPriority"))), \
            running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, low)
        await wait_for(lambda: _count(bound_names(kube, namespace, "low-"), 4), timeout=30)
        async with PodWatch(kube, namespace) as watch:
            await create_pods(kube, namespace, [job("urgent", tag, queue=research, priority_class="high-priority")])
            await wait_for(lambda: _count(bound_names(kube, namespace, "urgent"), 1), timeout=60)
            # the whole gang went, not just the member on the node the job took
            await wait_for(lambda: _count(bound_names(kube, namespace, "low-"), 0), timeout=30)
            said: dict[str, str] = {}
            for i in range(4):
                cond = await wait_for(lambda i=i: _is(watch.disruption(f"low-{i}")), timeout=10)
                assert cond["reason"] == "PreemptionByScheduler"
                assert cond["message"].startswith(f"Preempted by {namespace}/urgent (priority 10) to make room on node(s)")
                assert cond["message"].endswith(f"its priority -1 is lower in queue {research}")
                said[f"low-{i}"] = cond["message"]
        [group_event] = await wait_for(lambda: events_for(kube, namespace, "low", "Preempted"), timeout=10)
        assert group_event["involvedObject"]["kind"] == "PodGroup"
        for name, message in said.items():
            # each member's Event says what its DisruptionTarget condition said
            [ev] = await wait_for(lambda name=name: events_for(kube, namespace, name, "Preempted"), timeout=10)
            assert ev["involvedObject"]["kind"] == "Pod" and ev["message"] == message
        [ev] = await wait_for(lambda: events_for(kube, namespace, "urgent", "Preempting"), timeout=10)
        assert ev["message"].startswith(f"preempting 4 pod(s) of {namespace}/low to place its 1 pod(s) on node(s)")
        await assert_no_overcommit(kube)


async def test_a_pod_disruption_budget_keeps_its_pod_and_the_preemptor_waits(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    [node] = await make_nodes(count=1, gpus=8, labels={"pool": tag})
    await kube.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "serving"}}},
    })
    async with running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, [job("serving", tag, priority_class="low-priority",
                                                labels={"app": "serving"})])
        await wait_for(lambda: _count(bound_names(kube, namespace, "serving"), 1), timeout=30)
        await create_pods(kube, namespace, [job("urgent", tag, priority_class="high-priority")])
        [failed] = await wait_for(lambda: events_for(kube, namespace, "urgent", "FailedScheduling"), timeout=30)
        # it cannot preempt the protected pod: it holds the node instead, and says why it waits
        assert failed["message"] == (
            f"0/1 nodes fit: 1 insufficient nvidia.com/gpu; holds a reservation on node(s) {node}; start "
            "time unknown (running work on those nodes declares no end)"
        )
        await asyncio.sleep(3)
        pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
        assert pods["serving"]["spec"].get("nodeName") and not pods["serving"]["metadata"].get("deletionTimestamp")
        assert not pods["urgent"]["spec"].get("nodeName")
        assert not await events_for(kube, namespace, "serving", "Preempted")
        # the budget goes away: the preemption happens (the waiting job is retried)
        await kube.delete(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/keep")
        await wait_for(lambda: _count(bound_names(kube, namespace, "urgent"), 1), timeout=60)
        [ev] = await wait_for(lambda: events_for(kube, namespace, "serving", "Preempted"), timeout=10)
        assert (ev["type"], ev["involvedObject"]["kind"]) == ("Normal", "Pod")
        assert ev["message"].startswith(f"Preempted by {namespace}/urgent (priority 10) to make room on node(s) {node}")
        assert ev["message"].endswith("its priority -1 is lower")


async def test_an_unknown_queue_is_reported_and_nothing_binds(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    ghost = f"ghost-{tag}"
    await make_nodes(count=1, gpus=8, labels={"pool": tag})
    await create_pods(kube, namespace, [job("lost", tag, gpu=1, queue=ghost)])
    async with running_scheduler(sandbox, namespace):
        [ev] = await wait_for(lambda: events_for(kube, namespace, "lost", "FailedScheduling"), timeout=30)
        assert ev["message"] == f"queue {ghost} does not exist (named by label batchsched.io/queue)"
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/lost")
        cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert (cond["status"], cond["reason"]) == ("False", "QueueNotFound")
        await asyncio.sleep(2)
        assert await bound_names(kube, namespace, "lost") == []
        # the queue appears: the pod is scheduled
        async with queues(kube, (ghost, gpu_queue(None, 8))):
            await wait_for(lambda: _count(bound_names(kube, namespace, "lost"), 1), timeout=30)


async def _count(names: Any, n: int) -> list[str] | bool:
    """The names, once there are ``n`` of them (True for none)."""
    got = await names
    if len(got) != n:
        return False
    return got or True


async def _is(value: Any) -> Any:
    return value


async def _any_events(kube: KubeClient, namespace: str, names: list[str], reason: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in names:
        out += await events_for(kube, namespace, name, reason)
    return out


async def test_queue_status_shows_quota_use_and_problems(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    org, team, orphan = f"org-{tag}", f"team-{tag}", f"orphan-{tag}"
    await make_nodes(count=1, gpus=8, labels={"pool": tag})
    async with queues(kube, (org, {}), (team, gpu_queue(org, 4)), (f"other-{tag}", gpu_queue(org, 4)),
                      (orphan, gpu_queue(f"nowhere-{tag}", 4))), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        # 6 GPUs run (2 borrowed from the sibling), 4 more wait: the cohort has no more
        await create_pods(kube, namespace, [job("run", tag, gpu=6, queue=team)])
        await wait_for(lambda: _count(bound_names(kube, namespace, "run"), 1), timeout=30)
        await create_pods(kube, namespace, [job("wait", tag, gpu=4, queue=team), job("misplaced", tag, gpu=1, queue=org)])

        async def status(name: str) -> dict[str, Any] | None:
            st = (await kube.get(f"{QUEUES}/{name}")).get("status") or {}
            return st if st.get("pending") and st.get("used") else None

        st = await wait_for(lambda: status(team), timeout=20)
        assert st["nominal"] == {GPU: "4"} and st["used"] == {GPU: "6"} and st["borrowed"] == {GPU: "2"}
        assert (st["pending"], st["admitted"]) == (1, 1)

        async def problems(name: str, reason: str) -> dict[str, Any] | None:
            conds = ((await kube.get(f"{QUEUES}/{name}")).get("status") or {}).get("conditions") or []
            return next((c for c in conds if c.get("reason") == reason), None)

        bad = await wait_for(lambda: problems(orphan, "InvalidSpec"), timeout=20)
        assert bad["type"] == "Active" and bad["status"] == "False"
        assert bad["message"] == f"queue {orphan}: parent nowhere-{tag} does not exist"
        assert bad["lastTransitionTime"].endswith("Z")
        misplaced = await wait_for(lambda: problems(org, "QueueNotLeaf"), timeout=20)
        assert misplaced["message"].startswith(f"queue {org}: 1 units name it, but it is the parent of")
        [ev] = await wait_for(lambda: events_for(kube, namespace, "wait", "FailedScheduling"), timeout=20)
        assert ev["message"].startswith(f"queue {team}: needs 4 nvidia.com/gpu; nominal 4, in use 6")
