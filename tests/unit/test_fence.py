"""The fence: writes made for the leader are dropped, never sent, once the replica's lease
deadline (its last renewal's ``renewTime`` + ``renew_deadline``) has passed, checked before
every attempt, retries included. On a fake clock and the in-memory FakeKube; a retry's
pause moves the clock, as a paused or partitioned replica sees it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

import pytest

from batchsched.core.gangs import XK8S, GroupStatus, PodGroup
from batchsched.core.plan import Binding, Eviction
from batchsched.kube import coalesce
from batchsched.kube.binder import BOUND_BY, Binder
from batchsched.kube.cleanup import CleanupWriter
from batchsched.kube.errors import ConflictError, TemporaryError
from batchsched.kube.evictor import Evictor
from batchsched.kube.fake import FakeKube
from batchsched.kube.groupstatus import GroupStatusWriter
from batchsched.kube.leader import Fence, LeaderElector, micro_time
from batchsched.kube.queuestatus import QueueStatusWriter
from batchsched.kube.status import ObjectRef, StatusWriter
from tests.unit.fake_http import serving

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
BIND_PATH = "/api/v1/namespaces/ns/pods/p/binding"
POD_PATH = "/api/v1/namespaces/ns/pods/p"
EVICT_PATH = "/api/v1/namespaces/ns/pods/p/eviction"
POD = ObjectRef(kind="Pod", api_version="v1", namespace="ns", name="p", uid="u1")
BINDING = Binding(uid="u1", namespace="ns", name="p", node="n1", unit="ns/p")
VICTIM = Eviction(uid="u1", namespace="ns", name="p", node="n1", unit="ns/p", reason="r", preemptor="ns/urgent")


class Clock:
    """A clock that moves only when told (or when a retry pauses)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ClockSleep:
    """A retry's pause: the clock moves by it, nothing waits."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.now += seconds
        await asyncio.sleep(0)


def fence_until(deadline: float, now: float) -> tuple[Fence, Clock]:
    clock = Clock(now)
    fence = Fence(clock=clock)
    fence.extend(deadline)
    return fence, clock


def paused(writer: object, clock: Clock) -> ClockSleep:
    sleep = ClockSleep(clock)
    writer.retry = dataclasses.replace(writer.retry, sleep=sleep, draw=lambda: 0.0)  # type: ignore[attr-defined]
    return sleep


async def writing(run: Callable[[], Awaitable[None]], drain: Callable[[float], Awaitable[bool]]) -> None:
    task = asyncio.get_running_loop().create_task(run())
    try:
        assert await drain(1.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- the fence itself -------------------------------------------------------------------


def test_a_fence_is_closed_until_extended_open_until_its_deadline_and_closed_on_loss() -> None:
    clock = Clock(100.0)
    fence = Fence(clock=clock)
    assert not fence.is_open()
    fence.extend(110.0)
    assert fence.is_open() and fence.deadline == 110.0
    clock.now = 109.999
    assert fence.is_open()
    clock.now = 110.0
    assert not fence.is_open()
    fence.extend(120.0)
    fence.close()
    assert not fence.is_open()
    always = Fence.always_open()
    assert always.is_open()


def test_the_elector_opens_the_fence_until_its_renewal_plus_the_renew_deadline() -> None:
    """The fence closes at the deadline by the clock alone, while the elector (like a replica
    paused or cut off) has not yet noticed that it no longer leads."""

    async def main() -> None:
        clock = Clock(1000.0)
        kube = FakeKube()
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="me",
                                lease_duration=15, renew_deadline=10, retry_period=5, clock=clock)
        assert not elector.fence.is_open()
        task = asyncio.get_running_loop().create_task(elector.run(lambda: None, lambda: None))
        try:
            while not elector.is_leader:
                await asyncio.sleep(0)
            spec = kube.objects[LEASE]["spec"]
            assert spec["renewTime"] == micro_time(1000.0)
            assert elector.fence.deadline == 1010.0
            clock.now = 1009.9
            assert elector.fence.is_open()
            clock.now = 1010.0
            assert elector.is_leader and not elector.fence.is_open()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert not elector.fence.is_open()

    asyncio.run(main())


def test_a_lease_taken_by_another_closes_the_fence() -> None:
    async def main() -> None:
        clock = Clock(1000.0)
        kube = FakeKube()
        fence = Fence(clock=clock)
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="me",
                                lease_duration=0.3, renew_deadline=0.2, retry_period=0.01,
                                clock=clock, fence=fence)
        stopped = asyncio.Event()
        task = asyncio.get_running_loop().create_task(elector.run(lambda: None, stopped.set))
        try:
            while not elector.is_leader:
                await asyncio.sleep(0)
            assert fence.is_open()
            # another replica wrote the Lease: our next renewal conflicts, the re-read shows it
            kube.objects[LEASE] = {"metadata": {"name": "l"}, "spec": {
                "holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": micro_time(1000.0)}}
            kube.fail[f"PUT {LEASE}"] = [ConflictError(409, "Conflict", "changed")]
            await asyncio.wait_for(stopped.wait(), 5)
            assert not fence.is_open() and not elector.is_leader
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_release_closes_the_fence_before_anything_is_written() -> None:
    async def main() -> None:
        fence, _ = fence_until(2000.0, 1000.0)
        kube = FakeKube()
        kube.objects[LEASE] = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="me", fence=fence)
        fence.extend(2000.0)
        await elector.release()
        assert not fence.is_open()
        assert kube.objects[LEASE]["spec"]["holderIdentity"] == ""

    asyncio.run(main())


# -- Bindings ---------------------------------------------------------------------------


def test_a_binding_names_the_replica_that_sent_it() -> None:
    async def main() -> None:
        kube = FakeKube()
        results: list[str] = []
        binder = Binder(kube, identity="replica-a", on_result=lambda b, o, err: results.append(o))
        binder.submit(BINDING)
        assert await binder.drain(1.0)
        [call] = kube.calls
        assert call.path == BIND_PATH
        assert call.body["metadata"] == {"name": "p", "namespace": "ns", "uid": "u1",
                                         "annotations": {BOUND_BY: "replica-a"}}
        assert results == ["bound"]

    asyncio.run(main())


def test_a_binding_past_the_deadline_is_not_sent() -> None:
    async def main() -> None:
        fence, _ = fence_until(10.0, 10.0)
        kube = FakeKube()
        results: list[str] = []
        binder = Binder(kube, fence=fence, on_result=lambda b, o, err: results.append(o))
        binder.submit(BINDING)
        binder.submit(dataclasses.replace(BINDING, annotations=(("batchsched.io/gpu-cards", "0"),)))
        assert await binder.drain(1.0)
        assert kube.calls == []
        assert results == ["fenced", "fenced"] and binder.fenced == 2

    asyncio.run(main())


def test_a_binding_retry_that_would_land_past_the_deadline_is_dropped() -> None:
    async def main() -> None:
        fence, clock = fence_until(10.0, 9.9)
        kube = FakeKube()
        kube.fail[BIND_PATH] = [TemporaryError(503, "", "")]
        results: list[str] = []
        binder = Binder(kube, fence=fence, on_result=lambda b, o, err: results.append(o))
        sleep = paused(binder, clock)
        binder.submit(BINDING)
        assert await binder.drain(1.0)
        assert sleep.delays == [0.2]  # the pause took the clock past the deadline
        assert kube.paths() == [BIND_PATH]  # the first try only
        assert results == ["fenced"]

    asyncio.run(main())


def test_the_annotation_patch_retried_past_the_deadline_sends_no_binding() -> None:
    async def main() -> None:
        fence, clock = fence_until(10.0, 9.9)
        kube = FakeKube()
        kube.fail[f"PATCH {POD_PATH}"] = [TemporaryError(503, "", "")]
        results: list[str] = []
        binder = Binder(kube, fence=fence, on_result=lambda b, o, err: results.append(o))
        paused(binder, clock)
        binder.submit(dataclasses.replace(BINDING, annotations=(("batchsched.io/gpu-cards", "0"),)))
        assert await binder.drain(1.0)
        assert kube.paths() == [POD_PATH]
        assert results == ["fenced"]

    asyncio.run(main())


# -- evictions and cleanups -------------------------------------------------------------


def test_an_eviction_past_the_deadline_is_not_sent_even_after_its_victim_was_marked() -> None:
    async def main() -> None:
        fence, clock = fence_until(10.0, 9.9)
        kube = FakeKube()
        kube.fail[EVICT_PATH] = [TemporaryError(503, "", "")]
        results: list[str] = []
        evictor = Evictor(kube, fence=fence, on_result=lambda e, o, err: results.append(o), clock=clock)
        paused(evictor, clock)
        evictor.submit(VICTIM)
        assert await evictor.drain(1.0)
        assert kube.paths() == [f"{POD_PATH}/status", EVICT_PATH]  # the mark, one try
        assert results == ["fenced"] and evictor.fenced == 1
        # with the fence already passed, nothing at all
        kube.calls.clear()
        evictor.submit(VICTIM)
        evictor.submit(dataclasses.replace(VICTIM, preemptor=""))
        assert await evictor.drain(1.0)
        assert kube.calls == [] and results == ["fenced"] * 3

    asyncio.run(main())


def test_a_cleanup_past_the_deadline_is_dropped() -> None:
    async def main() -> None:
        fence, clock = fence_until(10.0, 9.9)
        kube = FakeKube()
        kube.fail[POD_PATH] = [TemporaryError(503, "", "")]
        writer = CleanupWriter(kube, fence=fence)
        paused(writer, clock)
        writer.submit(POD, ("batchsched.io/gpu-cards",), ())
        assert await writer.drain(1.0)
        assert kube.paths() == [POD_PATH]
        assert (writer.written, writer.dropped) == (0, 1)

    asyncio.run(main())


# -- status writes ----------------------------------------------------------------------


def test_status_writes_past_the_deadline_are_kept_quietly_and_written_once_open(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A late renewal: what was decided meanwhile is not sent past the deadline, and is
    written once the fence opens again, without being asked for again (the session
    remembers having told it and will not tell it again)."""
    monkeypatch.setattr(coalesce, "LATER_FIRST_SECONDS", 0.01)
    monkeypatch.setattr(coalesce, "LATER_CAP_SECONDS", 0.02)

    async def main() -> None:
        fence, clock = fence_until(10.0, 10.0)
        kube = FakeKube()
        writer = StatusWriter(kube, instance="a", fence=fence, clock=clock)
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            writer.pod_unschedulable(POD, "no room")
            writer.pod_nominated(POD, "n1")
            async with asyncio.timeout(2.0):
                while writer.put_off < 3:
                    await asyncio.sleep(0.005)
            assert kube.calls == []
            assert (writer.written, writer.dropped) == (0, 0)
            fence.extend(20.0)  # the renewal arrives
            async with asyncio.timeout(2.0):
                while writer.written < 3:
                    await asyncio.sleep(0.005)
            assert sorted(kube.paths()) == [
                "/api/v1/namespaces/ns/events", f"{POD_PATH}/status", f"{POD_PATH}/status",
            ]
            assert writer.dropped == 0
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_standby_keeps_what_it_was_asked_to_write_and_writes_it_once_it_leads() -> None:
    """An object a standby cannot read is reported once its replica leads, not lost at the
    closed fence (its session remembers having told it and will not tell it again)."""

    async def main() -> None:
        clock = Clock(5.0)
        fence = Fence(clock=clock)  # a standby: never led
        kube = FakeKube()
        writer = StatusWriter(kube, instance="a", fence=fence, clock=clock)
        writer.event(POD, type="Warning", reason="Unreadable", message="cannot read it")
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            for _ in range(20):
                await asyncio.sleep(0)
            assert kube.calls == []
            assert writer.dropped == 0
            fence.extend(20.0)  # it leads
            assert await writer.drain(1.0)
            assert kube.paths() == ["/api/v1/namespaces/ns/events"]
            assert writer.written == 1
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())


def test_a_condition_retried_past_the_deadline_is_put_off() -> None:
    async def main() -> None:
        fence, clock = fence_until(10.0, 9.9)
        kube = FakeKube()
        kube.fail[f"PATCH {POD_PATH}/status"] = [TemporaryError(503, "", "")]
        writer = StatusWriter(kube, instance="a", fence=fence, clock=clock, concurrency=1)
        paused(writer, clock)
        writer.pod_unschedulable(POD, "no room")
        await writing(writer.run, writer.drain)
        # the condition was tried once; its retry, and the Event queued behind it, found the
        # deadline passed: both are kept for a later try, none is sent
        assert kube.paths() == [f"{POD_PATH}/status"]
        assert (writer.written, writer.dropped, writer.put_off) == (0, 0, 2)

    asyncio.run(main())


def test_group_and_queue_status_past_the_deadline_are_not_sent_until_it_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coalesce, "LATER_FIRST_SECONDS", 0.01)
    monkeypatch.setattr(coalesce, "LATER_CAP_SECONDS", 0.02)

    async def main() -> None:
        fence, clock = fence_until(10.0, 9.9)
        kube = FakeKube()
        group = PodGroup(api=XK8S, namespace="ns", name="g", uid="g1")
        groups = GroupStatusWriter(kube, fence=fence, clock=clock)
        queues = QueueStatusWriter(kube, fence=fence, clock=clock)
        clock.now = 10.0
        groups.update(group, GroupStatus(phase="Pending", reason="Unschedulable", message="no room"))
        queues.update("q", {"pending": 1})
        tasks = [asyncio.get_running_loop().create_task(w.run()) for w in (groups, queues)]
        try:
            async with asyncio.timeout(2.0):
                while groups.put_off < 2 or queues.put_off < 2:  # tried, and tried again
                    await asyncio.sleep(0.005)
            assert kube.calls == []
            assert (groups.dropped, queues.dropped) == (0, 0)
            fence.extend(20.0)  # nothing is asked again: what was put off is written
            async with asyncio.timeout(2.0):
                while groups.written < 1 or queues.written < 1:
                    await asyncio.sleep(0.005)
            assert sorted(kube.paths()) == [
                "/apis/batchsched.io/v1alpha1/queues/q/status",
                "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/g/status",
            ]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


# -- the last moment --------------------------------------------------------------------


def test_a_request_that_waits_past_the_deadline_before_it_is_written_is_never_sent() -> None:
    """The fence is looked at again as the request is written to its connection (made, or
    taken from the pool): a request that passed the first look, then waited (for its
    connection, for the event loop) past the deadline, never reaches the server, and the
    connection is not left half-written for the next request."""
    from aiohttp import web

    from batchsched.kube.client import Credentials, KubeClient
    from batchsched.kube.leader import Fenced

    async def main() -> None:
        received: list[str] = []

        async def handler(request: web.Request) -> web.Response:
            received.append(request.path)
            return web.json_response({})

        async with serving(handler) as url:
            client = KubeClient.from_credentials(Credentials(host=url))
            try:
                clock = Clock(0.0)
                fence = Fence(clock=clock)
                fence.extend(10.0)
                await fence.send(lambda: client.request("POST", "/first", body={}), what="first")
                assert received == ["/first"]

                class Late:
                    """Open at the caller's look; the deadline passes before the request is written."""

                    def __init__(self) -> None:
                        self.looks = 0

                    def __call__(self) -> float:
                        self.looks += 1
                        return 0.0 if self.looks == 1 else 10.0

                late = Fence(clock=Late())
                late.extend(10.0)
                with pytest.raises(Fenced):
                    await late.send(lambda: client.request("POST", "/late", body={}), what="late")
                # a pooled connection (reused) and a new one (created) are both checked
                held = [client.request("GET", "/slow") for _ in range(3)]
                await asyncio.gather(*held)
                for _ in range(3):
                    with pytest.raises(Fenced):
                        await Fence(clock=Late(), until=10.0).send(
                            lambda: client.request("POST", "/late", body={}), what="late")
                assert "/late" not in received
                # requests outside a fence are not checked; the pool still works
                await client.request("POST", "/free", body={})
                await client.request("POST", "/free", body={})
                assert received[-2:] == ["/free", "/free"]
            finally:
                await client.close()

    asyncio.run(main())


# -- the replica ----------------------------------------------------------------------------


@pytest.mark.parametrize("leader_election", [True, False])
def test_every_writer_of_a_replica_shares_its_fence_open_for_good_without_leader_election(
    leader_election: bool,
) -> None:
    from batchsched.app import Scheduler
    from batchsched.config import parse_config

    async def main() -> None:
        sched = Scheduler(FakeKube(), parse_config({"leaderElection": {"enabled": leader_election}}),  # type: ignore[arg-type]
                          identity="replica-a")
        fence = sched.fence
        writers = (sched.binder, sched.evictor, sched.cleanups, sched.status, sched.group_status, sched.queue_status)
        assert all(w.fence is fence for w in writers)
        assert sched.binder.identity == "replica-a"
        # a replica that runs leader election writes nothing until it leads
        assert fence.is_open() is not leader_election
        if not leader_election:
            assert fence.deadline == float("inf")

    asyncio.run(main())
