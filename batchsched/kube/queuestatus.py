"""Queue status: what users read of a queue (nominal, used, borrowed, lent, unavailable, pending,
admitted, conditions), coalesced like PodGroup status (:mod:`batchsched.kube.groupstatus`).

The loop computes each Queue's desired ``status`` (:meth:`QueueTree.status
<batchsched.core.queues.QueueTree.status>`, without condition times) and calls
:meth:`QueueStatusWriter.update`, which never blocks:

- nothing is written when the status equals the one last written or queued;
- at most one write per queue is in flight; a newer status replaces one still waiting;
- a condition keeps its ``lastTransitionTime`` while its status and reason stay.

Where: ``/apis/batchsched.io/v1alpha1/queues/{name}/status`` as a JSON merge patch;
resources that left a map since the last write are removed with explicit nulls. A queue
that is gone (404) drops its write; temporary errors are retried under
:func:`~batchsched.kube.retry.status_writes`; nothing here raises into the scheduler. The
queue is a :class:`~batchsched.kube.coalesce.CoalescingWriter`. Each attempt first checks
the replica's :class:`~batchsched.kube.leader.Fence`; a write whose fence has passed is
kept unsent and tried again later (it is not asked for again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.coalesce import CoalescingWriter, Transitions, WriteLater
from batchsched.kube.leader import Fence, Fenced
from batchsched.kube.retry import status_writes, try_write
from batchsched.kube.status import MESSAGE_LIMIT, rfc3339

__all__ = ["QUEUES_PATH", "QueueStatusWriter"]

QUEUES_PATH = "/apis/batchsched.io/v1alpha1/queues"
_MAPS = ("nominal", "used", "borrowed", "lent", "unavailable")


class QueueStatusWriter:
    """Queue statuses to write; :meth:`run` writes them with ``concurrency`` workers."""

    def __init__(
        self,
        client: KubeAPI,
        *,
        concurrency: int = 2,
        clock: Callable[[], float] = time.time,
        fence: Fence | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.concurrency = concurrency
        self.fence = fence if fence is not None else Fence.always_open()
        self.retry = status_writes()
        self._writes: CoalescingWriter[str, JSON] = CoalescingWriter(
            write=self._write, concurrency=concurrency, name="queue-status"
        )
        self._transitions: Transitions[str] = Transitions(clock=clock)
        #: name -> the status the server holds, as far as we know (for removals)
        self._written: dict[str, JSON] = {}

    @property
    def pending(self) -> int:
        return self._writes.pending

    @property
    def written(self) -> int:
        return self._writes.written

    @property
    def dropped(self) -> int:
        return self._writes.dropped

    @property
    def put_off(self) -> int:
        """Writes put off (the fence had passed, or temporary errors outlasted the retries)."""
        return self._writes.put_off

    def update(self, name: str, status: Mapping[str, Any]) -> None:
        """Ask for ``status`` on queue ``name``; a no-op when that is what it has or will have."""
        self._writes.offer(name, dict(status))

    def forget(self, name: str) -> None:
        """The queue was deleted: drop what is remembered about it."""
        self._writes.forget(name)
        self._written.pop(name, None)
        self._transitions.forget(name)

    async def run(self) -> None:
        await self._writes.run()

    async def drain(self, timeout: float) -> bool:
        """Wait until nothing is queued or in flight; False if something still was after
        ``timeout`` seconds."""
        return await self._writes.drain(timeout)

    def body(self, name: str, status: Mapping[str, Any]) -> JSON:
        """The merge patch for ``status``: condition times added, vanished resources nulled."""
        out: JSON = dict(status)
        conditions = []
        for c in status.get("conditions") or []:
            state = (str(c.get("status", "")), str(c.get("reason", "")))
            since = self._transitions.since(name, state, condition=str(c.get("type", "")))
            conditions.append({**c, "message": str(c.get("message", ""))[:MESSAGE_LIMIT],
                               "lastTransitionTime": rfc3339(since)})
        out["conditions"] = conditions
        before = self._written.get(name) or {}
        for field in _MAPS:
            old = before.get(field) or {}
            new = dict(status.get(field) or {})
            for res in old:
                new.setdefault(res, None)
            if field in status:
                out[field] = new
            elif old:
                out[field] = None  # a map no longer shown (unavailable, once nothing is)
        return {"status": out}

    async def _write(self, name: str, status: JSON) -> bool:
        body = self.body(name, status)
        path = f"{QUEUES_PATH}/{name}/status"
        what = f"status of queue {name}"
        try:
            landed = await try_write(
                self.retry, self.fence.guard(lambda: self.client.patch(path, body), what=what), what=what
            )
        except Fenced as exc:
            raise WriteLater(str(exc)) from exc
        if landed:
            self._written[name] = status
        return landed
