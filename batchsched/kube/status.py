"""Events and pod conditions: what the user sees of our decisions, written off the hot path.

The scheduling cycle must never wait on the API server to say why a pod is pending, and a
pod that stays unschedulable for an hour must not cost a write per cycle. So the cycle
calls :class:`StatusWriter` methods, which only enqueue; a fixed number of workers
(``concurrency``, the write budget) drain the queue in :meth:`StatusWriter.run`.

Coalescing:

- An unschedulable pod is written (a ``FailedScheduling`` Event and its ``PodScheduled``
  condition) only when its message changes: the last message written or queued is
  remembered per pod UID until the pod is scheduled or forgotten.
- Condition patches are kept per UID, latest wins: a newer message replaces one still
  waiting, and two patches of one pod are never in flight together, so an older message
  cannot land after a newer one.
- Every patch carries the pod's UID as a precondition, so it cannot reach a pod recreated
  under the same name; such a write fails with a conflict and is dropped.

Failures: a pod (or namespace) that is gone - 404, 409 - drops the write; temporary errors
are retried a few times with backoff; anything else is logged and dropped. Nothing here
raises into the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from batchsched.kube.client import JSON, KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError

__all__ = ["ObjectRef", "StatusWriter"]

log = logging.getLogger("batchsched.status")

MESSAGE_LIMIT = 1024
_NAME_LIMIT = 253
_INSTANCE_LIMIT = 128
_RETRIES = 3
_BACKOFF = 0.5  # seconds before the first retry; doubled for each next one
_EVENT_TYPES = ("Normal", "Warning")


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Which object an Event is about (and, for pods, which pod a condition is written to)."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, obj: Mapping[str, Any], *, kind: str = "Pod", api_version: str = "v1") -> ObjectRef:
        """The reference to an object as the API returns it.

        Items of a LIST carry no ``kind``/``apiVersion``; the keyword arguments stand in.
        """
        meta = obj.get("metadata") or {}
        return cls(
            kind=str(obj.get("kind") or kind),
            api_version=str(obj.get("apiVersion") or api_version),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta["name"]),
            uid=str(meta.get("uid") or ""),
        )


def rfc3339(ts: float) -> str:
    """A ``metav1.Time`` string (whole seconds, UTC) for a Unix time."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _EventWrite:
    namespace: str
    body: JSON


@dataclass(slots=True)
class _ConditionWrite:
    ref: ObjectRef
    key: tuple[str, str]  # (reason, message), to tell whether it is still the latest
    patch: JSON


class StatusWriter:
    """Queue Events and pod conditions; :meth:`run` writes them with bounded concurrency.

    ``written`` counts successful writes, ``dropped`` writes given up (the object is gone,
    retries were exhausted, the server refused, or the queue was full), ``pending`` writes
    queued or in flight.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        component: str = "batchsched",
        instance: str,
        concurrency: int = 8,
        max_queue: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.component = component
        self.instance = instance[:_INSTANCE_LIMIT]
        self.concurrency = concurrency
        self.max_queue = max_queue
        self._clock = clock
        # items: an _EventWrite, or a pod UID whose latest condition is in _conditions
        self._queue: asyncio.Queue[_EventWrite | str] = asyncio.Queue()
        self._conditions: dict[str, _ConditionWrite] = {}
        self._busy: set[str] = set()  # UIDs with a condition patch in flight
        self._last: dict[str, tuple[str, str]] = {}  # UID -> (reason, message) written/queued
        self._inflight = 0
        self.written = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        return self._queue.qsize() + self._inflight

    # -- what the scheduler calls (never blocks) ------------------------------------------

    def event(self, ref: ObjectRef, *, type: str, reason: str, message: str) -> None:
        """Queue a core/v1 Event about ``ref``."""
        if type not in _EVENT_TYPES:
            raise ValueError(f"an Event's type is Normal or Warning, not {type!r}")
        if self._queue.qsize() >= self.max_queue:
            self.dropped += 1
            log.warning("status queue full, dropping event %s about %s", reason, ref.name)
            return
        namespace = ref.namespace or "default"
        now = rfc3339(self._clock())
        involved: JSON = {"kind": ref.kind, "apiVersion": ref.api_version, "name": ref.name}
        if ref.namespace:
            involved["namespace"] = ref.namespace
        if ref.uid:
            involved["uid"] = ref.uid
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{ref.name[: _NAME_LIMIT - 17]}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message[:MESSAGE_LIMIT],
            "type": type,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": None,
            "count": 1,
        }
        self._queue.put_nowait(_EventWrite(namespace, body))

    def pod_unschedulable(
        self, ref: ObjectRef, message: str, *, reason: str = "Unschedulable"
    ) -> None:
        """Say why a pod cannot be placed: an Event and its ``PodScheduled=False`` condition.

        Nothing is written when the message (and reason) are those last written or queued
        for this pod.
        """
        key = (reason, message[:MESSAGE_LIMIT])
        if self._last.get(ref.uid) == key:
            return
        self._last[ref.uid] = key
        self.event(ref, type="Warning", reason="FailedScheduling", message=message)
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": key[1],
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(self._clock()),
        }
        patch: JSON = {"metadata": {"uid": ref.uid}, "status": {"conditions": [condition]}}
        waiting = ref.uid in self._conditions
        self._conditions[ref.uid] = _ConditionWrite(ref, key, patch)
        if not waiting and ref.uid not in self._busy:
            self._queue.put_nowait(ref.uid)

    def pod_scheduled(self, ref: ObjectRef, node: str, *, where: str = "") -> None:
        """Record that a pod was bound: a ``Scheduled`` Event (saying the topology domain
        its gang was placed in, ``where``, when there is one); its unschedulable state is
        forgotten (and a condition patch still waiting is dropped)."""
        self.forget(ref.uid)
        within = f" within {where}, with its gang" if where else ""
        self.event(
            ref,
            type="Normal",
            reason="Scheduled",
            message=f"Successfully assigned {ref.namespace}/{ref.name} to {node}{within}",
        )

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a pod (it was deleted or scheduled)."""
        self._last.pop(uid, None)
        self._conditions.pop(uid, None)

    # -- the writers --------------------------------------------------------------------

    async def run(self) -> None:
        """Write until cancelled, with ``concurrency`` workers."""
        async with asyncio.TaskGroup() as group:
            for i in range(self.concurrency):
                group.create_task(self._worker(), name=f"status-writer-{i}")

    async def drain(self, timeout: float) -> None:
        """Wait until nothing is queued or in flight, or ``timeout`` seconds have passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._queue.join()

    async def _worker(self) -> None:
        while True:
            item = await self._queue.get()
            self._inflight += 1
            try:
                if isinstance(item, str):
                    await self._write_condition(item)
                else:
                    await self._write_event(item)
            except Exception:  # a bug here must not stop the other writes
                self.dropped += 1
                log.exception("status write failed")
            finally:
                self._inflight -= 1
                self._queue.task_done()

    async def _write_event(self, item: _EventWrite) -> None:
        path = f"/api/v1/namespaces/{item.namespace}/events"
        what = f"event {item.body['reason']} about {item.body['involvedObject']['name']}"
        await self._write(what, lambda: self.client.create(path, item.body))

    async def _write_condition(self, uid: str) -> None:
        if uid in self._busy:
            return  # a stale token: the write in flight re-queues the newest when done
        write = self._conditions.pop(uid, None)
        if write is None:
            return  # forgotten meanwhile
        ref = write.ref
        path = f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/status"
        self._busy.add(uid)
        try:
            ok = await self._write(
                f"condition of pod {ref.namespace}/{ref.name}",
                lambda: self.client.patch(path, write.patch, kind="strategic"),
                gone=lambda: self.forget(uid),
            )
            if not ok and self._last.get(uid) == write.key:
                del self._last[uid]  # not written: let the next identical call try again
        finally:
            self._busy.discard(uid)
            if uid in self._conditions:
                self._queue.put_nowait(uid)

    async def _write(
        self,
        what: str,
        call: Callable[[], Any],
        *,
        gone: Callable[[], None] | None = None,
    ) -> bool:
        """Make one write, retrying temporary errors; True when it was written."""
        delay = _BACKOFF
        for attempt in range(_RETRIES + 1):
            try:
                await call()
            except (NotFoundError, ConflictError) as exc:
                log.debug("dropping %s: %s", what, exc)
                if gone is not None:
                    gone()
                break
            except TemporaryError as exc:
                if attempt == _RETRIES:
                    log.warning("giving up %s after %d tries: %s", what, attempt + 1, exc)
                    break
                await asyncio.sleep(delay)
                delay *= 2
            except KubeError as exc:
                log.warning("could not write %s: %s", what, exc)
                break
            else:
                self.written += 1
                return True
        self.dropped += 1
        return False
