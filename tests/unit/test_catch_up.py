"""A new leader reads the cluster again before its first step when its mirror may predate
writes its predecessor made: the collections it last listed before the previous holder's
lease could have lapsed are listed again (the watch in progress restarted from the list)."""

from __future__ import annotations

import asyncio

from batchsched.kube.errors import NotFoundError
from batchsched.kube.fake import FakeKube
from batchsched.kube.leader import LeaderElector, micro_time
from batchsched.kube.watch import Reflector
from tests.unit.test_kube_writers import with_task

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"


def test_a_relist_asked_while_watching_lists_again_and_returns_once_applied() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.objects["/api/v1/pods/p1"] = {"metadata": {"name": "p1"}}
        listed: list[list[str]] = []
        reflector = Reflector(
            kube, "/api/v1/pods",
            on_list=lambda items: listed.append(sorted(o["metadata"]["name"] for o in items)),
            on_event=lambda kind, obj: None,
        )

        async def body() -> None:
            await asyncio.wait_for(reflector.synced.wait(), 1.0)
            first = reflector.listed_at
            kube.objects["/api/v1/pods/p2"] = {"metadata": {"name": "p2"}}  # the watch never tells
            await asyncio.wait_for(reflector.relist(), 1.0)
            assert listed == [["p1"], ["p1", "p2"]]
            assert reflector.listed_at >= first
            for _ in range(5):
                await asyncio.sleep(0)
            # and it watches again from the new list
            assert [c.method for c in kube.calls] == ["LIST", "WATCH", "LIST", "WATCH"]

        await with_task(reflector.run(), body)

    asyncio.run(main())


def test_taking_over_a_lease_tells_until_when_its_previous_holder_could_have_written() -> None:
    async def main() -> None:
        now = 1_800_000_100.0
        kube = FakeKube()
        kube.objects[LEASE] = {"metadata": {"name": "l"}, "spec": {
            "holderIdentity": "old", "leaseDurationSeconds": 15, "renewTime": micro_time(now - 20.0)}}
        elector = LeaderElector(client=kube, namespace="ns", name="l", identity="new", clock=lambda: now)
        assert await elector._try_acquire_or_renew()
        assert abs(elector.predecessor_until - (now - 5.0)) < 1e-3

        fresh = LeaderElector(client=FakeKube(), namespace="ns", name="l", identity="first", clock=lambda: now)
        assert await fresh._try_acquire_or_renew()  # no Lease yet: nobody wrote before it
        assert fresh.predecessor_until == 0.0

    asyncio.run(main())


def test_a_relist_of_a_collection_the_cluster_does_not_serve_returns() -> None:
    async def main() -> None:
        kube = FakeKube()
        kube.fail["LIST /apis/scheduling.volcano.sh/v1beta1/podgroups"] = [NotFoundError(404, "NotFound", "")] * 10
        reflector = Reflector(kube, "/apis/scheduling.volcano.sh/v1beta1/podgroups",
                              on_list=lambda items: None, on_event=lambda kind, obj: None)
        # (it looks again at a collection not served every 30 s, on the real clock)

        async def body() -> None:
            await asyncio.wait_for(reflector.synced.wait(), 1.0)
            await asyncio.wait_for(reflector.relist(), 1.0)  # nothing to list: it does not wait for ever

        await with_task(reflector.run(), body)

    asyncio.run(main())
