"""The views the endpoints serve, answered from the live session (:mod:`batchsched.insight`).

The views are read in the event loop, between steps (they read the session as it stands).
A start estimate runs a copy of the session forward: the copy is made in the loop, the run
goes to a worker thread, so scheduling goes on meanwhile; one run at a time. Its estimates
serve every caller; once older than ``estimate_ttl`` seconds a new run starts and callers
get the last estimates meanwhile, except one asking about a job the last run did not know,
who waits for a run that does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from batchsched.insight.explain import Insight
from batchsched.metrics import Metrics

__all__ = ["SessionViews"]


class SessionViews:
    """:class:`~batchsched.kube.endpoints.Views` over an :class:`Insight`."""

    def __init__(self, insight: Insight, metrics: Metrics, *, budget: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.insight = insight
        #: seconds a forward run may take (it shares the process with scheduling)
        self.budget = budget
        self.metrics = metrics
        self._clock = clock
        self._running: asyncio.Task[None] | None = None

    async def fresh(self, *, wait: bool) -> None:
        """Start a new estimate when the last is older than the ttl; with ``wait``, or when
        there is none yet, wait for it (otherwise callers are answered with the last one)."""
        now = self._clock()
        if self.insight.stale(now) and (self._running is None or self._running.done()):
            self._running = asyncio.get_running_loop().create_task(self._estimate(), name="estimate")
        if self._running is not None and not self._running.done() and (wait or self.insight.estimated_at < 0):
            await asyncio.shield(self._running)

    async def _estimate(self) -> None:
        now = self._clock()
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.budget
        run = self.insight.forward(now, keep_going=lambda: time.monotonic() < deadline)
        estimates = await asyncio.to_thread(run)
        self.metrics.estimate_duration.observe(time.perf_counter() - t0)
        self.insight.keep(estimates, now)

    async def queues(self) -> dict[str, Any]:
        return self.insight.queues(self._clock())

    async def jobs(self, *, queue: str | None, namespace: str | None) -> dict[str, Any]:
        await self.fresh(wait=False)
        return self.insight.jobs(self._clock(), queue=queue, namespace=namespace)

    async def nodes(self) -> dict[str, Any]:
        return self.insight.nodes(self._clock())

    async def explain(self, *, kind: str, name: str, namespace: str, api: str = "") -> dict[str, Any]:
        await self.fresh(wait=False)
        answer = self.insight.explain(self._clock(), kind=kind, name=name, namespace=namespace, api=api)
        job = answer.get("job")
        if job is not None and job["state"] != "running" and job["key"] not in self.insight.estimates:
            # a job the last estimate did not know yet: a run in progress may; else a new one
            if self._running is not None and not self._running.done():
                await asyncio.shield(self._running)
            if job["key"] not in self.insight.estimates:
                self.insight.expire()
                await self.fresh(wait=True)
            answer = self.insight.explain(self._clock(), kind=kind, name=name, namespace=namespace, api=api)
        return answer

    def started(self, unit: str, now: float) -> None:
        """A unit's first member was bound: judge its first estimate."""
        err = self.insight.started(unit, now)
        if err is not None:
            self.metrics.estimate_error.observe(err.seconds)
            self.metrics.estimate_relative_error.observe(err.relative)
