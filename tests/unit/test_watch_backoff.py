"""A watch's retry back-off grows with failures in a row, but a watch that had been running
fine when it was cut starts again from the first back-off: after an apiserver's bad minute,
a later cut must not leave the mirror stale for the grown back-off. However long the
apiserver is away, the pause between tries stays short (:data:`WATCH_RETRY_CAP`)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

from batchsched.kube.errors import TemporaryError
from batchsched.kube.fake import FakeKube, FakeSleep
from batchsched.kube.retry import WATCH_RETRY_CAP, watches
from batchsched.kube.watch import HEALTHY_WATCH_SECONDS, Reflector
from tests.unit.test_kube_writers import with_task


def _delays(watch_runs_for: float) -> list[float]:
    async def main() -> list[float]:
        kube = FakeKube()
        kube.fail["WATCH /api/v1/pods"] = [TemporaryError(500, "InternalError", "cut") for _ in range(4)]
        reflector = Reflector(kube, "/api/v1/pods", on_list=lambda items: None, on_event=lambda kind, obj: None)
        sleep = FakeSleep()
        reflector.retry = dataclasses.replace(reflector.retry, sleep=sleep, draw=lambda: 0.0)
        ticks = itertools.count()
        # each read of the clock is ``watch_runs_for`` later: every watch ran that long
        reflector._clock = lambda: next(ticks) * watch_runs_for

        async def body() -> None:
            for _ in range(100):
                if len(sleep.delays) >= 4:
                    return
                await asyncio.sleep(0)

        await with_task(reflector.run(), body)
        return sleep.delays

    return asyncio.run(main())


def test_failures_in_a_row_back_off_further() -> None:
    delays = _delays(0.0)
    assert delays == sorted(delays) and delays[-1] > delays[0]


def test_a_watch_cut_after_running_a_while_retries_at_the_first_back_off() -> None:
    delays = _delays(HEALTHY_WATCH_SECONDS)
    assert len(delays) == 4 and len(set(delays)) == 1
    assert delays[0] == _delays(0.0)[0]


def test_however_long_the_apiserver_is_away_a_watch_tries_again_within_seconds() -> None:
    policy = watches()
    assert WATCH_RETRY_CAP <= 5.0
    assert max(policy.backoff.delay(attempt, draw=0.999) for attempt in range(40)) <= WATCH_RETRY_CAP
