"""PodGroup status: what users read of a gang (phase, counts, why it waits), coalesced.

The loop computes each group's desired :class:`~batchsched.core.gangs.GroupStatus`
whenever something about the group changed and calls :meth:`GroupStatusWriter.update`,
which never blocks. Writes are coalesced per group:

- nothing is written when the desired status equals the one last written or queued, or,
  for a group not written since start, the one the group already shows;
- at most one write per group is in flight; a newer status replaces one still waiting,
  so an older status cannot land after a newer one.

Where it is written: the ``status`` subresource (scheduler-plugins' CRD has one; Kubernetes'
own ``scheduling.k8s.io`` PodGroup too, where only its conditions are written, by a
strategic merge patch that leaves other conditions alone). Volcano's
PodGroup CRD has none, so a 404 from ``/status`` makes the writer patch the object itself
and remember that for the API. Every patch carries the group's UID (``metadata.uid``), so
it cannot reach a group recreated under the same name. A group that is gone (404, 409)
drops its write; temporary errors are retried under
:func:`~batchsched.kube.retry.status_writes`; nothing here raises into the scheduler. The
queue is a :class:`~batchsched.kube.coalesce.CoalescingWriter`. Each attempt first checks
the replica's :class:`~batchsched.kube.leader.Fence`; a write whose fence has passed is
kept unsent and tried again later (it is not asked for again).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from batchsched.core import explain
from batchsched.core.gangs import K8S, VOLCANO, GroupKey, GroupStatus, PodGroup, condition_type
from batchsched.core.gangs.upstream import COND_DISRUPTION, REASON_PREEMPTED
from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.coalesce import CoalescingWriter, Transitions, WriteLater
from batchsched.kube.errors import NotFoundError
from batchsched.kube.leader import Fence, Fenced
from batchsched.kube.retry import status_writes, try_write
from batchsched.kube.status import MESSAGE_LIMIT, rfc3339

__all__ = ["GroupStatusWriter"]


def _plural_path(group: PodGroup) -> str:
    return f"/apis/{group.api_version}/namespaces/{group.namespace}/podgroups/{group.name}"


@dataclass(frozen=True, slots=True)
class _Write:
    """A status for a group; two are the same when their statuses are."""

    group: PodGroup = field(compare=False)
    status: GroupStatus


class GroupStatusWriter:
    """Queue PodGroup statuses; :meth:`run` writes them with ``concurrency`` workers."""

    def __init__(
        self,
        client: KubeAPI,
        *,
        concurrency: int = 4,
        clock: Callable[[], float] = time.time,
        fence: Fence | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.concurrency = concurrency
        self.fence = fence if fence is not None else Fence.always_open()
        self.retry = status_writes()
        self._writes: CoalescingWriter[GroupKey, _Write] = CoalescingWriter(
            write=self._write, concurrency=concurrency, name="group-status"
        )
        self._transitions: Transitions[GroupKey] = Transitions(clock=clock)
        #: APIs whose PodGroup CRD has no status subresource
        self._no_subresource: set[str] = set()

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

    def update(self, group: PodGroup, status: GroupStatus) -> None:
        """Ask for ``status`` on ``group``; a no-op when that is what it has or will have."""
        self._writes.offer(
            group.key, _Write(group, _clipped(status)), shown=_Write(group, group.observed)
        )

    def forget(self, key: GroupKey) -> None:
        """The group was deleted: drop what is remembered about it."""
        self._writes.forget(key)
        self._transitions.forget(key)
        self._transitions.forget(GroupKey(f"{key}#{COND_DISRUPTION}"))

    async def run(self) -> None:
        await self._writes.run()

    async def drain(self, timeout: float) -> bool:
        """Wait until nothing is queued or in flight; False if something still was after
        ``timeout`` seconds."""
        return await self._writes.drain(timeout)

    def body(self, group: PodGroup, status: GroupStatus) -> JSON:
        """The merge patch for ``status`` (a condition keeps its transition time while its
        status and reason stay)."""
        ctype = condition_type(group.api, status.scheduled)
        since = self._transitions.since(group.key, (ctype, status.scheduled, status.reason))
        condition: JSON = {
            "type": ctype,
            # Volcano's condition types carry the meaning; scheduler-plugins' one is True/False
            "status": "True" if group.api == VOLCANO or status.scheduled else "False",
            "reason": status.reason,
            "message": status.message,
            "lastTransitionTime": rfc3339(since),
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
        if group.api == K8S:  # conditions only, as kube-scheduler writes them
            out = {"conditions": [condition, *self._disruption(group, status)]}
        return {"metadata": {"uid": group.uid}, "status": out} if group.uid else {"status": out}

    def _disruption(self, group: PodGroup, status: GroupStatus) -> list[JSON]:
        """A ``scheduling.k8s.io`` group's ``DisruptionTarget``: True while it is being
        preempted, False once it is placed again (none if it never was preempted)."""
        if not status.disruption and not group.observed.disruption:
            return []
        key = GroupKey(f"{group.key}#{COND_DISRUPTION}")
        if status.disruption:
            since = self._transitions.since(key, (True,))
            return [{"type": COND_DISRUPTION, "status": "True", "reason": REASON_PREEMPTED,
                     "message": status.disruption[:MESSAGE_LIMIT], "lastTransitionTime": rfc3339(since)}]
        since = self._transitions.since(key, (False,))
        return [{"type": COND_DISRUPTION, "status": "False", "reason": "Scheduled",
                 "message": explain.group_placed_again(), "lastTransitionTime": rfc3339(since)}]

    async def _write(self, key: GroupKey, write: _Write) -> bool:
        group = write.group
        body = self.body(group, write.status)
        path = _plural_path(group)
        what = f"status of PodGroup {group.display}"

        fence = self.fence

        async def patch() -> None:
            if group.api in self._no_subresource:
                await fence.send(lambda: self.client.patch(path, body), what=what)
                return
            if group.api == K8S:  # a built-in type: its conditions merge by type
                await fence.send(lambda: self.client.patch(path + "/status", body, kind="strategic"), what=what)
                return
            try:
                await fence.send(lambda: self.client.patch(path + "/status", body), what=what)
            except NotFoundError:
                if group.api != VOLCANO:
                    raise  # scheduler-plugins' CRD has the subresource: the group is gone
                # Volcano's CRD has no status subresource (or the group is gone, which the
                # patch of the object then says)
                await fence.send(lambda: self.client.patch(path, body), what=what)
                self._no_subresource.add(group.api)

        try:
            return await try_write(self.retry, patch, what=what)
        except Fenced as exc:
            raise WriteLater(str(exc)) from exc


def _clipped(status: GroupStatus) -> GroupStatus:
    if len(status.message) <= MESSAGE_LIMIT:
        return status
    return GroupStatus(
        phase=status.phase, running=status.running, succeeded=status.succeeded,
        failed=status.failed, schedule_start=status.schedule_start, scheduled=status.scheduled,
        reason=status.reason, message=status.message[:MESSAGE_LIMIT], disruption=status.disruption,
    )
