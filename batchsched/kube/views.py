"""The views the endpoints serve, answered from the live session (:mod:`batchsched.insight`).

The views are read in the event loop, between steps (they read the session as it stands).
A start estimate runs a copy of the session forward: the copy is made in the loop, the run
goes to a worker thread, so scheduling goes on meanwhile; one run at a time, and its
estimates are kept for ``estimate_ttl`` seconds for every caller.
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

    def __init__(self, insight: Insight, metrics: Metrics, *, clock: Callable[[], float] = time.time) -> None:
        self.insight = insight
        self.metrics = metrics
        self._clock = clock
        self._lock = asyncio.Lock()

    async def fresh(self) -> None:
        """Estimates no older than the ttl (one forward run at a time)."""
        async with self._lock:
            now = self._clock()
            if not self.insight.stale(now):
                return
            run = self.insight.forward(now)
            t0 = time.perf_counter()
            estimates = await asyncio.to_thread(run)
            self.metrics.estimate_duration.observe(time.perf_counter() - t0)
            self.insight.keep(estimates, now)

    async def queues(self) -> dict[str, Any]:
        return self.insight.queues(self._clock())

    async def jobs(self, *, queue: str | None, namespace: str | None) -> dict[str, Any]:
        await self.fresh()
        return self.insight.jobs(self._clock(), queue=queue, namespace=namespace)

    async def nodes(self) -> dict[str, Any]:
        return self.insight.nodes(self._clock())

    async def explain(self, *, kind: str, name: str, namespace: str) -> dict[str, Any]:
        await self.fresh()
        return self.insight.explain(self._clock(), kind=kind, name=name, namespace=namespace)

    def started(self, unit: str, now: float) -> None:
        """A unit's first member was bound: judge its first estimate."""
        err = self.insight.started(unit, now)
        if err is not None:
            self.metrics.estimate_error.observe(err.seconds)
            self.metrics.estimate_relative_error.observe(err.relative)
