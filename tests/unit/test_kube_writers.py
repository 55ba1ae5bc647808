"""The kube edge's users of the retry policy and the coalescing writer, against the
in-memory FakeKube (no type: ignore needed) with a sleep that does not wait."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from batchsched.core.plan import Binding, Eviction
from batchsched.kube.binder import Binder
from batchsched.kube.errors import (
    ConflictError,
    KubeError,
    NotFoundError,
    TemporaryError,
    from_status,
)
from batchsched.kube.evictor import Evictor
from batchsched.kube.fake import FakeKube, FakeSleep
from batchsched.kube.leader import LeaderElector
from batchsched.kube.queuestatus import QueueStatusWriter
from batchsched.kube.status import ObjectRef, StatusWriter
from batchsched.kube.watch import Reflector

POD = ObjectRef(kind="Pod", api_version="v1", namespace="ns", name="p", uid="u1")
POD_STATUS = "/api/v1/namespaces/ns/pods/p/status"
EVENTS = "/api/v1/namespaces/ns/events"


async def with_task(work: Coroutine[Any, Any, None], body: Callable[[], Awaitable[None]]) -> None:
    task = asyncio.get_running_loop().create_task(work)
    try:
        await body()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def fast(writer: Any, sleep: FakeSleep) -> None:
    writer.retry = dataclasses.replace(writer.retry, sleep=sleep, draw=lambda: 0.0)


# -- pod conditions and Events ----------------------------------------------------------


def test_a_burst_of_messages_makes_every_event_but_one_condition_the_latest() -> None:
    async def main() -> None:
        kube = FakeKube()
        writer = StatusWriter(kube, instance="test-0", clock=lambda: 0.0)
        for i in range(20):
            writer.pod_unschedulable(POD, f"attempt {i}")
        assert writer.pending == 21  # 20 Events, 1 condition

        async def body() -> None:
            assert await writer.drain(1.0)

        await with_task(writer.run(), body)
        assert (writer.written, writer.dropped, writer.pending) == (21, 0, 0)
        assert len(kube.paths("POST")) == 20
        [patch] = [c for c in kube.calls if c.method == "PATCH"]
        assert patch.path == POD_STATUS and patch.kind == "strategic"
        assert patch.body["metadata"] == {"uid": "u1"}
        [cond] = patch.body["status"]["conditions"]
        assert (cond["reason"], cond["message"]) == ("Unschedulable", "attempt 19")
        assert cond["lastTransitionTime"] == "1970-01-01T00:00:00Z"

    asyncio.run(main())


def test_the_same_message_is_written_once_until_the_pod_is_scheduled() -> None:
    async def main() -> None:
        kube = FakeKube()
        writer = StatusWriter(kube, instance="test-0")

        async def body() -> None:
            for _ in range(3):
                writer.pod_unschedulable(POD, "no room")
            assert await writer.drain(1.0)
            assert kube.paths() == [POD_STATUS, EVENTS]
            writer.pod_scheduled(POD, "n1")
            writer.pod_unschedulable(POD, "no room")
            assert await writer.drain(1.0)
            assert kube.paths().count(POD_STATUS) == 2
            reasons = [c.body["reason"] for c in kube.calls if c.path == EVENTS]
            assert reasons == ["FailedScheduling", "Scheduled", "FailedScheduling"]

        await with_task(writer.run(), body)

    asyncio.run(main())


def test_a_condition_is_retried_then_a_gone_pod_forgets_its_message() -> None:
    async def main() -> None:
        kube = FakeKube()
        sleep = FakeSleep()
        writer = StatusWriter(kube, instance="test-0")
        fast(writer, sleep)
        kube.fail[f"PATCH {POD_STATUS}"] = [TemporaryError(503, "", ""), NotFoundError(404, "", "")]

        async def body() -> None:
            writer.pod_unschedulable(POD, "no room")
            assert await writer.drain(1.0)
            assert sleep.delays == [0.5]
            assert (writer.written, writer.dropped) == (1, 1)  # the Event; the condition
            writer.pod_unschedulable(POD, "no room")  # forgotten: tried again
            assert await writer.drain(1.0)
            assert kube.paths("PATCH") == [POD_STATUS] * 3

        await with_task(writer.run(), body)

    asyncio.run(main())


# -- Queue status ---------------------------------------------------------------------


def test_queue_status_retries_temporary_errors_then_writes_once() -> None:
    async def main() -> None:
        kube = FakeKube()
        sleep = FakeSleep()
        writer = QueueStatusWriter(kube, clock=lambda: 0.0)
        fast(writer, sleep)
        path = "/apis/batchsched.io/v1alpha1/queues/q/status"
        kube.fail[path] = [TemporaryError(500, "", "")] * 3

        async def body() -> None:
            writer.update("q", {"pending": 1})
            assert await writer.drain(1.0)
            writer.update("q", {"pending": 1})
            assert await writer.drain(1.0)

        await with_task(writer.run(), body)
        assert kube.paths() == [path] * 4
        assert sleep.delays == [0.5, 1.0, 2.0]
        assert (writer.written, writer.dropped) == (1, 0)

    asyncio.run(main())


# -- bindings and evictions -----------------------------------------------------------


BINDING = Binding(uid="u1", namespace="ns", name="p", node="n1", unit="ns/p")
BIND_PATH = "/api/v1/namespaces/ns/pods/p/binding"


@pytest.mark.parametrize(
    ("errors", "outcome", "delays"),
    [
        ([], "bound", []),
        ([TemporaryError(500, "", "")] * 2, "bound", [0.2, 0.4]),
        ([TemporaryError(500, "", "")] * 3, "unknown", [0.2, 0.4]),
        ([ConflictError(409, "Conflict", "")], "conflict", []),
        ([NotFoundError(404, "NotFound", "")], "gone", []),
        ([KubeError(422, "Invalid", "")], "failed", []),
    ],
)
def test_binder_outcomes(errors: list[KubeError], outcome: str, delays: list[float]) -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.fail[BIND_PATH] = list(errors)
        sleep = FakeSleep()
        results: list[str] = []
        binder = Binder(kube, retries=2, on_result=lambda b, o, err: results.append(o))
        fast(binder, sleep)
        binder.submit(BINDING)
        assert await binder.drain(1.0)
        assert results == [outcome]
        assert sleep.delays == delays
        assert kube.calls[0].body["metadata"]["uid"] == "u1"

    asyncio.run(main())


def test_bindings_in_flight_stay_within_their_budget() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.gate = asyncio.Event()
        binder = Binder(kube, concurrency=3, on_result=lambda b, o, err: None)
        for i in range(10):
            binder.submit(dataclasses.replace(BINDING, name=f"p{i}"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert (kube.peak_total, binder.in_flight) == (3, 10)
        assert not await binder.drain(0.01)
        kube.gate.set()
        assert await binder.drain(1.0)

    asyncio.run(main())


def test_bindings_left_in_flight_after_the_drain_are_ended_without_an_outcome() -> None:
    # a replica stopping with Bindings still queued: after its wait it ends them, before its
    # client is closed (they failed against the closed client, each logged as an error)
    async def main() -> None:
        kube = FakeKube()
        kube.gate = asyncio.Event()
        results: list[str] = []
        binder = Binder(kube, concurrency=2, on_result=lambda b, o, err: results.append(o))
        for i in range(5):
            binder.submit(dataclasses.replace(BINDING, name=f"p{i}"))
        assert not await binder.drain(0.01)
        await binder.cancel()
        assert (binder.in_flight, results) == (0, [])
        kube.gate.set()
        await asyncio.sleep(0.01)
        assert len([c for c in kube.calls if c.method == "POST"]) == 2  # those in flight; the queued never went

    asyncio.run(main())


BUDGET = from_status(429, {
    "reason": "TooManyRequests", "message": "Cannot evict pod",
    "details": {"causes": [{"type": "DisruptionBudget"}]},
})


@pytest.mark.parametrize(("preemptor", "outcome", "evictions"), [("ns/urgent", "blocked", 1), ("", "evicted", 2)])
def test_a_budget_blocks_a_preemption_at_once_and_a_gang_eviction_waits(
    preemptor: str, outcome: str, evictions: int
) -> None:
    async def main() -> None:
        kube = FakeKube()
        path = "/api/v1/namespaces/ns/pods/p/eviction"
        kube.fail[path] = [BUDGET]
        results: list[str] = []
        evictor = Evictor(kube, on_result=lambda e, o, err: results.append(o), clock=lambda: 0.0)
        fast(evictor, FakeSleep())
        evictor.submit(Eviction(uid="u1", namespace="ns", name="p", node="n1", unit="ns/p",
                                reason="r", preemptor=preemptor))
        assert await evictor.drain(1.0)
        assert results == [outcome]
        assert kube.paths("POST") == [path] * evictions

    asyncio.run(main())


# -- the reflector ----------------------------------------------------------------------


def test_the_reflector_backs_off_on_list_errors_then_lists_and_watches() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.objects["/api/v1/nodes/n1"] = {"metadata": {"name": "n1"}}
        kube.fail["LIST /api/v1/nodes"] = [TemporaryError(500, "", "")] * 3
        kube.watch_events = [("BOOKMARK", {"metadata": {"resourceVersion": "5"}}),
                             ("ADDED", {"metadata": {"name": "n2", "resourceVersion": "6"}})]
        listed: list[list[str]] = []
        events: list[tuple[str, str]] = []
        reflector = Reflector(
            kube, "/api/v1/nodes",
            on_list=lambda items: listed.append([o["metadata"]["name"] for o in items]),
            on_event=lambda kind, obj: events.append((kind, obj["metadata"]["name"])),
        )
        sleep = FakeSleep()
        fast(reflector, sleep)

        async def body() -> None:
            await asyncio.wait_for(reflector.synced.wait(), 1.0)
            for _ in range(10):
                await asyncio.sleep(0)

        await with_task(reflector.run(), body)
        assert sleep.delays == [0.5, 1.0, 2.0]
        assert listed == [["n1"]]
        assert events == [("ADDED", "n2")]
        assert reflector.resource_version == "6"

    asyncio.run(main())


# -- the leader's release -------------------------------------------------------------


LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"


def test_release_rereads_the_lease_after_a_conflict_and_empties_the_holder() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.objects[LEASE] = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}
        kube.fail[f"PUT {LEASE}"] = [ConflictError(409, "Conflict", "changed")]
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="me")
        sleep = FakeSleep()
        elector.release_retry = dataclasses.replace(elector.release_retry, sleep=sleep)
        await elector.release()
        assert [(c.method, c.path) for c in kube.calls] == [("GET", LEASE), ("PUT", LEASE)] * 2
        assert sleep.delays == []
        assert kube.objects[LEASE]["spec"]["holderIdentity"] == ""

    asyncio.run(main())


def test_release_gives_up_after_three_tries() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.fail[f"GET {LEASE}"] = [TemporaryError(503, "", "")] * 5
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="me", retry_period=1)
        sleep = FakeSleep()
        elector.release_retry = dataclasses.replace(elector.release_retry, sleep=sleep, draw=lambda: 0.0)
        await elector.release()
        assert kube.paths() == [LEASE] * 3
        assert sleep.delays == [0.5, 1.0]

    asyncio.run(main())
