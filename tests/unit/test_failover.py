"""Failover: a standby takes over from a leader that stopped as soon as the rules allow,
not a retry period later, and a new leader's first step does not wait on reading again
what its watches already hold."""

from __future__ import annotations

import asyncio
import time

from batchsched.kube.fake import FakeKube
from batchsched.kube.leader import LeaderElector, micro_time

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
