"""Requests in flight as background tasks, counted, drained on shutdown, then cancelled.

The binder and the evictor each start one task per request and must be able to wait for
all of them before the process exits, and to end those still running after that wait
before the client they use is closed; this is that bookkeeping, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class TaskSet:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Wait for every task; False if some were still running at the timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def cancel(self) -> None:
        """End every task still running and wait until each has (each request's outcome is
        then unknown: whoever leads next reads the truth from its watches)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
