"""A group's members counted by where they are, and the status batchsched writes from that.

:class:`Tally` is what the book counts for one group (holding, bound, pending, finished),
in the order of :func:`member_order` and by task (:func:`task_of`); :func:`runs_whole` says
whether its quorum is bound. :func:`desired_status` turns it into the PodGroup status of the group's API, and
:func:`condition_type` names the condition batchsched owns on each API.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from batchsched.core import explain
from batchsched.core.gangs.podgroup import (
    _COND_VOLCANO_OK,
    _COND_VOLCANO_WAIT,
    _COND_XK8S,
    ANNOTATION_TASK,
    VOLCANO,
    XK8S,
    GroupStatus,
    PodGroup,
)
from batchsched.core.gangs.upstream import COND_SCHEDULED, K8S
from batchsched.core.model import Pod

__all__ = ["Tally", "condition_type", "desired_status", "member_order", "natural", "runs_whole", "task_of"]

_NATURAL = re.compile(r"(\d+)")


# -- counting members ------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """One group's members by where they are."""

    #: bound and unfinished, or assumed: they hold resources now
    holding: list[Pod] = field(default_factory=list)
    #: bound (not only assumed) and unfinished: the members an eviction can remove
    bound: list[Pod] = field(default_factory=list)
    succeeded: int = 0
    failed: int = 0
    running: int = 0
    #: ours, unbound, not deleting: the ones a cycle may place (gated ones too)
    pending: list[Pod] = field(default_factory=list)
    placed_by_task: dict[str, int] = field(default_factory=dict)
    #: members of another scheduler (not counted above)
    foreign: int = 0

    @property
    def ours(self) -> bool:
        """The group is ours to place and police: some member is ours, or none exists yet."""
        return not self.foreign or bool(self.holding or self.pending or self.succeeded or self.failed)

    @property
    def placed(self) -> int:
        """Members that count for the quorum: holding resources, or run to success."""
        return len(self.holding) + self.succeeded

    @property
    def schedulable(self) -> list[Pod]:
        return [p for p in self.pending if not p.gated]


@functools.lru_cache(maxsize=1 << 18)
def natural(name: str) -> tuple[Any, ...]:
    """A name's natural order: ``pod-10`` after ``pod-9``."""
    # isdecimal, not isdigit: "³" is a digit that int() refuses (and \d does not match)
    return tuple([int(p) if p.isdecimal() else p for p in _NATURAL.split(name)])


def member_order(pod: Pod) -> tuple[Any, ...]:
    """Members by priority, age, then name in natural order (``worker-2`` before
    ``worker-10``: an operator creates a job's members together, and their index is the
    order its users read); arrival and UID only keep the order total."""
    return (-pod.priority, pod.created, natural(pod.name), pod.arrival, pod.uid)


def task_of(pod: Pod) -> str:
    """The Volcano task the member belongs to ("" when it names none)."""
    return pod.annotations.get(ANNOTATION_TASK, "")


def runs_whole(group: PodGroup, t: Tally) -> bool:
    """Whether the group's quorum is bound as the watch shows it (or has run to success):
    members only assumed bound do not count, their Bindings may still be refused."""
    if len(t.bound) + t.succeeded < group.min_member:
        return False
    if not group.min_task_member:
        return True
    by_task = dict(t.placed_by_task)
    for pod in t.holding:
        if not pod.holds_resources:  # assumed only
            by_task[task_of(pod)] -= 1
    return all(by_task.get(task, 0) >= need for task, need in group.min_task_member.items())


# -- status ------------------------------------------------------------------------------------


def condition_type(api: str, scheduled: bool) -> str:
    if api == VOLCANO:
        return _COND_VOLCANO_OK if scheduled else _COND_VOLCANO_WAIT
    if api == K8S:
        return COND_SCHEDULED
    return _COND_XK8S


def desired_status(
    group: PodGroup,
    t: Tally,
    *,
    waiting: str,
    reason: str,
    admitted: bool,
    schedule_start: str,
    refused: str = "",
    scheduled_before: bool = False,
    disruption: str = "",
) -> GroupStatus:
    """The status batchsched writes for a group.

    scheduler-plugins phases: Pending (nothing placed), Scheduling (placement under way:
    some members placed, or the quorum placed and not yet running), Running (``minMember``
    running or succeeded), Finished (``minMember`` succeeded, none running), Failed (members
    failed and the rest cannot make the quorum). Volcano phases: Pending (not admitted),
    Inqueue (admitted: the training operator now creates the pods; placement under way),
    Running, Completed.

    ``waiting``/``reason`` say why the group is not placed (from the last cycle); they are
    ignored once the quorum is placed. ``refused``: why batchsched will not place the group
    (the group's own :attr:`~PodGroup.invalid` when not given). For a ``scheduling.k8s.io``
    group see :func:`_upstream_status`.
    """
    refused = refused or group.invalid
    if group.upstream is not None:
        return _upstream_status(group, t, waiting=waiting, refused=refused,
                                scheduled_before=scheduled_before, disruption=disruption)
    n = group.min_member
    running, succeeded, failed = t.running, t.succeeded, t.failed
    placed = t.placed >= n
    if group.api == VOLCANO:
        if succeeded >= n and running == 0:
            phase = "Completed"
        elif running + succeeded >= n:
            phase = "Running"
        elif admitted or t.placed or group.observed.phase in ("Inqueue", "Running", "Completed"):
            phase = "Inqueue"
        else:
            phase = "Pending"
    elif succeeded >= n and running == 0:
        phase = "Finished"
    elif running + succeeded >= n:
        phase = "Running"
    elif failed and not t.pending and t.placed < n:
        phase = "Failed"
    elif t.placed:
        phase = "Scheduling"
    else:
        phase = "Pending"
    if refused:
        message, why = f"{group.described} is invalid: {refused}", "InvalidPodGroup"
        placed = False
    elif placed:
        why, message = "Scheduled", _placed_message(t, n)
    else:
        why = reason or "WaitingForMembers"
        message = waiting or _waiting_message(t, n)
    return GroupStatus(
        phase=phase,
        running=running,
        succeeded=succeeded,
        failed=failed,
        schedule_start=(group.observed.schedule_start or schedule_start) if group.api == XK8S else "",
        scheduled=placed,
        reason=why,
        message=message,
    )


def _upstream_status(
    group: PodGroup, t: Tally, *, waiting: str, refused: str, scheduled_before: bool, disruption: str,
) -> GroupStatus:
    """A ``scheduling.k8s.io`` group's conditions, as kube-scheduler writes them:
    ``PodGroupInitiallyScheduled`` True (``Scheduled``) once the quorum is placed and never
    False again (``scheduled_before``: it was True), else False with reason ``Unschedulable``
    and batchsched's own explanation, or ``SchedulerError`` for a group it refuses.
    ``disruption``: why the group is being preempted (its ``DisruptionTarget``)."""
    n = group.min_member
    if scheduled_before:
        observed = group.observed
        scheduled, why = True, "Scheduled"
        message = observed.message if observed.scheduled else _placed_message(t, n)
    elif refused:
        scheduled, why, message = False, "SchedulerError", explain.invalid_group(group.described, refused)
    elif t.placed >= n:
        scheduled, why, message = True, "Scheduled", _placed_message(t, n)
    else:
        scheduled, why, message = False, "Unschedulable", waiting or _waiting_message(t, n)
    return GroupStatus(scheduled=scheduled, reason=why, message=message, disruption=disruption)


def _placed_message(t: Tally, n: int) -> str:
    return f"{t.placed} of {n} required members placed"


def _waiting_message(t: Tally, n: int) -> str:
    return f"waiting for pods: {t.placed + len(t.schedulable)} of {n} required members exist"
