"""The book of gangs: which pods name which group, the cycle's units, and the gang timers.

:class:`GroupBook` mirrors the groups (one writer, like :class:`~batchsched.core.mirror.ClusterState`)
and indexes pods by the group they name. Each cycle it builds one :class:`~batchsched.core.cycle.Unit`
per group with pending members:

- a group whose PodGroup does not exist, is malformed, is backing off after a timeout, or
  has fewer than ``minMember`` pods (or too few of a ``minTaskMember`` task), becomes a
  *blocked* unit: its pods are told why and nothing is placed;
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

No partial gang survives (:meth:`GroupBook.check`): a group that holds resources with
fewer than ``minMember`` members placed is given ``scheduleTimeoutSeconds`` to become
whole; then its bound members are evicted and the group backs off (exponentially) before
it is tried again. Members that bind during the back-off are evicted at once.

Pure: no I/O, no clock (``now`` is passed in, monotonic seconds).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchsched.core import explain
from batchsched.core.gangs.podgroup import (
    _ANY,
    ANNOTATION_TASK,
    KUEUE,
    VOLCANO,
    XK8S,
    GroupKey,
    PodGroup,
    group_key,
    group_ref,
    kueue_group,
)
from batchsched.core.gangs.status import Tally
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import PODS, Arrivals, Pod, PodUID
from batchsched.core.placement.topology import (
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TopologyLevels,
    topology_policy,
)
from batchsched.core.plan import Eviction, Unit

#: what a group could have, given the group and its pods waiting: the free capacity and what
#: it may preempt, per resource (see the session, which knows who may be evicted)
Room = Callable[[PodGroup, Sequence[Pod]], tuple[Mapping[str, int], Mapping[str, int]]]

__all__ = [
    "GangCheck",
    "GroupBook",
    "GroupNotice",
    "free_capacity",
]

_NATURAL = re.compile(r"(\d+)")
_UNKNOWN = object()


def free_capacity(snap: Snapshot) -> dict[str, int]:
    """What the schedulable nodes have free in total, per resource column."""
    ok = np.array(
        [n.ready and not n.unschedulable and not n.deleting for n in snap.nodes], dtype=np.bool_
    )
    if not len(snap.nodes):
        return {}
    free = np.clip(snap.alloc[ok] - snap.used[ok], 0, None).sum(axis=0)
    return {c: int(free[i]) for i, c in enumerate(snap.columns)}


@functools.lru_cache(maxsize=1 << 18)
def _natural(name: str) -> tuple[Any, ...]:
    # isdecimal, not isdigit: "³" is a digit that int() refuses (and \d does not match)
    return tuple(int(p) if p.isdecimal() else p for p in _NATURAL.split(name))


def _member_order(pod: Pod) -> tuple[Any, ...]:
    """Members by priority, age, then name in natural order (``worker-2`` before
    ``worker-10``: an operator creates a job's members together, and their index is the
    order its users read); arrival and UID only keep the order total."""
    return (-pod.priority, pod.created, _natural(pod.name), pod.arrival, pod.uid)


def _task(pod: Pod) -> str:
    return pod.annotations.get(ANNOTATION_TASK, "")


# -- what the checks ask the I/O edge to do --------------------------------------------------


@dataclass(slots=True, frozen=True)
class GroupNotice:
    """An Event to write on a group."""

    group: PodGroup
    type: str
    reason: str
    message: str


@dataclass(slots=True)
class GangCheck:
    notices: list[GroupNotice] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)


@dataclass(slots=True)
class _Timer:
    #: when the group was first seen holding resources below its quorum
    partial_since: float | None = None
    backoff_until: float = 0.0
    timeouts: int = 0
    backoff_message: str = ""
    evicting: set[PodUID] = field(default_factory=set)
    #: the group was whole at some point since it last backed off
    was_whole: bool = False


# -- the book --------------------------------------------------------------------------------


class GroupBook:
    """PodGroups of every API, which pods name which group, and the gang timers."""

    def __init__(
        self,
        *,
        default_timeout: float = 300.0,
        initial_backoff: float = 10.0,
        max_backoff: float = 300.0,
        levels: TopologyLevels | None = None,
        whole_job_restart: bool = False,
    ) -> None:
        self.default_timeout = default_timeout
        #: the default of a group's whole-job restart (its annotation overrides it)
        self.whole_job_restart = whole_job_restart
        #: groups seen running whole, their quorum confirmed bound by the watch, since they
        #: were placed (a loss below quorum is then a lost member)
        self._was_whole: set[GroupKey] = set()
        #: groups whose quorum a cycle placed and the watch has not yet shown whole: the
        #: members it has shown bound so far (see :meth:`confirmed`)
        self._placing: dict[GroupKey, set[PodUID]] = {}
        #: a member of a group seen whole failed or went since the last :meth:`check`: the
        #: next step checks at once (a replacement must not be placed into the remainder)
        self.lost = False
        self.levels = levels if levels is not None else TopologyLevels()
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.groups: dict[GroupKey, PodGroup] = {}
        self.priority_classes: dict[str, int] = {}
        #: the priority classes whose ``preemptionPolicy`` is ``Never``
        self.never_classes: set[str] = set()
        #: pod uid -> (namespace, api or "any", group name)
        self._refs: dict[PodUID, tuple[str, str, str]] = {}
        #: (namespace, group name) -> uids of the pods naming it
        self._named: dict[tuple[str, str], set[PodUID]] = {}
        #: (namespace, API, name) -> the pods naming the group that way
        self._by_ref: dict[tuple[str, str, str], set[PodUID]] = {}
        self._timers: dict[GroupKey, _Timer] = {}
        #: Kueue pod groups (read from their pods): each member's view of its group
        self._kueue_views: dict[GroupKey, dict[PodUID, PodGroup]] = {}
        #: bumps whenever a group or a priority class changes
        self.version = 0
        #: each group's place in line among those created in the same second
        self._arrivals = Arrivals()
        #: (namespace, name) of groups whose members or spec changed since the last
        #: :meth:`check` (None: all of them)
        self._dirty: set[tuple[str, str]] | None = None
        #: each pod reference's group, at a version of the groups
        self._resolved: tuple[int, dict[tuple[str, str, str], Any]] = (-1, {})

    # -- groups ----------------------------------------------------------------------------

    def group_event(self, kind: str, group: PodGroup) -> None:
        self.version += 1
        self._mark((group.namespace, group.name))
        if kind == "DELETED":
            self.groups.pop(group.key, None)
            self._timers.pop(group.key, None)
            return
        self.groups[group.key] = self._arrived(group)

    def _arrived(self, group: PodGroup) -> PodGroup:
        """``group`` with its place in line (:class:`~batchsched.core.model.Arrivals`)."""
        return self._arrivals.first_seen(group, self.groups.get(group.key))

    def replace_groups(self, api: str, groups: Iterable[PodGroup]) -> None:
        """A relist of one API's groups: they are all of that API there is."""
        self._dirty = None
        fresh = {g.key: g for g in groups}
        for key, g in list(self.groups.items()):
            if g.api == api and key not in fresh:
                self.group_event("DELETED", g)
        for g in fresh.values():
            self.group_event("MODIFIED", g)

    def priority_class_event(self, kind: str, name: str, value: int, never: bool = False) -> None:
        """``never``: the class's ``preemptionPolicy`` is ``Never``."""
        self.version += 1
        self.never_classes.discard(name)
        if kind == "DELETED":
            self.priority_classes.pop(name, None)
        else:
            self.priority_classes[name] = value
            if never:
                self.never_classes.add(name)

    def replace_priority_classes(self, classes: Mapping[str, int], never: Iterable[str] = ()) -> None:
        """A relist: ``never`` names the classes whose ``preemptionPolicy`` is ``Never``."""
        self.version += 1
        self.priority_classes = dict(classes)
        self.never_classes = set(never) & set(classes)

    # -- pods --------------------------------------------------------------------------------

    def pod_event(self, kind: str, pod: Pod) -> None:
        """Keep the index of which pod names which group (call it next to the state's)."""
        ref = None if kind == "DELETED" else group_ref(pod)
        old = self._refs.get(pod.uid)
        if old is not None and (kind == "DELETED" or pod.terminal):
            group = self.resolve(*old)
            if group is not None and group.key in self._was_whole:
                self.lost = True  # a running gang lost a member: check it before any cycle
        new = None if ref is None else (pod.namespace, ref[0], ref[1])
        for r in (old, new):
            if r is not None:
                self._mark((r[0], r[2]))
        if new is not None and new[1] == KUEUE:
            self._kueue_member(pod, pod.uid, new)
        if old == new:
            return
        if old is not None:
            self._drop(pod.uid)
        if new is not None:
            self._refs[pod.uid] = new
            self._named.setdefault((new[0], new[2]), set()).add(pod.uid)
            self._by_ref.setdefault(new, set()).add(pod.uid)

    def _kueue_member(self, pod: Pod | None, uid: PodUID, ref: tuple[str, str, str]) -> None:
        """A member of a Kueue pod group came, changed (``pod``) or left (None): the group
        is as its oldest member describes it, and gone with its last member."""
        key = group_key(KUEUE, ref[0], ref[2])
        views = self._kueue_views.setdefault(key, {})
        if pod is None:
            views.pop(uid, None)
        else:
            views[uid] = kueue_group(pod)
        known = self.groups.get(key)
        if not views:
            del self._kueue_views[key]
            if known is not None:
                self.group_event("DELETED", known)
            return
        group = min(views.values(), key=lambda g: (g.created, g.arrival))
        if group != known:
            self.group_event("MODIFIED", group)

    def touch(self, uid: PodUID) -> None:
        """The pod's state changed outside :meth:`pod_event` (assumed bound, or its
        binding undone): its group is looked at again by the next :meth:`check`."""
        ref = self._refs.get(uid)
        if ref is not None:
            self._mark((ref[0], ref[2]))

    def _mark(self, named: tuple[str, str]) -> None:
        if self._dirty is not None:
            self._dirty.add(named)

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        self._dirty = None
        fresh = {p.uid: p for p in pods}
        for uid in list(self._refs):
            if uid not in fresh:
                self._drop(uid)
        for pod in fresh.values():
            self.pod_event("MODIFIED", pod)

    def _drop(self, uid: PodUID) -> None:
        old = self._refs.pop(uid, None)
        if old is None:
            return
        named = self._named.get((old[0], old[2]))
        if named is not None:
            named.discard(uid)
            if not named:
                del self._named[(old[0], old[2])]
        by_ref = self._by_ref.get(old)
        if by_ref is not None:
            by_ref.discard(uid)
            if not by_ref:
                del self._by_ref[old]
        if old[1] == KUEUE:
            self._kueue_member(None, uid, old)

    def in_group(self, uid: PodUID) -> bool:
        """Whether the pod names a group (existing or not): it is never placed alone."""
        return uid in self._refs

    def resolve(self, namespace: str, api: str, name: str) -> PodGroup | None:
        groups = self.groups
        if api == _ANY:
            return groups.get(group_key(VOLCANO, namespace, name)) or groups.get(group_key(XK8S, namespace, name))
        return groups.get(group_key(api, namespace, name))

    def group_of(self, uid: PodUID) -> PodGroup | None:
        ref = self._refs.get(uid)
        return None if ref is None else self.resolve(*ref)

    def member_uids(self, group: PodGroup) -> list[PodUID]:
        """The pods naming ``group``: by its own API, or by the annotation both APIs
        share when that resolves to it."""
        out: list[PodUID] = []
        ns, name = group.namespace, group.name
        out.extend(self._by_ref.get((ns, group.api, name), ()))
        shared = self._by_ref.get((ns, _ANY, name))
        if shared:
            g = self.resolve(ns, _ANY, name)
            if g is not None and g.key == group.key:
                out.extend(shared)
        return out

    def tally(self, group: PodGroup, state: ClusterState) -> Tally:
        t = Tally()
        for uid in self.member_uids(group):
            pod = state.pods.get(uid)
            if pod is None:
                continue
            if not state.ours(pod):
                t.foreign += 1
                continue
            if pod.phase == "Running":
                t.running += 1
            if uid in state.assumed or pod.holds_resources:
                t.holding.append(pod)
                if pod.holds_resources:
                    t.bound.append(pod)
            elif pod.phase == "Succeeded":
                t.succeeded += 1
            elif pod.phase == "Failed":
                t.failed += 1
                continue
            elif uid in state.pending:
                t.pending.append(pod)
                continue
            else:
                continue
            task = _task(pod)
            t.placed_by_task[task] = t.placed_by_task.get(task, 0) + 1
        return t

    def priority(self, group: PodGroup, members: Iterable[Pod]) -> int:
        if group.priority_class and group.priority_class in self.priority_classes:
            return self.priority_classes[group.priority_class]
        return max((p.priority for p in members), default=0)

    def never_preempts(self, group: PodGroup, members: Iterable[Pod]) -> bool:
        """Whether ``group`` may not evict anyone: its priority class says
        ``preemptionPolicy: Never``, or (when it names no known class) a member does, since
        the gang preempts for all of them (the policy comes from where its priority does)."""
        if group.priority_class and group.priority_class in self.priority_classes:
            return group.priority_class in self.never_classes
        return any(p.never_preempts for p in members)

    def timed(self) -> list[GroupKey]:
        """The groups with a gang timer (partly placed, or backing off after a timeout)."""
        return list(self._timers)

    def backing_off(self, key: GroupKey, now: float) -> bool:
        timer = self._timers.get(key)
        return timer is not None and now < timer.backoff_until

    def placed_whole(self, key: str) -> None:
        """A cycle placed the group's quorum. It runs whole only once the watch shows its
        members bound (:meth:`confirmed`): a Binding may still be refused, and a job that
        never ran is placed again, not restarted."""
        if GroupKey(key) in self.groups and GroupKey(key) not in self._was_whole:
            self._placing.setdefault(GroupKey(key), set())

    def confirmed(self, pod: Pod, state: ClusterState) -> None:
        """The watch shows ``pod`` bound: once its group's placed quorum is all bound, the
        group runs whole, and from then on losing a member is a loss (a job that restarts
        whole does so at once, not after the next :meth:`check`)."""
        group = self.group_of(pod.uid)
        seen = None if group is None else self._placing.get(group.key)
        if group is None or seen is None or not pod.holds_resources:
            return
        seen.add(pod.uid)
        if len(seen) >= group.min_member and _runs_whole(group, self.tally(group, state)):
            del self._placing[group.key]
            self._was_whole.add(group.key)

    def evicting(self, key: GroupKey) -> set[PodUID]:
        timer = self._timers.get(key)
        return set() if timer is None else timer.evicting

    def eviction_done(self, key: GroupKey, uid: PodUID) -> None:
        timer = self._timers.get(key)
        if timer is not None:
            timer.evicting.discard(uid)

    # -- the cycle's units -----------------------------------------------------------------

    def units(
        self,
        state: ClusterState,
        now: float,
        room: Room | None = None,
        want: Callable[[str], bool] | None = None,
    ) -> list[Unit]:
        """One unit per group (or missing group) with pods waiting to be placed.

        ``room(group, pods)`` gives what the group could have: the cluster's free capacity
        (see :func:`free_capacity`) and what it may preempt; it is only called when a group
        has ``minResources``. ``want(key)``: whether to build the group's unit at all (the
        session leaves out gangs that sleep; groups still missing are always built).
        """
        units: list[Unit] = []
        # only groups with a pending member have anything to place
        missing: dict[tuple[str, str], list[Pod]] = {}
        waiting: set[GroupKey] = set()
        pending = state.pending
        resolved = self._resolved
        if resolved[0] != self.version:
            resolved = self._resolved = (self.version, {})
        for ref, uids in self._by_ref.items():
            group = resolved[1].get(ref, _UNKNOWN)
            if group is _UNKNOWN:
                group = resolved[1][ref] = self.resolve(*ref)
            if group is not None and (group.key in waiting or (want is not None and not want(group.key))):
                continue  # known to wait, or it sleeps: its members are not looked at
            for uid in uids:
                pod = pending.get(uid)
                if pod is None or pod.gated:
                    continue
                if group is not None:
                    waiting.add(group.key)
                    break
                missing.setdefault((ref[0], ref[2]), []).append(pod)
        for (ns, name), named in sorted(missing.items()):
            key = GroupKey(f"missing:{ns}/{name}")
            units.append(_blocked(key, tuple(sorted(named, key=_member_order)), 0, 0.0, "",
                                  f"waiting for PodGroup {ns}/{name} to exist", "PodGroupNotFound"))
        for key in sorted(waiting):
            group = self.groups[key]
            t = self.tally(group, state)
            t.pending.sort(key=_member_order)
            schedulable = t.schedulable
            if not schedulable:
                continue
            priority = self.priority(group, schedulable)
            pods = tuple(schedulable)
            reason, blocked = self._blocked_reason(group, t, now)
            short = ""
            if not blocked and group.min_resources and t.placed < group.min_member:
                free, preemptible = room(group, pods) if room is not None else ({}, {})
                short = _short_of(group, t, free, preemptible)
            if blocked:
                units.append(_blocked(key, pods, priority, group.created, group.uid, blocked, reason))
                continue
            ordered, min_count = _quorum_first(group, t)
            if short:  # not placed: its count only sizes the reservation it may hold
                min_count = _covering(group, t, ordered, min_count)
            try:
                level, required = topology_policy(_topology_annotations(group, ordered), self.levels)
            except ValueError as exc:
                units.append(_blocked(key, pods, priority, group.created, group.uid, str(exc), "InvalidTopology"))
                continue
            units.append(
                Unit(
                    key=key, pods=tuple(ordered), min_count=min_count, priority=priority,
                    never_preempts=self.never_preempts(group, pods),
                    created=group.created, arrival=group.arrival, uid=group.uid or key, topology_level=level,
                    topology_required=required, min_resources_short=short,
                    placed_on=_placed_on(state, t) if required else (),
                )
            )
        return units

    def _blocked_reason(self, group: PodGroup, t: Tally, now: float) -> tuple[str, str]:
        """``(condition reason, message)`` of why the group may not be placed now, or ("", "")."""
        if group.invalid:
            return "InvalidPodGroup", f"{group.described} is invalid: {group.invalid}"
        if group.suspended:
            return "Suspended", explain.suspended(group.display)
        timer = self._timers.get(group.key)
        if timer is not None and now < timer.backoff_until:
            return "GangBackoff", timer.backoff_message
        evicting = sum(p.uid in timer.evicting for p in t.bound) if timer is not None else 0
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
            have = t.placed_by_task.get(task, 0) + sum(1 for p in schedulable if _task(p) == task)
            if have < need:
                return "WaitingForMembers", (
                    f"waiting for pods: task {task} has {have} of {need} required members"
                )
        return "", ""

    def blocked_message(self, group: PodGroup, now: float) -> str:
        """Why a group that is backing off waits (empty when it is not)."""
        timer = self._timers.get(group.key)
        return timer.backoff_message if timer is not None and now < timer.backoff_until else ""

    def admitted(self, group: PodGroup, state: ClusterState, now: float, room: Room) -> bool:
        """Whether the group may start (Volcano's Inqueue): valid, not backing off, and
        ``minResources`` fits in what is free or it may preempt (besides what its members
        already hold)."""
        if group.invalid or self.backing_off(group.key, now):
            return False
        if not group.min_resources:
            return True
        t = self.tally(group, state)
        return not _short_of(group, t, *room(group, t.pending))

    # -- no partial gang survives ----------------------------------------------------------

    def check(self, state: ClusterState, now: float) -> GangCheck:
        """Start, run out and enforce the timers of groups placed below their quorum."""
        out = GangCheck()
        self.lost = False
        dirty, self._dirty = self._dirty, set()
        for key, group in self.groups.items():
            timer = self._timers.get(key)
            if timer is not None and timer.evicting:
                timer.evicting &= state.pods.keys()  # those gone are done
            if group.invalid or (timer is None and dirty is not None and (group.namespace, group.name) not in dirty):
                continue  # unchanged since it was last found whole or holding nothing
            t = self.tally(group, state)
            if not t.ours:
                continue
            whole = t.placed >= group.min_member and all(
                t.placed_by_task.get(task, 0) >= need for task, need in group.min_task_member.items()
            )
            # members all terminating already: nothing a timeout could evict, so no timer (it
            # would announce an eviction it cannot make, again after every back-off)
            if whole and _runs_whole(group, t):
                self._placing.pop(key, None)
                self._was_whole.add(key)
            if whole or not t.holding or all(p.deleting for p in t.holding):
                if timer is not None:
                    timer.partial_since = None
                    if whole and not timer.was_whole:
                        timer.was_whole = True
                        timer.timeouts = 0
                continue
            if timer is None:
                timer = self._timers[key] = _Timer()
            if key in self._was_whole and group.restarts_whole(self.whole_job_restart):
                # a running job lost a member: the rest goes now, and it restarts whole
                self._was_whole.discard(key)
                out.notices.append(GroupNotice(group, "Warning", "WholeJobRestart", explain.whole_job_restart(
                    t.placed, group.min_member, len(t.bound),
                )))
                self._evict(group, t, timer, out, explain.whole_job_restart_eviction(), cause="restart")
                continue
            if now < timer.backoff_until:
                # members bound after the timeout (their binding was in flight): evict them too
                self._evict(group, t, timer, out, "it is backing off after a schedule timeout")
                continue
            if timer.partial_since is None:
                timer.partial_since = now
                out.notices.append(GroupNotice(
                    group, "Warning", "GangIncomplete",
                    f"{t.placed} of {group.min_member} required members are placed; "
                    f"retrying the other {group.min_member - t.placed} as one gang",
                ))
                continue
            limit = group.schedule_timeout or self.default_timeout
            if now - timer.partial_since < limit:
                continue
            backoff = min(self.initial_backoff * 2 ** timer.timeouts, self.max_backoff)
            timer.timeouts += 1
            timer.was_whole = False
            timer.partial_since = None
            timer.backoff_until = now + backoff
            timer.backoff_message = (
                f"gang {group.display} timed out after {limit:g} s with {t.placed} of "
                f"{group.min_member} required members placed; its bound members were evicted "
                f"and it is retried after {backoff:g} s"
            )
            out.notices.append(GroupNotice(
                group, "Warning", "GangTimeout",
                f"only {t.placed} of {group.min_member} required members were placed within "
                f"{limit:g} s; evicting the {len(t.bound)} bound member(s) to release their "
                f"resources and retrying the whole gang after {backoff:g} s",
            ))
            self._evict(group, t, timer, out, "its gang timed out below quorum")
        for key in [k for k in self._timers if k not in self.groups]:
            del self._timers[key]
        self._was_whole &= self.groups.keys()
        for key in [k for k in self._placing if k not in self.groups]:
            del self._placing[key]
        return out

    def _evict(self, group: PodGroup, t: Tally, timer: _Timer, out: GangCheck, why: str,
               *, cause: str = "gang-timeout") -> None:
        for pod in sorted(t.bound, key=_member_order):
            if pod.uid in timer.evicting or pod.deleting:
                continue
            timer.evicting.add(pod.uid)
            out.evictions.append(Eviction(
                uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node_name,
                unit=group.key, reason=f"member of PodGroup {group.display}: {why}", cause=cause,
            ))


def _runs_whole(group: PodGroup, t: Tally) -> bool:
    """Whether the group's quorum is bound as the watch shows it (or has run to success):
    members only assumed bound do not count, their Bindings may still be refused."""
    if len(t.bound) + t.succeeded < group.min_member:
        return False
    if not group.min_task_member:
        return True
    by_task = dict(t.placed_by_task)
    for pod in t.holding:
        if not pod.holds_resources:  # assumed only
            by_task[_task(pod)] -= 1
    return all(by_task.get(task, 0) >= need for task, need in group.min_task_member.items())


def _blocked(
    key: GroupKey, pods: tuple[Pod, ...], priority: int, created: float, uid: str, why: str, reason: str,
) -> Unit:
    return Unit(key=key, pods=pods, min_count=len(pods), priority=priority, created=created,
                uid=uid or key, blocked=why, blocked_reason=reason)


def _short_of(
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


def _topology_annotations(group: PodGroup, ordered: list[Pod]) -> Mapping[str, str]:
    """Where the gang's topology policy is read: its PodGroup, or when that asks nothing,
    the first member of its quorum (for tools that cannot annotate the PodGroup)."""
    ann = group.annotations
    if TOPOLOGY_ANNOTATION in ann or TOPOLOGY_PREFERRED_ANNOTATION in ann or not ordered:
        return ann
    return ordered[0].annotations


def _placed_on(state: ClusterState, t: Tally) -> tuple[str, ...]:
    """The nodes of the members holding resources, in member order."""
    nodes = (p.node_name or state.assumed.get(p.uid, "") for p in sorted(t.holding, key=_member_order))
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
            if _task(pod) == task:
                first.append(pod)
                taken.add(pod.uid)
                missing -= 1
    rest = [p for p in pending if p.uid not in taken]
    min_count = min(max(group.min_member - t.placed, len(first)), len(pending))
    return first + rest, min_count

