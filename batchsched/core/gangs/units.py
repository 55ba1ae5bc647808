"""One gang's unit for the cycle: blocked and why, or its members in the order to place them.

Each cycle the book builds one :class:`~batchsched.core.plan.Unit` per group with pending
members (:func:`gang_unit`), and one per group that pods name but that does not exist
(:func:`missing_unit`):

- a group whose PodGroup does not exist, is malformed, is backing off after a timeout, or
  has fewer than ``minMember`` pods (or too few of a ``minTaskMember`` task), becomes a
  *blocked* unit: its pods are told why and nothing is placed (:func:`blocked_reason`);
- a group that asks for more ``minResources`` than the cluster has free or it may preempt
  is not placed either, but it is not blocked: its unit carries the reason
  (:attr:`~batchsched.core.plan.Unit.min_resources_short`) and keeps its turn, so at the head
  of its queue it holds a reservation like any other gang (later small work would otherwise
  take every GPU that frees, and it would never start);
- otherwise the unit's ``min_count`` is what is still missing from the quorum (members
  already bound, assumed or finished count), so a gang whose bindings partly failed is
  retried as the remainder of the same gang; the members of each task's quorum come first;
  members beyond the quorum follow as elastic extras;
- its topology policy (:func:`~batchsched.core.placement.topology.topology_policy`) is read from the
  PodGroup's annotations, or when the PodGroup asks nothing, from its quorum's first pod's;
  a bad value blocks the unit with the reason ``InvalidTopology``. A gang required to stay
  in one domain also carries the nodes its placed members hold, so the rest joins them.

Pure: no I/O, no clock (``now`` is passed in, monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from batchsched.core import explain
from batchsched.core.gangs.podgroup import GroupKey, PodGroup
from batchsched.core.gangs.priority import PriorityClasses
from batchsched.core.gangs.status import Tally, member_order, task_of
from batchsched.core.gangs.timers import GangTimers
from batchsched.core.mirror import ClusterState
from batchsched.core.model import PODS, Pod, PodUID
from batchsched.core.placement.topology import (
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TopologyLevels,
    topology_policy,
)
from batchsched.core.plan import Unit

#: what a group could have, given the group and its pods waiting: the free capacity and what
#: it may preempt, per resource (see the session, which knows who may be evicted)
Room = Callable[[PodGroup, Sequence[Pod]], tuple[Mapping[str, int], Mapping[str, int]]]

__all__ = ["Room", "blocked_reason", "gang_unit", "missing_unit", "short_of"]


def missing_unit(namespace: str, name: str, named: list[Pod]) -> Unit:
    """The blocked unit of pods naming a group that does not exist."""
    key = GroupKey(f"missing:{namespace}/{name}")
    return _blocked(key, tuple(sorted(named, key=member_order)), 0, 0.0, "",
                    f"waiting for PodGroup {namespace}/{name} to exist", "PodGroupNotFound")


def gang_unit(
    group: PodGroup,
    t: Tally,
    *,
    state: ClusterState,
    now: float,
    classes: PriorityClasses,
    timers: GangTimers,
    levels: TopologyLevels,
    room: Room | None,
) -> Unit | None:
    """The unit of ``group``, whose members ``t`` counts; None when none may be placed
    (all its pending members are gated). ``room`` as in :meth:`GroupBook.units`."""
    key = group.key
    t.pending.sort(key=member_order)
    schedulable = t.schedulable
    if not schedulable:
        return None
    priority = classes.priority(group, schedulable)
    pods = tuple(schedulable)
    reason, blocked = blocked_reason(group, t, now, timers)
    short = ""
    if not blocked and group.min_resources and t.placed < group.min_member:
        free, preemptible = room(group, pods) if room is not None else ({}, {})
        short = short_of(group, t, free, preemptible)
    if blocked:
        return _blocked(key, pods, priority, group.created, group.uid, blocked, reason)
    ordered, min_count = _quorum_first(group, t)
    if short:  # not placed: its count only sizes the reservation it may hold
        min_count = _covering(group, t, ordered, min_count)
    try:
        level, required = _topology(group, ordered, levels)
    except ValueError as exc:
        return _blocked(key, pods, priority, group.created, group.uid, str(exc), "InvalidTopology")
    return Unit(
        key=key, pods=tuple(ordered), min_count=min_count, priority=priority,
        never_preempts=classes.never_preempts(group, pods),
        created=group.created, arrival=group.arrival, uid=group.uid or key, topology_level=level,
        topology_required=required, min_resources_short=short,
        placed_on=_placed_on(state, t) if required else (),
    )


def blocked_reason(group: PodGroup, t: Tally, now: float, timers: GangTimers) -> tuple[str, str]:
    """``(condition reason, message)`` of why the group may not be placed now, or ("", "")."""
    refused = refusal(group, t)
    if refused:
        return "InvalidPodGroup", f"{group.described} is invalid: {refused}"
    if group.suspended:
        return "Suspended", explain.suspended(group.display)
    if timers.backing_off(group.key, now):
        return "GangBackoff", timers.blocked_message(group.key, now)
    leaving = timers.evicting(group.key)
    evicting = sum(p.uid in leaving for p in t.bound)
    # members terminating (preempted, reclaimed) still hold their room, but are leaving:
    # new members placed beside them would be a partial gang once they are gone
    going = sum(p.deleting for p in t.bound)
    if evicting or (going and t.placed - going < group.min_member):
        # placed now, new members would join the remainder being evicted
        return "GangEvicting", explain.gang_evicting(group.display, evicting or going)
    schedulable = t.schedulable
    exist = t.placed + len(schedulable)
    gated = len(t.pending) - len(schedulable)
    if exist < group.min_member:
        extra = f" ({gated} more are gated)" if gated else ""
        return "WaitingForMembers", (
            f"waiting for pods: {exist} of {group.min_member} required members exist{extra}"
        )
    for task, need in sorted(group.min_task_member.items()):
        have = t.placed_by_task.get(task, 0) + sum(1 for p in schedulable if task_of(p) == task)
        if have < need:
            return "WaitingForMembers", (
                f"waiting for pods: task {task} has {have} of {need} required members"
            )
    return "", ""


def refusal(group: PodGroup, t: Tally) -> str:
    """Why batchsched will not place the group at all, or "": its spec is invalid, or its
    members name different schedulers."""
    return group.invalid or mixed_schedulers(group, t)


def mixed_schedulers(group: PodGroup, t: Tally) -> str:
    """Why a ``scheduling.k8s.io`` group whose members name different schedulers is refused
    (as kube-scheduler refuses one), or "". Each scheduler would place its own members
    apart, and neither could keep the gang whole."""
    if group.upstream is None or not t.foreign or not t.ours:
        return ""
    return explain.mixed_schedulers(t.foreign)


def _blocked(
    key: GroupKey, pods: tuple[Pod, ...], priority: int, created: float, uid: str, why: str, reason: str,
) -> Unit:
    return Unit(key=key, pods=pods, min_count=len(pods), priority=priority, created=created,
                uid=uid or key, blocked=why, blocked_reason=reason)


def short_of(
    group: PodGroup, t: Tally, free: Mapping[str, int], preemptible: Mapping[str, int],
) -> str:
    """Why ``minResources`` cannot be met now, or "" when it can: what its members hold,
    plus what is free, plus what it may preempt (``preemptible``), must cover it."""
    held: dict[str, int] = {}
    for pod in t.holding:
        for r, v in pod.requests.items():
            held[r] = held.get(r, 0) + v
    short = []
    for r, need in sorted(group.min_resources.items()):
        if r == PODS:
            continue
        missing = need - held.get(r, 0)
        if missing > free.get(r, 0) + preemptible.get(r, 0):
            short.append((r, missing, free.get(r, 0), preemptible.get(r, 0)))
    return explain.min_resources_short(group.display, short)


def _covering(group: PodGroup, t: Tally, ordered: list[Pod], min_count: int) -> int:
    """How many of the waiting members (in order, at least the quorum) ask, with what the
    members hold, for all of ``minResources``; all of them when none do. A gang short of its
    ``minResources`` reserves room for that many, so that when its reserved nodes are free its
    ``minResources`` is too (a group asking more than its quorum does, for elastic members)."""
    need = {r: v for r, v in group.min_resources.items() if r != PODS}
    for pod in t.holding:
        for r, v in pod.requests.items():
            if r in need:
                need[r] -= v
    for m, pod in enumerate(ordered):
        if m >= min_count and all(v <= 0 for v in need.values()):
            return m
        for r, v in pod.requests.items():
            if r in need:
                need[r] -= v
    return len(ordered)


def _topology(group: PodGroup, ordered: list[Pod], levels: TopologyLevels) -> tuple[int | None, bool]:
    """``(level, required)``: a ``scheduling.k8s.io`` group's topology constraint (a node
    label key, required), else the gang's topology annotations."""
    if group.upstream is not None and group.upstream.topology_key:
        return levels.level_of_key(group.upstream.topology_key), True
    return topology_policy(_topology_annotations(group, ordered), levels)


def _topology_annotations(group: PodGroup, ordered: list[Pod]) -> Mapping[str, str]:
    """Where the gang's topology policy is read: its PodGroup, or when that asks nothing,
    the first member of its quorum (for tools that cannot annotate the PodGroup)."""
    ann = group.annotations
    if TOPOLOGY_ANNOTATION in ann or TOPOLOGY_PREFERRED_ANNOTATION in ann or not ordered:
        return ann
    return ordered[0].annotations


def _placed_on(state: ClusterState, t: Tally) -> tuple[str, ...]:
    """The nodes of the members holding resources, in member order."""
    nodes = (p.node_name or state.assumed.get(p.uid, "") for p in sorted(t.holding, key=member_order))
    return tuple(n for n in nodes if n)


def _quorum_first(group: PodGroup, t: Tally) -> tuple[list[Pod], int]:
    """Pending members with each task's missing quorum first; the unit's min_count.

    ``t.pending`` must be in member order already."""
    pending = t.schedulable
    first: list[Pod] = []
    taken: set[PodUID] = set()
    for task, need in sorted(group.min_task_member.items()):
        missing = need - t.placed_by_task.get(task, 0)
        if missing <= 0:
            continue
        for pod in pending:
            if missing == 0:
                break
            if task_of(pod) == task:
                first.append(pod)
                taken.add(pod.uid)
                missing -= 1
    rest = [p for p in pending if p.uid not in taken]
    min_count = min(max(group.min_member - t.placed, len(first)), len(pending))
    return first + rest, min_count
