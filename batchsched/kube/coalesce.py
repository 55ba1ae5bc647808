"""Latest-wins writes per key, off the hot path: what the three status writers share.

The scheduling loop says what it wants an object to show and must never wait on the API
server; a value that changes ten times while one write is in flight should cost two
writes, not eleven. So a :class:`CoalescingWriter` keeps, per key:

- the latest value not yet written: a newer one replaces it (latest wins);
- at most one write in flight, so an older value can never land after a newer one;
- the value last written or queued, so asking for it again costs nothing (:meth:`offer`);
  a write that did not land is forgotten there, so the next identical offer tries again;
- a value whose write was put off (:class:`WriteLater`: the replica may not write now, or
  the server kept failing), tried again after a growing delay until it lands, a newer value
  replaces it or the key is forgotten. Whoever decided it will not ask again: nothing about
  the object changed, so without this it would show the old value until something did.

A fixed number of workers (the write budget) write in :meth:`run` until cancelled;
:meth:`drain` waits for everything queued and in flight, for a graceful shutdown. The
writer knows nothing of Kubernetes: ``write(key, value)`` makes the request (under
:mod:`batchsched.kube.retry`) and says whether it landed.

:class:`Transitions` remembers since when each condition has held, for the
``lastTransitionTime`` the writers put on conditions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["CoalescingWriter", "Transitions", "WriteLater"]

log = logging.getLogger("batchsched.coalesce")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


#: the delay before a put-off write is tried again, doubled each time up to the cap
LATER_FIRST_SECONDS = 1.0
LATER_CAP_SECONDS = 30.0


class WriteLater(Exception):
    """Raised by a write that was not made now but should be: the value is kept and tried
    again later (see the module docstring)."""


class CoalescingWriter(Generic[K, V]):
    """Write the latest value per key with ``concurrency`` workers, one write per key at a time.

    ``written`` counts writes that landed, ``dropped`` those that did not (or raised),
    ``put_off`` those kept for a later try (:class:`WriteLater`).
    """

    def __init__(
        self, *, write: Callable[[K, V], Awaitable[bool]], concurrency: int, name: str
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.name = name
        self.concurrency = concurrency
        self._write = write
        self._ready: asyncio.Queue[K] = asyncio.Queue()  # keys to look at; stale ones skipped
        self._waiting: dict[K, V] = {}
        self._busy: set[K] = set()
        self._last: dict[K, V] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        #: keys whose value waits for a later try: how many tries were put off in a row, and
        #: the value
        self._later: dict[K, tuple[int, V]] = {}
        self.written = 0
        self.dropped = 0
        self.put_off = 0

    @property
    def queued(self) -> int:
        """Values waiting for a worker."""
        return len(self._waiting)

    @property
    def in_flight(self) -> int:
        return len(self._busy)

    @property
    def pending(self) -> int:
        """Values queued or being written."""
        return len(self._waiting) + len(self._busy)

    @property
    def waiting_later(self) -> int:
        """Values put off, waiting for their next try."""
        return len(self._later)

    def put(self, key: K, value: V) -> None:
        """Queue ``value`` for ``key``, replacing one still waiting. Never blocks."""
        fresh = key not in self._waiting
        self._waiting[key] = value
        self._idle.clear()
        if fresh and key not in self._busy:
            self._ready.put_nowait(key)

    def offer(self, key: K, value: V, *, shown: V | None = None) -> bool:
        """Queue ``value`` unless it is the one last written or queued for ``key`` (or, when
        nothing is remembered, ``shown``: what the object already shows). True if queued."""
        if self._last.get(key, shown) == value:
            return False
        self._last[key] = value
        self.put(key, value)
        return True

    def forget(self, key: K) -> None:
        """Drop the value waiting for ``key`` and what was last written; a write already in
        flight finishes."""
        self._waiting.pop(key, None)
        self._last.pop(key, None)
        self._later.pop(key, None)
        self._settle()

    async def run(self) -> None:
        """Write until cancelled."""
        async with asyncio.TaskGroup() as group:
            for i in range(self.concurrency):
                group.create_task(self._worker(), name=f"{self.name}-{i}")

    async def drain(self, timeout: float) -> bool:
        """Wait until nothing is queued or in flight; False if something still was at the
        timeout (or no :meth:`run` is writing)."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def _worker(self) -> None:
        while True:
            key = await self._ready.get()
            if key in self._busy or key not in self._waiting:
                continue  # forgotten, or the write in flight re-queues the key when done
            value = self._waiting.pop(key)
            self._busy.add(key)
            landed, later = False, False
            try:
                landed = await self._write(key, value)
            except WriteLater:
                later = True
            except Exception:  # a bug in one write must not stop the others
                log.exception("%s: write of %r failed", self.name, key)
            finally:
                self._busy.discard(key)
                if key in self._waiting:
                    self._ready.put_nowait(key)
                self._settle()
            if landed:
                self.written += 1
                self._later.pop(key, None)
            elif later:
                self.put_off += 1
                self._try_later(key, value)
            else:
                self.dropped += 1
                self._later.pop(key, None)
                if self._last.get(key) == value:
                    del self._last[key]

    def _try_later(self, key: K, value: V) -> None:
        """Put ``value`` back after a growing delay, unless a newer value replaced it or
        the key was forgotten meanwhile."""
        if key in self._waiting:
            self._later.pop(key, None)  # a newer value is on its way
            return
        tries = self._later[key][0] if key in self._later else 0
        self._later[key] = (tries + 1, value)
        delay = min(LATER_CAP_SECONDS, LATER_FIRST_SECONDS * 2 ** min(tries, 16))

        def again() -> None:
            entry = self._later.get(key)
            if entry is not None and entry[1] is value and key not in self._waiting and key not in self._busy:
                self.put(key, value)

        asyncio.get_running_loop().call_later(delay, again)

    def _settle(self) -> None:
        if not self._waiting and not self._busy:
            self._idle.set()


class Transitions(Generic[K]):
    """Since when each condition of each key has held its state.

    :meth:`since` returns the clock time of the last change of ``state`` for that key and
    condition: the same time while the state holds, a new one when it changes.
    """

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._seen: dict[K, dict[str, tuple[Hashable, float]]] = {}

    def since(self, key: K, state: Hashable, *, condition: str = "") -> float:
        conditions = self._seen.setdefault(key, {})
        seen = conditions.get(condition)
        if seen is None or seen[0] != state:
            seen = (state, self._clock())
            conditions[condition] = seen
        return seen[1]

    def forget(self, key: K) -> None:
        self._seen.pop(key, None)
