"""Telling a large backlog why it waits: the first step after a restart tells every waiting
pod at once. The status writer takes the burst without queueing it whole: each pod gets
its condition and its Event once, none is dropped for a full queue, a pod bound before its
turn is never told, and a pod told twice before its turn gets only the latest word."""

from __future__ import annotations

import asyncio
import time

from batchsched.kube.fake import FakeKube
from batchsched.kube.status import ObjectRef, StatusWriter
from tests.unit.test_kube_writers import with_task


def ref(i: int) -> ObjectRef:
    return ObjectRef(kind="Pod", api_version="v1", namespace="ns", name=f"p{i}", uid=f"u{i}")


def test_a_burst_is_told_whole_each_pod_once_with_no_event_dropped() -> None:
    async def main() -> None:
        kube = FakeKube()
        writer = StatusWriter(kube, instance="test-0", clock=lambda: 0.0, max_queue=200)
        pods = 3_000
        t = time.perf_counter()
        for i in range(pods):
            writer.pod_unschedulable(ref(i), "0/8 nodes fit: 8 insufficient nvidia.com/gpu.")
        took = time.perf_counter() - t
        assert writer.owed > pods // 2  # most of the burst waits its turn
        writer.pod_unschedulable(ref(2907), "waiting behind default/big")  # told again before its turn
        writer.pod_scheduled(ref(2909), "n1")  # bound before its turn
        writer.forget("u2911")  # gone before its turn

        async def body() -> None:
            assert await writer.drain(30.0)

        await with_task(writer.run(), body)
        print(f"{pods} pods told in {took * 1e3:.0f} ms")
        conditions = {c.path.split("/")[6]: c.body["status"]["conditions"][0]["message"]
                      for c in kube.calls if c.method == "PATCH"}
        events = [c.body for c in kube.calls if c.method == "POST" and c.body.get("reason") == "FailedScheduling"]
        told = {e["involvedObject"]["name"] for e in events}
        expected = {f"p{i}" for i in range(pods)} - {"p2909", "p2911"}
        assert set(conditions) == expected == told
        assert len(events) == len(expected)  # once each
        assert conditions["p2907"] == "waiting behind default/big"
        assert [e["message"] for e in events if e["involvedObject"]["name"] == "p2907"] == ["waiting behind default/big"]
        assert writer.dropped == 0 and writer.owed == 0

    asyncio.run(main())


def test_a_few_pods_are_queued_at_once_as_before() -> None:
    kube = FakeKube()
    writer = StatusWriter(kube, instance="test-0", clock=lambda: 0.0)
    for i in range(50):
        writer.pod_unschedulable(ref(i), "no room")
    assert writer.owed == 0 and writer.pending == 100  # 50 conditions and 50 Events, queued


def test_events_dropped_on_a_full_queue_are_counted_and_logged_once_not_once_each(caplog) -> None:  # type: ignore[no-untyped-def]
    # a burst of Bindings after a restart: thousands of Scheduled Events beyond the queue
    kube = FakeKube()
    writer = StatusWriter(kube, instance="test-0", clock=lambda: 0.0, max_queue=100)
    with caplog.at_level("WARNING", logger="batchsched.status"):
        for i in range(2_000):
            writer.event(ref(i), type="Normal", reason="Scheduled", message=f"bound to n{i % 8}")
    assert writer.pending == 100 and writer.dropped == 1_900
    lines = [r.getMessage() for r in caplog.records if r.name == "batchsched.status"]
    assert len(lines) == 1, lines[:3]
    assert "dropped 1 Events" in lines[0] and "status queue full (100 writes)" in lines[0]
