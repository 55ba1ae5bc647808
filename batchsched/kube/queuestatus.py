"""Queue status: what users read of a queue (nominal, used, borrowed, lent, pending, admitted,
conditions), coalesced like PodGroup status (:mod:`batchsched.kube.groupstatus`).

The loop computes each Queue's desired ``status`` (:meth:`QueueTree.status
<batchsched.core.queues.QueueTree.status>`, without condition times) and calls
:meth:`QueueStatusWriter.update`, which never blocks:

- nothing is written when the status equals the one last written or queued;
- at most one write per queue is in flight; a newer status replaces one still waiting;
- a condition keeps its ``lastTransitionTime`` while its status and reason stay.

Where: ``/apis/batchsched.io/v1alpha1/queues/{name}/status`` as a JSON merge patch;
resources that left a map since the last write are removed with explicit nulls. A queue
that is gone (404) drops its write; temporary errors are retried a few times; nothing here
raises into the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from batchsched.kube.client import JSON, KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError
from batchsched.kube.status import MESSAGE_LIMIT, rfc3339

__all__ = ["QUEUES_PATH", "QueueStatusWriter"]

log = logging.getLogger("batchsched.queuestatus")

QUEUES_PATH = "/apis/batchsched.io/v1alpha1/queues"
_RETRIES = 3
_BACKOFF = 0.5
_MAPS = ("nominal", "used", "borrowed", "lent")


class QueueStatusWriter:
    """Queue statuses to write; :meth:`run` writes them with ``concurrency`` workers."""

    def __init__(
        self,
        client: KubeClient,
        *,
        concurrency: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.concurrency = concurrency
        self._clock = clock
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._waiting: dict[str, JSON] = {}
        self._busy: set[str] = set()
        #: name -> the status last written or queued (without times)
        self._last: dict[str, JSON] = {}
        #: name -> the status the server holds, as far as we know (for removals)
        self._written: dict[str, JSON] = {}
        #: (name, condition type) -> ((status, reason), when it last changed)
        self._transition: dict[tuple[str, str], tuple[tuple[str, str], str]] = {}
        self.written = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        return len(self._waiting) + len(self._busy)

    def update(self, name: str, status: Mapping[str, Any]) -> None:
        """Ask for ``status`` on queue ``name``; a no-op when that is what it has or will have."""
        status = dict(status)
        if self._last.get(name) == status:
            return
        self._last[name] = status
        queued = name in self._waiting
        self._waiting[name] = status
        if not queued and name not in self._busy:
            self._queue.put_nowait(name)

    def forget(self, name: str) -> None:
        """The queue was deleted: drop what is remembered about it."""
        self._last.pop(name, None)
        self._waiting.pop(name, None)
        self._written.pop(name, None)
        for key in [k for k in self._transition if k[0] == name]:
            del self._transition[key]

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for i in range(self.concurrency):
                group.create_task(self._worker(), name=f"queue-status-{i}")

    async def drain(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._queue.join()

    async def _worker(self) -> None:
        while True:
            name = await self._queue.get()
            try:
                await self._write(name)
            except Exception:  # a bug here must not stop the other writes
                self.dropped += 1
                log.exception("queue status write failed")
            finally:
                self._queue.task_done()

    def body(self, name: str, status: Mapping[str, Any]) -> JSON:
        """The merge patch for ``status``: condition times added, vanished resources nulled."""
        out: JSON = dict(status)
        conditions = []
        for c in status.get("conditions") or []:
            ident = (str(c.get("status", "")), str(c.get("reason", "")))
            key = (name, str(c.get("type", "")))
            seen = self._transition.get(key)
            if seen is None or seen[0] != ident:
                seen = (ident, rfc3339(self._clock()))
                self._transition[key] = seen
            conditions.append({**c, "message": str(c.get("message", ""))[:MESSAGE_LIMIT],
                               "lastTransitionTime": seen[1]})
        out["conditions"] = conditions
        before = self._written.get(name) or {}
        for field in _MAPS:
            old = before.get(field) or {}
            new = dict(status.get(field) or {})
            for res in old:
                new.setdefault(res, None)
            if field in status or old:
                out[field] = new
        return {"status": out}

    async def _write(self, name: str) -> None:
        if name in self._busy:
            return  # a stale token: the write in flight re-queues the newest when done
        status = self._waiting.pop(name, None)
        if status is None:
            return
        self._busy.add(name)
        try:
            ok = await self._patch(name, status)
            if ok:
                self._written[name] = status
            elif self._last.get(name) == status:
                self._last.pop(name, None)  # not written: let the next identical update try again
        finally:
            self._busy.discard(name)
            if name in self._waiting:
                self._queue.put_nowait(name)

    async def _patch(self, name: str, status: Mapping[str, Any]) -> bool:
        body = self.body(name, status)
        path = f"{QUEUES_PATH}/{name}/status"
        delay = _BACKOFF
        for attempt in range(_RETRIES + 1):
            try:
                await self.client.patch(path, body)
            except (NotFoundError, ConflictError) as exc:
                log.debug("dropping status of queue %s: %s", name, exc)
                break
            except TemporaryError as exc:
                if attempt == _RETRIES:
                    log.warning("giving up status of queue %s: %s", name, exc)
                    break
                await asyncio.sleep(delay)
                delay *= 2
            except KubeError as exc:
                log.warning("could not write status of queue %s: %s", name, exc)
                break
            else:
                self.written += 1
                return True
        self.dropped += 1
        return False
