"""The statuses: what each PodGroup is told (its status, the message its pods get, its
Events), and each Queue's status.

A group's status is written when something about it changed (a member arrived or was
bound, a cycle decided about it, its spec changed) and, besides, on a slow sweep over every
group (a slice of them in each step, so that a cluster of many groups pays for the sweep
evenly), and groups with a gang timer (backing off, partly placed) in every step. Its condition carries the last cycle's word on why it waits; its pods get the same
message, but a waiting gang's message changes with every change of capacity ("only 12 fit
now"), so they are told a new one at most every :data:`POD_MESSAGE_SECONDS` (a write per
member), while the PodGroup condition follows each change (one write).

Why a gang waits, as its condition says it, is also said by a ``FailedScheduling`` Event
to the objects its users read (:func:`~batchsched.core.decisions.gang_refs`: the PodGroup,
or Kueue's Workload, and the job that owns the group), while a member of it waits for
batchsched (not while all are gated: the gate's owner says why), under the pods' rule: a new reason at once, a new message
for the same reason at most every :data:`POD_MESSAGE_SECONDS`. A reason is said only once
it held for the gang report delay (members and PodGroups usually arrive together, so a
job that is being created is not reported as missing its pods); until then the group is
looked at again at every step.

The Queue statuses are written at most every ``queue_status_interval`` (at once after the
queues changed), from the queue tree as the last cycle charged it.
"""

from __future__ import annotations

from collections.abc import Callable

from batchsched.core import explain
from batchsched.core.decisions import Decisions, EventNote, gang_refs, group_ref
from batchsched.core.gangs import VOLCANO, GroupBook, GroupKey, PodGroup, Room, desired_status
from batchsched.core.gangs.units import refusal
from batchsched.core.mirror import ClusterState
from batchsched.core.model import format_time
from batchsched.core.placement.topology import CLUSTER, TopologyLevels
from batchsched.core.plan import Plan, Unit, UnitResult, UnitStatus
from batchsched.core.queues import QueueBook, QueueInput, QueueTree
from batchsched.core.reservation import RESERVED

__all__ = ["GROUP_SWEEP_SECONDS", "POD_MESSAGE_SECONDS", "GroupReports", "QueueStatuses"]

#: a full pass over every group's status, besides the groups known to have changed
GROUP_SWEEP_SECONDS = 60.0
#: a waiting gang's pods are told a new message at most this often
POD_MESSAGE_SECONDS = 30.0


class GroupReports:
    """The books of what was told to each group and its pods."""

    def __init__(self, groups: GroupBook, levels: TopologyLevels, *, report_delay: float = 1.0) -> None:
        self.groups = groups
        self.levels = levels
        #: a gang's reason is told its objects by Event once it held this long
        self.report_delay = report_delay
        #: groups whose status is to be written in the next step
        self.dirty: set[GroupKey] = set()
        #: group unit key -> (reason, message) of why it was not placed in the last cycle
        self._message: dict[str, tuple[str, str]] = {}
        self._schedule_start: dict[GroupKey, str] = {}
        self._reported_invalid: dict[GroupKey, str] = {}
        #: ``scheduling.k8s.io`` groups: those whose quorum was placed once (their
        #: ``PodGroupInitiallyScheduled`` stays True), and why those being preempted are
        #: (their ``DisruptionTarget``, until they are placed again)
        self._initially: set[GroupKey] = set()
        self._disruption: dict[GroupKey, str] = {}
        #: gang unit key -> (reason, message, time) last told its pods
        self._pods_told: dict[str, tuple[str, str, float]] = {}
        #: group -> (reason, message, time) last told its objects by Event, and the reason
        #: it waits for with when that reason was first seen
        self._objects_told: dict[GroupKey, tuple[str, str, float]] = {}
        self._reason_since: dict[GroupKey, tuple[str, float]] = {}
        #: groups whose reason is still too new to tell: looked at again at the next step
        self._recheck: set[GroupKey] = set()
        self._last_sweep = -1e18
        #: the groups of the current sweep, and how far it went
        self._sweep: list[GroupKey] = []
        self._swept = 0

    def changed(self, group: PodGroup, *, spec: bool, deleted: bool) -> None:
        """A PodGroup event: ``spec`` when what decides its placement changed."""
        if spec or deleted:
            self._pods_told.pop(f"missing:{group.display}", None)
        if deleted:
            self._reported_invalid.pop(group.key, None)
            self._schedule_start.pop(group.key, None)
            self._message.pop(group.key, None)
            self._pods_told.pop(group.key, None)
            self._initially.discard(group.key)
            self._disruption.pop(group.key, None)
            self._forget_objects_told(group.key)
        else:
            self.dirty.add(group.key)

    def preempted(self, plan: Plan) -> None:
        """The cycle's victims: a ``scheduling.k8s.io`` group among them is told it is being
        preempted (its ``DisruptionTarget``) until it is placed again."""
        for rec in plan.preemptions:
            for victim, message in zip(rec.victims, rec.messages, strict=True):
                key = GroupKey(victim.unit.key)
                group = self.groups.groups.get(key)
                if group is not None and group.upstream is not None:
                    self._disruption[key] = message
                    self.dirty.add(key)

    def last_message(self, key: str) -> tuple[str, str] | None:
        """The ``(reason, message)`` of why the group ``key`` was not placed in the last
        cycle that tried it; None when it was placed or never tried."""
        return self._message.get(key)

    def pod_message(self, key: str, reason: str, message: str, now: float) -> str:
        """What to tell a waiting gang's pods: a new message, or, for the same reason, the
        last one if it was told less than :data:`POD_MESSAGE_SECONDS` ago (a new reason is
        always told at once, so reason and message never disagree)."""
        told = self._pods_told.get(key)
        if told is not None and not _due(told, reason, message, now):
            return told[1]
        self._pods_told[key] = (reason, message, now)
        return message

    def result(
        self, unit: Unit, result: UnitResult | None, *, holding: bool, now: float, out: Decisions,
    ) -> None:
        """A cycle's word on a gang: kept for its condition; a placed gang's Event."""
        key = GroupKey(unit.key)
        self.dirty.add(key)
        if not unit.blocked:
            self._schedule_start.setdefault(key, format_time(now))
        if result is None:
            return
        if result.status is UnitStatus.SCHEDULED:
            self._message.pop(key, None)
            self._pods_told.pop(key, None)
            self._disruption.pop(key, None)
            self._forget_objects_told(key)
            group = self.groups.groups.get(key)
            if group is not None:
                message = explain.gang_placed(
                    quorum=unit.min_count, min_member=group.min_member,
                    extra=result.placed - unit.min_count, where=self._placed_where(unit, result.where),
                )
                out.events.extend(EventNote(ref, "Normal", "Scheduled", message) for ref in gang_refs(group))
        elif holding:
            self._message[key] = ("WaitingForPreemption", result.message)
        elif result.failed or result.reason == RESERVED:
            self._message[key] = (result.reason, result.message)

    def shared(self, key: GroupKey, result: UnitResult, now: float) -> str:
        """A gang left out of the cycle shares the failure of an alike gang's (its status
        is written again only if that changes what it says); returns what its pods are told
        (:meth:`pod_message`)."""
        told = (result.reason, result.message)
        if self._message.get(key) != told:
            self.dirty.add(key)
            self._message[key] = told
        return self.pod_message(key, result.reason, result.message, now)

    def _sweep_slice(self, now: float) -> None:
        """Mark the next slice of the sweep: as many groups as the time since the last
        slice is of :data:`GROUP_SWEEP_SECONDS` (all of them after a long pause)."""
        elapsed = now - self._last_sweep
        self._last_sweep = now
        if self._swept >= len(self._sweep):
            self._sweep, self._swept = sorted(self.groups.groups), 0
        if not self._sweep:
            return
        count = len(self._sweep) if elapsed >= GROUP_SWEEP_SECONDS else max(
            1, int(len(self._sweep) * elapsed / GROUP_SWEEP_SECONDS + 0.999))
        self.dirty.update(self._sweep[self._swept:self._swept + count])
        self._swept += count

    def _tell_objects(self, group: PodGroup, reason: str, message: str, now: float, out: Decisions) -> None:
        """Why the gang waits (``reason`` "": it does not), said by a ``FailedScheduling``
        Event to each of :func:`~batchsched.core.decisions.gang_refs`, when it says something
        new (the pods' rule, :func:`_due`) and its reason held for :attr:`report_delay`."""
        key = group.key
        if not reason:
            self._forget_objects_told(key)
            return
        since = self._reason_since.get(key)
        if since is None or since[0] != reason:
            since = self._reason_since[key] = (reason, now)
        if now - since[1] < self.report_delay:
            self._recheck.add(key)
            return
        if not _due(self._objects_told.get(key), reason, message, now):
            return
        self._objects_told[key] = (reason, message, now)
        out.events.extend(EventNote(ref, "Warning", "FailedScheduling", message) for ref in gang_refs(group))

    def _forget_objects_told(self, key: GroupKey) -> None:
        """The gang was placed, stopped waiting or went: a later wait is told afresh."""
        self._objects_told.pop(key, None)
        self._reason_since.pop(key, None)
        self._recheck.discard(key)

    def _placed_where(self, unit: Unit, where: str) -> str:
        """`` within rack r-3``: the end of a placed gang's message (empty without a domain)."""
        if not where:
            return ""
        level = unit.topology_level
        return explain.placed_where(
            where, fell_back=where == CLUSTER,
            level_name=self.levels.name(level) if level is not None else "domain",
        )

    def statuses(
        self, state: ClusterState, now: float, room: Callable[[], Room], out: Decisions,
    ) -> None:
        """The status of the groups that changed (and, now and then, of every group).
        ``room()``: what groups could have, for Volcano's admission (built when needed)."""
        self._sweep_slice(now)
        self.dirty.update(self.groups.timed())
        self.dirty.update(self._recheck)
        self._recheck.clear()
        dirty, self.dirty = self.dirty, set()
        admission: Room | None = None
        for key in sorted(dirty):
            group = self.groups.groups.get(key)
            if group is None:
                continue
            tally = self.groups.tally(group, state)
            refused = refusal(group, tally)
            if refused and self._reported_invalid.get(key) != refused:
                self._reported_invalid[key] = refused
                out.events.append(EventNote(
                    group_ref(group), "Warning", "InvalidPodGroup", explain.invalid_group(group.described, refused),
                ))
            if not tally.ours:
                continue
            admitted = False
            if group.api == VOLCANO and group.observed.phase in ("", "Pending"):
                if admission is None:
                    admission = room()
                admitted = self.groups.admitted(group, state, now, admission)
            reason, message = self._message.get(key, ("", ""))
            backing_off = self.groups.backing_off(key, now)
            if not tally.pending and not group.invalid and not backing_off:
                reason, message = "", ""  # the cycle's last word is stale: nothing waits
            elif backing_off:
                reason = "GangBackoff"
                message = self.groups.blocked_message(group, now)
            status = desired_status(
                group, tally, waiting=message, reason=reason, admitted=admitted,
                schedule_start=self._schedule_start.get(key, ""), refused=refused,
                scheduled_before=key in self._initially or group.observed.scheduled,
                disruption=self._disruption.get(key, ""),
            )
            # members gated by another controller (Kueue before it admits) are its to explain
            waits = tally.schedulable and not status.scheduled
            self._tell_objects(group, status.reason if waits else "", status.message, now, out)
            if group.from_pods:
                continue  # no object of its own: its pods are told (a status has nowhere to go)
            if group.upstream is not None and status.scheduled:
                self._initially.add(key)
            out.group_statuses.append((group, status))


class QueueStatuses:
    """When the Queue statuses were last written, and the queue tree as last charged (one
    writer: this module)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = -1e18
        #: the queue tree as last charged (by a cycle, or for the Queue statuses): what the
        #: queue views read; None before the first
        self.charged: QueueTree | None = None

    def queues_changed(self) -> None:
        """The queues changed: their statuses are written at the next step."""
        self._last = -1e18

    def charge(self, tree: QueueTree) -> None:
        """The tree a cycle just charged."""
        self.charged = tree

    def due(self, now: float, queues: QueueBook, out: Decisions) -> bool:
        """Whether the Queue statuses are to be written at ``now`` (at most every
        ``interval``, once per step, and only with Queues to write); if so, from now on
        they count as written."""
        if not queues.queue_objects or out.queue_statuses or now - self._last < self.interval:
            return False
        self._last = now
        return True

    def write(self, charged: QueueInput, out: Decisions, *, state: ClusterState, groups: GroupBook,
              queues: QueueBook) -> None:
        """The Queue statuses from ``charged`` (a cycle's queue input, its tree charged)."""
        self.charged = charged.tree

        def pending(key: str) -> bool:
            return _has_pending(key, state, groups)

        out.queue_statuses.extend(queues.statuses(charged.tree, pending).items())


def _due(told: tuple[str, str, float] | None, reason: str, message: str, now: float) -> bool:
    """Whether a waiting gang is told ``reason`` and ``message`` again, having been told
    ``told`` (reason, message, when) last: a new reason at once, a new message for the same
    reason at most every :data:`POD_MESSAGE_SECONDS`, the same words never."""
    return told is None or told[0] != reason or (told[1] != message and now - told[2] >= POD_MESSAGE_SECONDS)


def _has_pending(key: str, state: ClusterState, groups: GroupBook) -> bool:
    """Whether the unit ``key`` (a group's, or a single pod's ``namespace/name``) still
    has a pod waiting."""
    pending = state.pending
    group = groups.groups.get(GroupKey(key))
    if group is not None:
        return not pending.keys().isdisjoint(groups.member_uids(group))
    uid = state.by_name.get(tuple(key.split("/", 1)))  # type: ignore[arg-type]
    return uid is not None and uid in pending
