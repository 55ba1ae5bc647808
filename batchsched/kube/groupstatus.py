"""PodGroup status: what users read of a gang (phase, counts, why it waits), coalesced.

The loop computes each group's desired :class:`~batchsched.core.gangs.GroupStatus`
whenever something about the group changed and calls :meth:`GroupStatusWriter.update`,
which never blocks. Writes are coalesced per group:

- nothing is written when the desired status equals the one last written or queued, or,
  for a group not written since start, the one the group already shows;
- at most one write per group is in flight; a newer status replaces one still waiting,
  so an older status cannot land after a newer one.

Where it is written: the ``status`` subresource (scheduler-plugins' CRD has one). Volcano's
PodGroup CRD has none, so a 404 from ``/status`` makes the writer patch the object itself
and remember that for the API. Every patch carries the group's UID (``metadata.uid``), so
it cannot reach a group recreated under the same name. A group that is gone (404, 409)
drops its write; temporary errors are retried a few times; nothing here raises into the
scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from batchsched.core.gangs import VOLCANO, GroupKey, GroupStatus, PodGroup, condition_type
from batchsched.kube.client import JSON, KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError
from batchsched.kube.status import MESSAGE_LIMIT, ObjectRef, rfc3339

__all__ = ["GroupStatusWriter", "group_ref"]

log = logging.getLogger("batchsched.groupstatus")

_RETRIES = 3
_BACKOFF = 0.5


def group_ref(group: PodGroup) -> ObjectRef:
    """The object an Event about ``group`` is written on."""
    return ObjectRef(
        kind="PodGroup", api_version=group.api_version, namespace=group.namespace,
        name=group.name, uid=group.uid,
    )


def _plural_path(group: PodGroup) -> str:
    return f"/apis/{group.api_version}/namespaces/{group.namespace}/podgroups/{group.name}"


@dataclass(slots=True)
class _Write:
    group: PodGroup
    status: GroupStatus


class GroupStatusWriter:
    """Queue PodGroup statuses; :meth:`run` writes them with ``concurrency`` workers."""

    def __init__(
        self,
        client: KubeClient,
        *,
        concurrency: int = 4,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.concurrency = concurrency
        self._clock = clock
        self._queue: asyncio.Queue[GroupKey] = asyncio.Queue()
        self._waiting: dict[GroupKey, _Write] = {}
        self._busy: set[GroupKey] = set()
        self._last: dict[GroupKey, GroupStatus] = {}
        #: key -> ((condition type, status, reason), when it last changed)
        self._transition: dict[GroupKey, tuple[tuple[str, bool, str], str]] = {}
        #: APIs whose PodGroup CRD has no status subresource
        self._no_subresource: set[str] = set()
        self.written = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        return len(self._waiting) + len(self._busy)

    def update(self, group: PodGroup, status: GroupStatus) -> None:
        """Ask for ``status`` on ``group``; a no-op when that is what it has or will have."""
        key = group.key
        status = _clipped(status)
        last = self._last.get(key, group.observed)
        if last == status:
            return
        self._last[key] = status
        queued = key in self._waiting
        self._waiting[key] = _Write(group, status)
        if not queued and key not in self._busy:
            self._queue.put_nowait(key)

    def forget(self, key: GroupKey) -> None:
        """The group was deleted: drop what is remembered about it."""
        self._last.pop(key, None)
        self._waiting.pop(key, None)
        self._transition.pop(key, None)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for i in range(self.concurrency):
                group.create_task(self._worker(), name=f"group-status-{i}")

    async def drain(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._queue.join()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                await self._write(key)
            except Exception:  # a bug here must not stop the other writes
                self.dropped += 1
                log.exception("group status write failed")
            finally:
                self._queue.task_done()

    def body(self, group: PodGroup, status: GroupStatus) -> JSON:
        """The merge patch for ``status`` (a condition keeps its transition time while its
        status and reason stay)."""
        ctype = condition_type(group.api, status.scheduled)
        ident = (ctype, status.scheduled, status.reason)
        seen = self._transition.get(group.key)
        if seen is None or seen[0] != ident:
            seen = (ident, rfc3339(self._clock()))
            self._transition[group.key] = seen
        condition: JSON = {
            "type": ctype,
            # Volcano's condition types carry the meaning; scheduler-plugins' one is True/False
            "status": "True" if group.api == VOLCANO or status.scheduled else "False",
            "reason": status.reason,
            "message": status.message,
            "lastTransitionTime": seen[1],
        }
        out: JSON = {
            "phase": status.phase,
            "running": status.running,
            "succeeded": status.succeeded,
            "failed": status.failed,
            "conditions": [condition],
        }
        if status.schedule_start:
            out["scheduleStartTime"] = status.schedule_start
        return {"metadata": {"uid": group.uid}, "status": out} if group.uid else {"status": out}

    async def _write(self, key: GroupKey) -> None:
        if key in self._busy:
            return  # a stale token: the write in flight re-queues the newest when done
        write = self._waiting.pop(key, None)
        if write is None:
            return
        self._busy.add(key)
        try:
            ok = await self._patch(write.group, write.status)
            if not ok and self._last.get(key) == write.status:
                self._last.pop(key, None)  # not written: let the next identical update try again
        finally:
            self._busy.discard(key)
            if key in self._waiting:
                self._queue.put_nowait(key)

    async def _patch(self, group: PodGroup, status: GroupStatus) -> bool:
        body = self.body(group, status)
        path = _plural_path(group)
        delay = _BACKOFF
        for attempt in range(_RETRIES + 1):
            try:
                if group.api in self._no_subresource:
                    await self.client.patch(path, body)
                else:
                    try:
                        await self.client.patch(path + "/status", body)
                    except NotFoundError:
                        # no status subresource (Volcano's CRD), or the group is gone
                        await self.client.patch(path, body)
                        self._no_subresource.add(group.api)
            except (NotFoundError, ConflictError) as exc:
                log.debug("dropping status of PodGroup %s: %s", group.display, exc)
                break
            except TemporaryError as exc:
                if attempt == _RETRIES:
                    log.warning("giving up status of PodGroup %s: %s", group.display, exc)
                    break
                await asyncio.sleep(delay)
                delay *= 2
            except KubeError as exc:
                log.warning("could not write status of PodGroup %s: %s", group.display, exc)
                break
            else:
                self.written += 1
                return True
        self.dropped += 1
        return False


def _clipped(status: GroupStatus) -> GroupStatus:
    if len(status.message) <= MESSAGE_LIMIT:
        return status
    return GroupStatus(
        phase=status.phase, running=status.running, succeeded=status.succeeded,
        failed=status.failed, schedule_start=status.schedule_start, scheduled=status.scheduled,
        reason=status.reason, message=status.message[:MESSAGE_LIMIT],
    )
