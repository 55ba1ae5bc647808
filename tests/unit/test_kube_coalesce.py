"""CoalescingWriter on its own: latest wins, one write in flight per key, bounded
concurrency, forget, drain. No server, no sleeps: writes wait on events the test sets."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from batchsched.kube import coalesce
from batchsched.kube.coalesce import CoalescingWriter, Transitions, WriteLater


class Recorder:
    """A write function that records (key, value) and waits on ``gate`` while it is unset."""

    def __init__(self, *, gated: bool = False, landed: bool = True) -> None:
        self.writes: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()
        self.landed = landed
        self.active: Counter[str] = Counter()
        self.peak_per_key = 0
        self.peak_total = 0

    async def __call__(self, key: str, value: int) -> bool:
        self.writes.append((key, value))
        self.active[key] += 1
        self.peak_per_key = max(self.peak_per_key, self.active[key])
        self.peak_total = max(self.peak_total, self.active.total())
        try:
            await self.gate.wait()
        finally:
            self.active[key] -= 1
        return self.landed


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def running(
    body: Callable[[CoalescingWriter[str, int], Recorder], Awaitable[None]],
    *,
    recorder: Recorder | None = None,
    concurrency: int = 4,
) -> None:
    """Run ``body`` with a writer whose workers run beside it."""

    async def main() -> None:
        rec = recorder or Recorder()
        writer: CoalescingWriter[str, int] = CoalescingWriter(
            write=rec, concurrency=concurrency, name="test"
        )
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            await body(writer, rec)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_three_updates_while_one_is_in_flight_make_exactly_two_writes_the_last_the_latest() -> None:
    async def body(writer: CoalescingWriter[str, int], rec: Recorder) -> None:
        writer.put("k", 1)
        await turns()
        assert rec.writes == [("k", 1)]  # in flight, held at the gate
        for value in (2, 3, 4):
            writer.put("k", value)
        await turns()
        assert rec.writes == [("k", 1)]  # the second waits for the first
        assert (writer.in_flight, writer.queued) == (1, 1)
        rec.gate.set()
        assert await writer.drain(1.0)
        assert rec.writes == [("k", 1), ("k", 4)]
        assert (writer.written, writer.dropped) == (2, 0)

    running(body, recorder=Recorder(gated=True))


def test_one_write_in_flight_per_key_and_no_more_than_the_budget_overall() -> None:
    async def body(writer: CoalescingWriter[str, int], rec: Recorder) -> None:
        for round_ in range(5):
            for key in "abcdefgh":
                writer.put(key, round_)
            await turns(3)
        await turns()
        assert rec.peak_total == 3  # the budget is full, the rest wait
        rec.gate.set()
        assert await writer.drain(1.0)
        assert rec.peak_per_key == 1
        latest = {key: value for key, value in rec.writes}
        assert latest == dict.fromkeys("abcdefgh", 4)

    running(body, recorder=Recorder(gated=True), concurrency=3)


def test_drain_waits_for_writes_in_flight_and_queued() -> None:
    async def body(writer: CoalescingWriter[str, int], rec: Recorder) -> None:
        writer.put("a", 1)
        writer.put("b", 1)
        drained = asyncio.get_running_loop().create_task(writer.drain(1.0))
        await turns()
        assert not drained.done()
        rec.gate.set()
        assert await drained
        assert sorted(rec.writes) == [("a", 1), ("b", 1)]
        assert writer.pending == 0

    running(body, recorder=Recorder(gated=True), concurrency=1)


def test_drain_returns_false_at_the_timeout() -> None:
    async def body(writer: CoalescingWriter[str, int], rec: Recorder) -> None:
        writer.put("a", 1)
        assert not await writer.drain(0.01)
        assert writer.pending == 1

    running(body, recorder=Recorder(gated=True))


def test_drain_of_nothing_returns_at_once() -> None:
    async def main() -> None:
        writer: CoalescingWriter[str, int] = CoalescingWriter(
            write=Recorder(), concurrency=1, name="test"
        )
        assert await writer.drain(0.01)

    asyncio.run(main())


def test_forget_drops_the_waiting_write_not_the_one_in_flight() -> None:
    async def body(writer: CoalescingWriter[str, int], rec: Recorder) -> None:
        writer.put("k", 1)
        await turns()
        writer.put("k", 2)
        writer.put("other", 1)
        writer.forget("k")
        rec.gate.set()
        assert await writer.drain(1.0)
        assert sorted(rec.writes) == [("k", 1), ("other", 1)]

    running(body, recorder=Recorder(gated=True))


def test_forget_before_any_worker_runs_writes_nothing_and_the_key_can_come_back() -> None:
    async def body(writer: CoalescingWriter[str, int], rec: Recorder) -> None:
        assert await writer.drain(1.0)
        assert rec.writes == [("k", 3)]

    async def main() -> None:
        rec = Recorder()
        writer: CoalescingWriter[str, int] = CoalescingWriter(write=rec, concurrency=2, name="t")
        writer.put("k", 1)
        writer.forget("k")
        assert writer.pending == 0
        writer.put("k", 3)  # a stale token of the forgotten value must not write twice
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            await body(writer, rec)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_offer_skips_the_value_last_written_or_shown_and_retries_one_that_did_not_land() -> None:
    async def body(writer: CoalescingWriter[str, int], rec: Recorder) -> None:
        assert writer.offer("k", 1)
        assert not writer.offer("k", 1)
        assert not writer.offer("shown", 5, shown=5)  # the object already shows it
        assert await writer.drain(1.0)
        assert rec.writes == [("k", 1)]
        rec.landed = False
        assert writer.offer("k", 2)
        assert await writer.drain(1.0)
        assert writer.dropped == 1
        assert writer.offer("k", 2)  # not written: the same value is tried again
        rec.landed = True
        assert await writer.drain(1.0)
        assert rec.writes == [("k", 1), ("k", 2), ("k", 2)]
        writer.forget("k")
        assert writer.offer("k", 2)  # forgotten: written again

    running(body)


def test_a_write_that_raises_is_dropped_and_the_workers_go_on() -> None:
    async def main() -> None:
        seen: list[str] = []

        async def write(key: str, value: int) -> bool:
            seen.append(key)
            if key == "bad":
                raise RuntimeError("a bug in one write")
            return True

        writer: CoalescingWriter[str, int] = CoalescingWriter(write=write, concurrency=1, name="t")
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            writer.put("bad", 1)
            writer.put("good", 1)
            assert await writer.drain(1.0)
            assert seen == ["bad", "good"]
            assert (writer.written, writer.dropped) == (1, 1)
            assert not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


class Fenced:
    """A write function whose writes are put off (:class:`WriteLater`) while ``closed``."""

    def __init__(self) -> None:
        self.closed = True
        self.tries: list[tuple[str, int]] = []
        self.landed: list[tuple[str, int]] = []

    async def __call__(self, key: str, value: int) -> bool:
        self.tries.append((key, value))
        if self.closed:
            raise WriteLater("not now")
        self.landed.append((key, value))
        return True


def put_off_writer(monkeypatch: pytest.MonkeyPatch) -> tuple[CoalescingWriter[str, int], Fenced]:
    monkeypatch.setattr(coalesce, "LATER_FIRST_SECONDS", 0.01)
    monkeypatch.setattr(coalesce, "LATER_CAP_SECONDS", 0.04)
    write = Fenced()
    return CoalescingWriter(write=write, concurrency=2, name="t"), write


async def until(check: Callable[[], bool], seconds: float = 2.0) -> None:
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.005)


def test_a_write_put_off_is_tried_again_until_it_lands_without_being_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, write = put_off_writer(monkeypatch)

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            assert writer.offer("k", 1)
            await until(lambda: len(write.tries) >= 3)  # tried again and again, never asked
            assert not write.landed and writer.waiting_later == 1 and writer.dropped == 0
            assert not writer.offer("k", 1)  # asking again costs nothing: it is on its way
            write.closed = False
            await until(lambda: bool(write.landed))
            assert write.landed == [("k", 1)] and writer.written == 1
            assert writer.waiting_later == 0
            assert not writer.offer("k", 1)  # written: nothing to do
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_a_newer_value_or_a_forget_replaces_a_write_put_off(monkeypatch: pytest.MonkeyPatch) -> None:
    writer, write = put_off_writer(monkeypatch)

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            writer.offer("newer", 1)
            writer.offer("gone", 1)
            await until(lambda: writer.waiting_later == 2)
            writer.offer("newer", 2)
            writer.forget("gone")
            await until(lambda: ("newer", 2) in write.tries)
            write.closed = False
            await until(lambda: bool(write.landed))
            await asyncio.sleep(0.15)  # past every delay: a stale try would have come
            assert write.landed == [("newer", 2)]
            assert writer.waiting_later == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        CoalescingWriter(write=Recorder(), concurrency=0, name="t")


def test_transitions_keep_their_time_while_the_state_holds() -> None:
    now = [100.0]
    seen: Transitions[str] = Transitions(clock=lambda: now[0])
    assert seen.since("q", ("True", "Ready"), condition="Active") == 100.0
    now[0] = 200.0
    assert seen.since("q", ("True", "Ready"), condition="Active") == 100.0
    assert seen.since("q", ("False", "Ready"), condition="Other") == 200.0  # its own condition
    assert seen.since("q", ("False", "Stopped"), condition="Active") == 200.0
    now[0] = 300.0
    seen.forget("q")
    assert seen.since("q", ("False", "Stopped"), condition="Active") == 300.0
