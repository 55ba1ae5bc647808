"""The book of gangs: the groups, which pods name which group, and the cycle's units.

:class:`GroupBook` mirrors the groups (one writer, like :class:`~batchsched.core.mirror.ClusterState`)
and indexes pods by the group they name: that index is its own state. The rest of what it
answers is kept by parts it is composed of, each the one owner of its state:

- :class:`~batchsched.core.gangs.timers.GangTimers` (:attr:`GroupBook.timers`): no partial
  gang survives; the gang timers, the back-off after a timeout, which groups run whole,
  whole-job restart (:meth:`GroupBook.check`);
- :class:`~batchsched.core.gangs.priority.PriorityClasses` (:attr:`GroupBook.classes`): a
  gang's priority and preemption policy;
- :mod:`~batchsched.core.gangs.units`: each cycle, one :class:`~batchsched.core.plan.Unit`
  per group with pending members, blocked and why, or its members in the order to place
  them (:meth:`GroupBook.units`);
- :mod:`~batchsched.core.gangs.status`: how a group's members are counted and ordered.

The book tells its parts what the index learns (a member of a group left, a group was
deleted) and hands them the groups and counts they ask for; they never reach into it.

Pure: no I/O, no clock (``now`` is passed in, monotonic seconds).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import numpy as np

from batchsched.core.gangs.podgroup import (
    _ANY,
    KUEUE,
    VOLCANO,
    XK8S,
    GroupKey,
    PodGroup,
    group_key,
    group_ref,
    kueue_group,
)
from batchsched.core.gangs.priority import PriorityClasses
from batchsched.core.gangs.status import Tally, task_of
from batchsched.core.gangs.timers import GangCheck, GangTimers, GroupNotice
from batchsched.core.gangs.units import Room, gang_unit, missing_unit, short_of
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import Arrivals, Pod, PodUID
from batchsched.core.placement.topology import TopologyLevels
from batchsched.core.plan import Unit

__all__ = [
    "GangCheck",
    "GroupBook",
    "GroupNotice",
    "Room",
    "free_capacity",
]

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


class GroupBook:
    """PodGroups of every API and which pods name which group; the gang timers and the
    priority classes through its parts."""

    def __init__(
        self,
        *,
        default_timeout: float = 300.0,
        initial_backoff: float = 10.0,
        max_backoff: float = 300.0,
        levels: TopologyLevels | None = None,
        whole_job_restart: bool = False,
    ) -> None:
        self.timers = GangTimers(
            default_timeout=default_timeout, initial_backoff=initial_backoff,
            max_backoff=max_backoff, whole_job_restart=whole_job_restart,
        )
        self.classes = PriorityClasses()
        self.levels = levels if levels is not None else TopologyLevels()
        self.groups: dict[GroupKey, PodGroup] = {}
        #: pod uid -> (namespace, api or "any", group name)
        self._refs: dict[PodUID, tuple[str, str, str]] = {}
        #: (namespace, API, name) -> the pods naming the group that way
        self._by_ref: dict[tuple[str, str, str], set[PodUID]] = {}
        #: Kueue pod groups (read from their pods): each member's view of its group
        self._kueue_views: dict[GroupKey, dict[PodUID, PodGroup]] = {}
        #: bumps whenever a group changes (see :attr:`version`)
        self._groups_version = 0
        #: each group's place in line among those created in the same second
        self._arrivals = Arrivals()
        #: (namespace, name) of groups whose members or spec changed since the last
        #: :meth:`check` (None: all of them)
        self._dirty: set[tuple[str, str]] | None = None
        #: each pod reference -> its group (None: missing) and a member waiting to be placed
        #: (pending, not gated), None (no member waits) or not looked for yet. A reference's
        #: entry is dropped when the group it names (by namespace and name, whatever the
        #: API) changes or a member of it does (:meth:`_mark`: a group or pod event, or
        #: :meth:`touch` for a pod assumed or forgotten), all of them on a relist or when
        #: asked about another mirror. Only a pod event or a forgotten binding makes a
        #: member pending; a member found waiting is looked at again
        self._waiter: dict[tuple[str, str, str], tuple[PodGroup | None, Any]] = {}
        self._waiter_state: ClusterState | None = None
        #: (namespace, group name) -> the references to it
        self._refs_named: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
        #: each group's tally, while :meth:`tallies_kept` holds the mirror still (else None)
        self._tallies: dict[GroupKey, Tally] | None = None

    @property
    def version(self) -> int:
        """Bumps whenever a group or a priority class changes."""
        return self._groups_version + self.classes.version

    @property
    def priority_classes(self) -> dict[str, int]:
        return self.classes.values

    @property
    def never_classes(self) -> set[str]:
        """The priority classes whose ``preemptionPolicy`` is ``Never``."""
        return self.classes.never

    @property
    def lost(self) -> bool:
        """A member of a group seen whole failed or went since the last :meth:`check`: the
        next step checks at once (a replacement must not be placed into the remainder)."""
        return self.timers.lost

    # -- groups ----------------------------------------------------------------------------

    def group_event(self, kind: str, group: PodGroup) -> None:
        self._groups_version += 1
        self._mark((group.namespace, group.name))
        if kind == "DELETED":
            self.groups.pop(group.key, None)
            self.timers.forget(group.key)
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
        self.classes.event(kind, name, value, never)

    def replace_priority_classes(self, classes: Mapping[str, int], never: Iterable[str] = ()) -> None:
        """A relist: ``never`` names the classes whose ``preemptionPolicy`` is ``Never``."""
        self.classes.replace(classes, never)

    # -- pods --------------------------------------------------------------------------------

    def pod_event(self, kind: str, pod: Pod) -> None:
        """Keep the index of which pod names which group (call it next to the state's)."""
        ref = None if kind == "DELETED" else group_ref(pod)
        old = self._refs.get(pod.uid)
        if old is not None and (kind == "DELETED" or pod.terminal):
            group = self.resolve(*old)
            if group is not None:
                self.timers.member_left(group.key)
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
            self._by_ref.setdefault(new, set()).add(pod.uid)
            self._refs_named.setdefault((new[0], new[2]), set()).add(new)

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
        binding undone): its group is looked at again by the next :meth:`check`, and its
        tally kept by :meth:`tallies_kept` is counted again."""
        ref = self._refs.get(uid)
        if ref is not None:
            self._mark((ref[0], ref[2]))
        if self._tallies:
            group = self.group_of(uid)
            if group is not None:
                self._tallies.pop(group.key, None)

    def _mark(self, named: tuple[str, str]) -> None:
        if self._dirty is not None:
            self._dirty.add(named)
        for ref in self._refs_named.get(named, ()):
            self._waiter.pop(ref, None)

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        self._dirty = None
        self._waiter.clear()
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
        by_ref = self._by_ref.get(old)
        if by_ref is not None:
            by_ref.discard(uid)
            if not by_ref:
                del self._by_ref[old]
                refs = self._refs_named[(old[0], old[2])]
                refs.discard(old)
                if not refs:
                    del self._refs_named[(old[0], old[2])]
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

    @contextlib.contextmanager
    def tallies_kept(self) -> Iterator[None]:
        """Inside, each group's :meth:`tally` is counted once: for a step, over which the
        mirror does not change but for the pods the step assumes or forgets, each of which
        is passed to :meth:`touch` (its group counted again). A step's first after a start
        tallies every group: for the gang timers, the units, then the groups' statuses."""
        self._tallies = {}
        try:
            yield
        finally:
            self._tallies = None

    def tally(self, group: PodGroup, state: ClusterState) -> Tally:
        kept = self._tallies
        if kept is not None:
            found = kept.get(group.key)
            if found is None:
                found = kept[group.key] = self._tally(group, state)
            return found
        return self._tally(group, state)

    def _tally(self, group: PodGroup, state: ClusterState) -> Tally:
        t = Tally()
        pods, assumed, pending, ours = state.pods, state.assumed, state.pending, state.ours
        by_task = t.placed_by_task
        for uid in self.member_uids(group):
            pod = pods.get(uid)
            if pod is None:
                continue
            if not ours(pod):
                t.foreign += 1
                continue
            phase = pod.phase
            if phase == "Running":
                t.running += 1
            bound = pod.holds_resources
            if bound or uid in assumed:
                t.holding.append(pod)
                if bound:
                    t.bound.append(pod)
            elif phase == "Succeeded":
                t.succeeded += 1
            elif phase == "Failed":
                t.failed += 1
                continue
            elif uid in pending:
                t.pending.append(pod)
                continue
            else:
                continue
            task = task_of(pod)
            by_task[task] = by_task.get(task, 0) + 1
        return t

    # -- priority, timers ------------------------------------------------------------------

    def priority(self, group: PodGroup, members: Iterable[Pod]) -> int:
        return self.classes.priority(group, members)

    def never_preempts(self, group: PodGroup, members: Iterable[Pod]) -> bool:
        return self.classes.never_preempts(group, members)

    def timed(self) -> list[GroupKey]:
        """The groups with a gang timer (partly placed, or backing off after a timeout)."""
        return self.timers.timed()

    def backing_off(self, key: GroupKey, now: float) -> bool:
        return self.timers.backing_off(key, now)

    def blocked_message(self, group: PodGroup, now: float) -> str:
        """Why a group that is backing off waits (empty when it is not)."""
        return self.timers.blocked_message(group.key, now)

    def placed_whole(self, key: str) -> None:
        """A cycle placed the group's quorum. It runs whole only once the watch shows its
        members bound (:meth:`confirmed`): a Binding may still be refused, and a job that
        never ran is placed again, not restarted."""
        if GroupKey(key) in self.groups:
            self.timers.placed_whole(GroupKey(key))

    def confirmed(self, pod: Pod, state: ClusterState) -> None:
        """The watch shows ``pod`` bound: once its group's placed quorum is all bound, the
        group runs whole (see :meth:`GangTimers.confirmed`)."""
        group = self.group_of(pod.uid)
        if group is not None:
            self.timers.confirmed(group, pod, lambda: self.tally(group, state))

    def evicting(self, key: GroupKey) -> set[PodUID]:
        return self.timers.evicting(key)

    def eviction_done(self, key: GroupKey, uid: PodUID) -> None:
        self.timers.eviction_done(key, uid)

    def check(self, state: ClusterState, now: float) -> GangCheck:
        """Start, run out and enforce the timers of groups placed below their quorum
        (:meth:`GangTimers.check`), over the groups changed since the last check."""
        dirty, self._dirty = self._dirty, set()
        return self.timers.check(self.groups, dirty, lambda g: self.tally(g, state), state, now)

    # -- the cycle's units -----------------------------------------------------------------

    def units(
        self,
        state: ClusterState,
        now: float,
        room: Room | None = None,
        want: Callable[[str], bool] | None = None,
    ) -> list[Unit]:
        """One unit per group (or missing group) with pods waiting to be placed
        (:func:`~batchsched.core.gangs.units.gang_unit`).

        ``room(group, pods)`` gives what the group could have: the cluster's free capacity
        (see :func:`free_capacity`) and what it may preempt; it is only called when a group
        has ``minResources``. ``want(key)``: whether to build the group's unit at all (the
        session leaves out gangs that sleep; groups still missing are always built).
        """
        missing, waiting = self._waiting(state, want)
        units = [missing_unit(ns, name, named) for (ns, name), named in sorted(missing.items())]
        for key in sorted(waiting):
            group = self.groups[key]
            unit = gang_unit(group, self.tally(group, state), state=state, now=now, classes=self.classes,
                             timers=self.timers, levels=self.levels, room=room)
            if unit is not None:
                units.append(unit)
        return units

    def waiting(self, state: ClusterState, want: Callable[[str], bool] | None = None) -> list[PodGroup]:
        """The groups with a pending member, of those ``want(key)`` says (in key order)."""
        return [self.groups[key] for key in sorted(self._waiting(state, want)[1])]

    def _waiting(
        self, state: ClusterState, want: Callable[[str], bool] | None,
    ) -> tuple[dict[tuple[str, str], list[Pod]], set[GroupKey]]:
        """The pods waiting by the (namespace, name) of the missing group they name, and the
        groups with a pending member that are wanted: only they have anything to place."""
        missing: dict[tuple[str, str], list[Pod]] = {}
        waiting: set[GroupKey] = set()
        pending = state.pending
        if self._waiter_state is not state:
            self._waiter, self._waiter_state = {}, state
        entries = self._waiter
        for ref, uids in self._by_ref.items():
            entry = entries.get(ref)
            if entry is None:
                entry = entries[ref] = (self.resolve(*ref), _UNKNOWN)
            group, waiter = entry
            if group is None:
                missing_pods = [pod for uid in uids if (pod := pending.get(uid)) is not None and not pod.gated]
                if missing_pods:
                    missing.setdefault((ref[0], ref[2]), []).extend(missing_pods)
                continue
            if waiter is None:
                continue
            key = group.key
            if key in waiting:
                continue
            if waiter is _UNKNOWN or (pod := pending.get(cast(PodUID, waiter))) is None or pod.gated:
                # a member that waited may have been placed without a word to this book
                waiter = next((uid for uid in uids if (pod := pending.get(uid)) is not None and not pod.gated), None)
                entries[ref] = (group, waiter)
            if waiter is not None and (want is None or want(key)):  # not a group that sleeps
                waiting.add(key)
        return missing, waiting

    def admitted(self, group: PodGroup, state: ClusterState, now: float, room: Room) -> bool:
        """Whether the group may start (Volcano's Inqueue): valid, not backing off, and
        ``minResources`` fits in what is free or it may preempt (besides what its members
        already hold)."""
        if group.invalid or self.backing_off(group.key, now):
            return False
        if not group.min_resources:
            return True
        t = self.tally(group, state)
        return not short_of(group, t, *room(group, t.pending))
