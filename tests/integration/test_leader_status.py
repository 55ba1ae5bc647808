"""Leader election and status writes against the real local control plane."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.leader import LeaderElector
from batchsched.kube.status import ObjectRef, StatusWriter

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def wait_for(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> float:
    """Poll a condition; return the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
    return time.monotonic() - start


# -- leader election ------------------------------------------------------------------


@dataclass
class Candidate:
    elector: LeaderElector
    task: asyncio.Task[None]
    log: list[str] = field(default_factory=list)


@dataclass
class Election:
    candidates: list[Candidate]
    both_seen: list[float]

    def leaders(self) -> list[Candidate]:
        return [c for c in self.candidates if c.elector.is_leader]


@contextlib.asynccontextmanager
async def election(kube: KubeClient, namespace: str) -> AsyncIterator[Election]:
    """Two candidates for one lease, and a sampler that records any moment both lead."""
    candidates: list[Candidate] = []
    for identity in ("alpha", "beta"):
        elector = LeaderElector(
            client=kube, namespace=namespace, name="batchsched", identity=identity,
            lease_duration=3, renew_deadline=2, retry_period=0.3,
        )
        log: list[str] = []

        def started(log: list[str] = log) -> None:
            log.append("started")

        async def stopped(log: list[str] = log) -> None:
            log.append("stopped")

        task = asyncio.create_task(elector.run(started, stopped))
        candidates.append(Candidate(elector, task, log))
    both: list[float] = []

    async def sample() -> None:
        while True:
            if all(c.elector.is_leader for c in candidates):
                both.append(time.monotonic())
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        yield Election(candidates, both)
    finally:
        sampler.cancel()
        for c in candidates:
            c.task.cancel()
        await asyncio.gather(sampler, *(c.task for c in candidates), return_exceptions=True)
        for c in candidates:
            await c.elector.release()


async def one_leader(e: Election) -> tuple[Candidate, Candidate]:
    await wait_for(lambda: len(e.leaders()) == 1, timeout=10)
    await asyncio.sleep(1.0)  # several renewals: the standby keeps standing by
    [leader] = e.leaders()
    [standby] = [c for c in e.candidates if c is not leader]
    assert leader.log == ["started"] and standby.log == []
    return leader, standby


async def lease_spec(kube: KubeClient, namespace: str) -> dict[str, object]:
    lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
    spec: dict[str, object] = lease["spec"]
    return spec


async def test_release_hands_the_lease_over_at_once(
    kube: KubeClient, scheduler_kube: KubeClient, namespace: str,
) -> None:
    async with election(scheduler_kube, namespace) as e:
        leader, standby = await one_leader(e)
        spec = await lease_spec(kube, namespace)
        assert spec["holderIdentity"] == leader.elector.identity
        assert spec["leaseDurationSeconds"] == 3
        transitions = spec["leaseTransitions"]

        await leader.elector.release()
        assert not leader.elector.is_leader
        await asyncio.wait_for(leader.task, timeout=5)  # run() returns after a release
        assert leader.log == ["started", "stopped"]
        # faster than the 3 s lease could lapse: the holder was emptied
        # (its start callback runs as a task of its own, just after the Lease is taken)
        took = await wait_for(lambda: standby.elector.is_leader and bool(standby.log), timeout=2.5)
        print(f"\nstandby took over {took:.2f} s after the release")
        assert standby.log == ["started"]
        spec = await lease_spec(kube, namespace)
        assert spec["holderIdentity"] == standby.elector.identity
        assert spec["leaseDurationSeconds"] == 3
        assert spec["leaseTransitions"] == transitions + 1  # type: ignore[operator]
        await asyncio.sleep(1.0)
        assert standby.elector.is_leader and not leader.elector.is_leader
        assert e.both_seen == []


async def test_a_crashed_leader_is_replaced_when_its_lease_lapses(
    kube: KubeClient, scheduler_kube: KubeClient, namespace: str,
) -> None:
    async with election(scheduler_kube, namespace) as e:
        leader, standby = await one_leader(e)
        leader.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leader.task
        assert not leader.elector.is_leader
        spec = await lease_spec(kube, namespace)
        assert spec["holderIdentity"] == leader.elector.identity  # not released: it lapses
        took = await wait_for(lambda: standby.elector.is_leader, timeout=8)
        print(f"\nstandby took over {took:.2f} s after the leader died")
        assert took > 1.0  # it waited for the lease to lapse
        spec = await lease_spec(kube, namespace)
        assert spec["holderIdentity"] == standby.elector.identity
        await asyncio.sleep(1.0)
        assert standby.elector.is_leader
        assert e.both_seen == []


async def test_a_leader_that_cannot_renew_steps_down(scheduler_kube: KubeClient, namespace: str) -> None:
    """Renewals that keep failing end leadership within renew_deadline, before the lease lapses."""
    elector = LeaderElector(
        client=scheduler_kube, namespace=namespace, name="batchsched", identity="solo",
        lease_duration=3, renew_deadline=1.5, retry_period=0.3,
    )
    events: list[tuple[str, float]] = []
    task = asyncio.create_task(
        elector.run(lambda: events.append(("started", time.monotonic())),
                    lambda: events.append(("stopped", time.monotonic())))
    )
    try:
        await wait_for(lambda: elector.is_leader, timeout=10)
        # every write from now on is refused: renewals fail
        original = scheduler_kube.replace

        async def refuse(path: str, body: dict[str, object]) -> dict[str, object]:
            from batchsched.kube.errors import TemporaryError

            raise TemporaryError(503, "ServiceUnavailable", "injected")

        scheduler_kube.replace = refuse  # type: ignore[method-assign]
        try:
            broken = time.monotonic()
            await asyncio.wait_for(task, timeout=5)
        finally:
            scheduler_kube.replace = original  # type: ignore[method-assign]
        assert not elector.is_leader
        assert [name for name, _ in events] == ["started", "stopped"]
        assert events[1][1] - broken < 3  # stepped down before the lease could lapse
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -- status writes --------------------------------------------------------------------


async def make_pod(kube: KubeClient, namespace: str, name: str) -> ObjectRef:
    pod = await kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": name},
         "spec": {"schedulerName": "batchsched", "containers": [{"name": "c", "image": "x"}]}},
    )
    return ObjectRef.of(pod)


async def events_of(kube: KubeClient, ref: ObjectRef, reason: str) -> list[dict[str, object]]:
    items, _ = await kube.list(
        f"/api/v1/namespaces/{ref.namespace}/events", fieldSelector=f"involvedObject.uid={ref.uid}"
    )
    return [ev for ev in items if ev["reason"] == reason]


@contextlib.asynccontextmanager
async def running(writer: StatusWriter) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(writer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def pod_scheduled_condition(kube: KubeClient, ref: ObjectRef) -> dict[str, str]:
    pod = await kube.get(f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}")
    [cond] = [c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
    return dict(cond)


async def test_unschedulable_writes_once_per_message(
    kube: KubeClient, scheduler_kube: KubeClient, namespace: str,
) -> None:
    ref = await make_pod(kube, namespace, "waiting")
    assert ref.kind == "Pod" and ref.api_version == "v1" and ref.uid
    writer = StatusWriter(scheduler_kube, instance="test-0", concurrency=4)
    async with running(writer) as task:
        for _ in range(5):
            writer.pod_unschedulable(ref, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
        await writer.drain(10)
        writer.pod_unschedulable(ref, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
        writer.pod_unschedulable(ref, "gang incomplete: 3/4 members", reason="GangIncomplete")
        await writer.drain(10)
        assert writer.pending == 0 and not task.done()

        failed = await events_of(kube, ref, "FailedScheduling")
        assert len(failed) == 2
        assert {ev["message"] for ev in failed} == {
            "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            "gang incomplete: 3/4 members",
        }
        for ev in failed:
            assert ev["type"] == "Warning" and ev["count"] == 1
            assert ev["involvedObject"] == {  # type: ignore[comparison-overlap]
                "kind": "Pod", "apiVersion": "v1", "namespace": namespace,
                "name": "waiting", "uid": ref.uid,
            }
            assert ev["source"] == {"component": "batchsched"}
            assert ev["reportingComponent"] == "batchsched"
            assert ev["reportingInstance"] == "test-0"
            assert str(ev["metadata"]["name"]).startswith("waiting.")  # type: ignore[index]
        cond = await pod_scheduled_condition(kube, ref)
        assert cond["status"] == "False"
        assert cond["reason"] == "GangIncomplete"
        assert cond["message"] == "gang incomplete: 3/4 members"
        assert cond["lastTransitionTime"].endswith("Z")

        writer.pod_scheduled(ref, "gpu-node-7")
        await writer.drain(10)
        [scheduled] = await events_of(kube, ref, "Scheduled")
        assert scheduled["type"] == "Normal"
        assert scheduled["message"] == f"Successfully assigned {namespace}/waiting to gpu-node-7"
        # scheduled forgets the message: the same message is written again
        writer.pod_unschedulable(ref, "gang incomplete: 3/4 members", reason="GangIncomplete")
        await writer.drain(10)
        assert len(await events_of(kube, ref, "FailedScheduling")) == 3
        assert writer.written == 2 * 3 + 1 and writer.dropped == 0


async def test_latest_condition_wins_under_a_burst(
    kube: KubeClient, scheduler_kube: KubeClient, namespace: str,
) -> None:
    ref = await make_pod(kube, namespace, "bursty")
    writer = StatusWriter(scheduler_kube, instance="test-0", concurrency=8)
    for i in range(20):  # queued before any worker runs: patches coalesce, events do not
        writer.pod_unschedulable(ref, f"attempt {i}")
    assert writer.pending == 21
    async with running(writer):
        await writer.drain(10)
    assert writer.pending == 0
    assert writer.written == 21 and writer.dropped == 0
    assert len(await events_of(kube, ref, "FailedScheduling")) == 20
    assert (await pod_scheduled_condition(kube, ref))["message"] == "attempt 19"


async def test_writes_for_missing_pods_are_dropped(
    kube: KubeClient, scheduler_kube: KubeClient, namespace: str,
) -> None:
    writer = StatusWriter(scheduler_kube, instance="test-0")
    async with running(writer) as task:
        ghost = ObjectRef("Pod", "v1", namespace, "ghost", "00000000-0000-0000-0000-000000000001")
        writer.pod_unschedulable(ghost, "no nodes")
        await writer.drain(10)
        assert not task.done()
        assert writer.dropped == 1  # the condition patch: no such pod
        assert writer.written == 1  # an Event may be about any object

        # a pod recreated under the same name: the UID precondition refuses the stale write
        real = await make_pod(kube, namespace, "reborn")
        stale = ObjectRef("Pod", "v1", namespace, "reborn", "00000000-0000-0000-0000-000000000002")
        writer.pod_unschedulable(stale, "stale message")
        # and a namespace that does not exist: the Event itself is refused
        writer.event(
            ObjectRef("Pod", "v1", f"{namespace}-gone", "p", "u"),
            type="Warning", reason="FailedScheduling", message="x",
        )
        await writer.drain(10)
        assert not task.done()
        assert writer.dropped == 3 and writer.pending == 0
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/reborn")
        assert pod["metadata"]["uid"] == real.uid
        assert all(c["type"] != "PodScheduled" or c.get("message") != "stale message"
                   for c in pod["status"].get("conditions") or [])

        # a forgotten pod's message is written again; the writer still works
        writer.forget(ghost.uid)
        writer.pod_unschedulable(real, "now for real")
        await writer.drain(10)
        assert (await pod_scheduled_condition(kube, real))["message"] == "now for real"

