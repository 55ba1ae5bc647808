"""Failover: a standby takes over from a leader that stopped as soon as the rules allow,
not a retry period later, and a new leader's first step does not wait on reading again
what its watches already hold."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from batchsched.app import LEADER_WRITES, Scheduler
from batchsched.config import parse_config
from batchsched.core.plan import Binding
from batchsched.kube.fake import FakeKube
from batchsched.kube.leader import RENEW_DEADLINE_ANNOTATION, LeaderElector, micro_time
from batchsched.kube.watch import Reflector

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"


def _held_by_old(renewed: float) -> dict[str, object]:
    return {"metadata": {"name": "l"}, "spec": {
        "holderIdentity": "old", "leaseDurationSeconds": 15, "renewTime": micro_time(renewed)}}


def test_a_standby_takes_a_lease_over_when_it_lapses_not_a_retry_period_later() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.objects[LEASE] = _held_by_old(time.time() - 14.7)  # lapses in 0.3 s; nobody renews it
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="standby",
                                lease_duration=15, renew_deadline=10, retry_period=2)
        took = asyncio.Event()
        task = asyncio.create_task(elector.run(took.set, lambda: None))
        try:
            t0 = time.monotonic()
            await asyncio.wait_for(took.wait(), 1.5)  # a retry period is 2 s and more
            assert 0.25 < time.monotonic() - t0 < 1.0
            assert kube.objects[LEASE]["spec"]["holderIdentity"] == "standby"
        finally:
            await elector.release()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_a_standby_that_wakes_at_the_lapse_and_finds_the_lease_renewed_keeps_waiting() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.objects[LEASE] = _held_by_old(time.time() - 14.8)
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="standby",
                                lease_duration=15, renew_deadline=10, retry_period=2)
        took = asyncio.Event()
        task = asyncio.create_task(elector.run(took.set, lambda: None))
        try:
            await asyncio.sleep(0.05)
            kube.objects[LEASE] = _held_by_old(time.time())  # the holder renews in time
            await asyncio.sleep(0.5)
            assert not took.is_set()
            assert kube.objects[LEASE]["spec"]["holderIdentity"] == "old"
            assert elector.holder_lapses_at > time.time() + 14
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_the_holder_publishes_its_renew_deadline_and_a_successor_reads_when_its_writes_ended() -> None:
    async def main() -> None:
        now = time.time()
        kube = FakeKube()
        old = LeaderElector(client=kube, namespace="ns", name="l", identity="old", clock=lambda: now - 20.0,
                            lease_duration=15, renew_deadline=10, retry_period=2)
        assert await old._try_acquire_or_renew()
        assert kube.objects[LEASE]["metadata"]["annotations"][RENEW_DEADLINE_ANNOTATION] == "10"
        new = LeaderElector(client=kube, namespace="ns", name="l", identity="new", clock=lambda: now)
        assert await new._try_acquire_or_renew()
        # the old holder's fence closed 10 s after its renewal, 5 s before its lease lapsed
        assert abs(new.predecessor_until - (now - 10.0)) < 1e-3

    asyncio.run(main())


class _Relists:
    """Stands in for the reflectors' lists: records which were listed again, and when."""

    def __init__(self, sched: Scheduler, *, listed_at: float) -> None:
        self.names: list[str] = []
        for r in sched.reflectors:
            r.listed_at = listed_at
            r.relist = self._relist(r)  # type: ignore[method-assign]

    def _relist(self, reflector: Reflector) -> Callable[[], Awaitable[None]]:
        async def relist() -> None:
            await asyncio.sleep(0.01)
            reflector.listed_at = time.time()
            self.names.append(reflector.name)

        return relist


def _standby() -> Scheduler:
    return Scheduler(FakeKube(), parse_config({"leaderElection": {"enabled": True}}),  # type: ignore[arg-type]
                     identity="standby")


def test_a_new_leader_lists_again_only_what_a_leader_writes_and_only_if_listed_before_its_predecessor_stopped(
) -> None:
    async def main() -> None:
        sched = _standby()
        relists = _Relists(sched, listed_at=time.time() - 600)  # the mirror was listed at start
        sched.elector = LeaderElector(client=FakeKube(), namespace="ns", name="l", identity="standby")
        sched.elector.predecessor_until = time.time() - 5
        await sched._catch_up()
        assert sorted(relists.names) == sorted(r.name for r in sched.reflectors if r.name in LEADER_WRITES)
        assert "pods" in relists.names and "nodes" not in relists.names
        relists.names.clear()
        await sched._catch_up()  # listed after the predecessor stopped: nothing to read again
        assert relists.names == []

    asyncio.run(main())


def test_a_standby_whose_leader_went_silent_lists_before_the_lapse_so_taking_over_lists_nothing() -> None:
    async def main() -> None:
        sched = _standby()
        relists = _Relists(sched, listed_at=time.time() - 600)
        elector = LeaderElector(client=FakeKube(), namespace="ns", name="l", identity="standby")
        sched.elector = elector
        # the holder renewed 20 s ago (a live one renews every 2 s): its writes ended 10 s ago
        elector.holder_writes_end = time.time() - 10
        elector.holder_lapses_at = time.time() + 3
        task = asyncio.create_task(sched._read_ahead(elector))
        try:
            for _ in range(100):
                if relists.names:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)
            assert "pods" in relists.names and "nodes" not in relists.names
            relists.names.clear()
            elector.predecessor_until = elector.holder_writes_end  # then it takes the Lease over
            await sched._catch_up()
            assert relists.names == []
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_a_standby_whose_leader_renews_does_not_list_again() -> None:
    async def main() -> None:
        sched = _standby()
        relists = _Relists(sched, listed_at=time.time() - 600)
        elector = LeaderElector(client=FakeKube(), namespace="ns", name="l", identity="standby")
        elector.holder_writes_end = time.time() + 8  # renewed 2 s ago
        task = asyncio.create_task(sched._read_ahead(elector))
        try:
            await asyncio.sleep(0.6)
            assert relists.names == []
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_release_closes_the_fence_waits_for_what_was_sent_then_empties_the_holder() -> None:
    async def main() -> None:
        kube = FakeKube()
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="old")
        assert await elector._try_acquire_or_renew()
        seen: list[tuple[bool, str]] = []

        async def settle() -> None:
            seen.append((elector.fence.is_open(), kube.objects[LEASE]["spec"]["holderIdentity"]))

        await elector.release(settle=settle)
        assert seen == [(False, "old")]  # nothing more passes the fence while it still holds the Lease
        assert kube.objects[LEASE]["spec"]["holderIdentity"] == ""

    asyncio.run(main())


def test_a_leader_stopped_gracefully_hands_over_once_what_it_sent_landed_leaving_what_was_queued() -> None:
    async def main() -> None:
        kube = FakeKube()
        sched = Scheduler(kube, parse_config({"leaderElection": {"enabled": True},  # type: ignore[arg-type]
                                              "binder": {"concurrency": 1}}), identity="old")
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="old", fence=sched.fence)
        assert await elector._try_acquire_or_renew()
        outcomes: list[tuple[str, str]] = []
        sched.binder.on_result = lambda b, outcome, err: outcomes.append((b.name, outcome))
        saved: list[bool] = []

        async def save_mix() -> bool:  # the mix is saved while the fence is still open
            saved.append(sched.fence.is_open())
            return True

        sched.mix_store.write = save_mix  # type: ignore[method-assign]
        kube.gate = asyncio.Event()  # the apiserver answers nothing until set
        sched.binder.submit_all([Binding(uid=f"u{i}", namespace="ns", name=f"p{i}", node="n1", unit=f"ns/p{i}")
                                 for i in range(3)])
        await asyncio.sleep(0.01)  # p0's Binding is in flight, p1 and p2 wait for a slot
        hand_over = asyncio.create_task(sched._hand_over(elector))
        await asyncio.sleep(0.01)
        kube.gate.set()
        await asyncio.wait_for(hand_over, 5)
        assert [p for p in kube.paths("POST") if p.endswith("/binding")] == ["/api/v1/namespaces/ns/pods/p0/binding"]
        assert sorted(outcomes) == [("p0", "bound"), ("p1", "fenced"), ("p2", "fenced")]
        assert kube.objects[LEASE]["spec"]["holderIdentity"] == ""
        assert saved == [True]
        # the Lease was emptied after p0's Binding was sent
        calls = [(c.method, c.path) for c in kube.calls]
        assert calls.index(("POST", "/api/v1/namespaces/ns/pods/p0/binding")) < len(calls) - 1 - calls[::-1].index(
            ("PUT", LEASE))

    asyncio.run(main())


def test_a_collection_the_cluster_does_not_serve_is_not_listed_again_and_again() -> None:
    async def main() -> None:
        sched = _standby()
        relists = _Relists(sched, listed_at=time.time() - 600)
        unserved = next(r for r in sched.reflectors if r.name.startswith("podgroups."))

        async def nothing_to_list() -> None:  # as Reflector.relist for a collection not served
            relists.names.append(unserved.name)

        unserved.relist = nothing_to_list  # type: ignore[method-assign]
        until = time.time() - 5
        await sched._list_written_before(until, "before leading")
        assert unserved.name in relists.names
        relists.names.clear()
        await sched._list_written_before(until, "before leading")
        assert relists.names == []

    asyncio.run(main())


class _Apiserver(FakeKube):
    """Answers a consistent read of one item with the collection's resourceVersion now,
    and a watch with ``events`` (then it ends, as a watch's timeout does)."""

    def __init__(self, now_rv: str, events: list[tuple[str, dict[str, object]]]) -> None:
        super().__init__()
        self.now_rv = now_rv
        self.events = events

    async def request(self, method: str, path: str, *, params: object = None, body: object = None,
                      timeout: float = 60.0) -> object:
        await self._call(method, path, body)
        return {"metadata": {"resourceVersion": self.now_rv}, "items": []}

    async def watch(  # type: ignore[override]
        self, path: str, resource_version: str, *, timeout_seconds: int = 300, **params: str | int,
    ) -> AsyncIterator[tuple[str, dict[str, object]]]:
        await self._call("WATCH", path)
        for event in self.events:
            yield event


def _rv(kind: str, rv: int) -> tuple[str, dict[str, object]]:
    return kind, {"metadata": {"resourceVersion": str(rv)}}


@pytest.mark.parametrize(("events", "mirror_reaches", "listed"), [
    # nothing changed since the mirror's resourceVersion: the bookmark says so
    ([_rv("BOOKMARK", 120)], None, False),
    # a Binding the mirror had not applied yet: shown current once its own watch applied it
    ([_rv("MODIFIED", 95), _rv("BOOKMARK", 120)], 95, False),
    # the reflector's watch never applies it: listed
    ([_rv("MODIFIED", 95), _rv("BOOKMARK", 120)], None, True),
    # the watch ends before reaching the resourceVersion read: listed
    ([_rv("MODIFIED", 95)], 95, True),
])
def test_a_collection_shown_current_by_its_watch_is_not_listed_again(
    events: list[tuple[str, dict[str, object]]], mirror_reaches: int | None, listed: bool,
) -> None:
    async def main() -> None:
        kube = _Apiserver("100", events)
        sched = Scheduler(kube, parse_config({"leaderElection": {"enabled": True}}), identity="standby")
        relists = _Relists(sched, listed_at=time.time() - 600)
        pods = next(r for r in sched.reflectors if r.name == "pods")
        pods.resource_version = "90"
        if mirror_reaches is not None:
            async def own_watch_applies() -> None:
                await asyncio.sleep(0.05)
                pods.resource_version = str(mirror_reaches)

            asyncio.get_running_loop().create_task(own_watch_applies())
        assert await sched._watch_shows_current(pods) is not listed
        await sched._list_written_before(time.time() - 5, "before leading")
        assert ("pods" in relists.names) is listed

    asyncio.run(main())
