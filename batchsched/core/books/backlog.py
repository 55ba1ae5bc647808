"""The backlog: which units are worth handing to the next cycle.

Pending single pods are kept by equivalence class (:class:`~batchsched.core.equivalence.SingleIndex`),
gangs by their PodGroup (:class:`~batchsched.core.gangs.GroupBook`). A class or gang that
failed *sleeps* in the :class:`~batchsched.core.requeue.WaitBook` until an event could make
it fit (the wake rules and back-off of :mod:`batchsched.core.requeue`). Of each class that
is awake only the oldest members that could fit in the free capacity, and one more, are
handed over (the class is *cut*; the rest share its outcome); alike gangs are cut the same
way, by their class across gangs. A sleeper backing off is handed over anyway when the fair
order owes its queue a turn. Units that held a reservation or a nomination after the last
cycle are handed over whenever others are.

The caller tells the backlog what changed as values (a pod's place in the class index, a
gang changed, capacity freed, a cycle's plan) and reads back the units to try, and after a
cycle which classes and gangs failed (to be told so).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any

from batchsched.core import explain
from batchsched.core.disruption import DisruptionBudget
from batchsched.core.equivalence import (
    ClassKey,
    SingleIndex,
    arrival_order,
    fit_count,
    gang_like,
    own_class,
    pod_class,
    unit_class,
)
from batchsched.core.gangs import GroupBook, GroupKey, PodGroup
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import Pod, PodUID
from batchsched.core.placement.topology import TOPOLOGY_ANNOTATION, TOPOLOGY_PREFERRED_ANNOTATION
from batchsched.core.plan import Plan, QueueName, Unit, UnitResult, UnitStatus, single_unit
from batchsched.core.preemption import Room
from batchsched.core.queues import QUEUE_LABEL, QueueBook
from batchsched.core.queues.fair import Place
from batchsched.core.queues.heads import first_heads, narrowed, single_place
from batchsched.core.queues.tree import QueueTree
from batchsched.core.requeue import WaitBook
from batchsched.core.reservation import RESERVED

__all__ = ["Backlog"]

Order = tuple[int, float, int, str]
#: a gang's class across gangs, its order, its smallest member's request, its quorum
GangEntry = tuple[Any, Order, Mapping[str, int], int]
Fits = Callable[[Mapping[str, int]], int]


class Backlog:
    """The classes of single pods, the gang classes, the sleepers, cuts, fair turns and
    holders (one writer: this module)."""

    def __init__(self, *, retry: float) -> None:
        #: the slow retry timer: a sleeper is tried again after this, whatever happened
        self.retry = retry
        #: the pending single pods by equivalence class
        self.singles = SingleIndex()
        #: classes of single pods (``("class", key)``) and gangs (by unit key) that failed,
        #: asleep until an event could make them fit (:mod:`batchsched.core.requeue`)
        self.waits = WaitBook()
        self._node_generation = -1
        #: the queue trees whose usage fell since the last step (a charged pod went)
        self._freed_roots: set[str] = set()
        #: units that held a reservation or a nomination after the last cycle
        self._holders: set[str] = set()
        #: classes of single pods whose first member held a reservation after the last cycle
        self._holder_classes: set[Any] = set()
        #: the gangs by their class across gangs
        self.gangs = GangClasses(self.singles)
        #: units handed over for a fair turn in this step, and their classes of single pods
        #: (:mod:`batchsched.core.requeue`): they take free capacity only, and failing they
        #: are told nothing new (their regular try, with its victim search, tells them)
        self._turned: set[str] = set()
        self._turned_classes: set[Any] = set()
        #: classes of single pods cut short in this step: how many members were handed over
        self._cut: dict[Any, tuple[float, int, str]] = {}
        #: the queues whose units were not all handed over in this step (only their first
        #: ones: a first step's heads), and the place in each after which none was
        self.limits: Mapping[QueueName | None, Place] = {}

    # -- what changed ------------------------------------------------------------------------

    def read(self, pod: Pod) -> bool:
        """A pod seen: whether the label keys other pods' anti-affinity reads grew (then
        every class is found anew: a step is wanted)."""
        if self.singles.reads(pod):
            self._keyed_anew()
            return True
        return False

    def relisted(self, pods: Iterable[Pod]) -> bool:
        """A full list of the pods: the class index from scratch (see :meth:`read`)."""
        read = self.singles.read
        self.singles.clear()
        for pod in pods:
            self.singles.reads(pod)
        if self.singles.read != read:
            self._keyed_anew()
            return True
        return False

    def _keyed_anew(self) -> None:
        """The classes of gang members and of gangs are found anew, every gang is awake."""
        for key in self.gangs.keyed_anew():
            self.forget_gang(key)

    def place(self, uid: PodUID, pod: Pod | None) -> tuple[Any, Any]:
        """The pod's place in the class index (None: pending alone no more); returns its
        class before and after."""
        before = self.singles.class_of(uid)
        self.singles.put(uid, pod)
        return before, self.singles.class_of(uid)

    def class_of(self, uid: PodUID) -> Any:
        return self.singles.class_of(uid)

    def changed_class(self, was: Pod, now: Pod) -> bool:
        """Whether a pending pod's change changed what placement reads (its class)."""
        return bool(pod_class(was, self.singles.read) != pod_class(now, self.singles.read))

    def forget_gang(self, key: str) -> None:
        """The gang changed or was placed: worth trying at once, its class found anew."""
        self.waits.forget(key)
        self.gangs.forget(key)

    def forget_gangs(self, keys: Iterable[str]) -> bool:
        """Each of these gangs changed (see :meth:`forget_gang`); whether there was one."""
        found = False
        for key in keys:
            self.forget_gang(key)
            found = True
        return found

    def forget_class_of(self, uid: PodUID) -> None:
        """The pod's class is worth trying at once (no back-off carried over)."""
        ckey = self.singles.class_of(uid)
        if ckey is not None:
            self.waits.forget(("class", ckey))

    def group_changed(self, kind: str, old: PodGroup | None, group: PodGroup) -> bool:
        """A PodGroup event (``old``: the group before it): whether what decides its
        placement changed (then, or when it went, the gang is worth trying at once)."""
        spec = old is None or _spec(old) != _spec(group)
        if kind == "DELETED":
            self.holder_left(group.key, None)
        if kind == "DELETED" or spec:
            self.forget_gang(group.key)
        return spec

    def budget_changed(self, kind: str, old: DisruptionBudget | None, budget: DisruptionBudget) -> bool:
        """A disruption budget event: one that allowed no disruption and now allows some
        (or went) lets work it protected be preempted: every sleeper is worth trying at
        once (True)."""
        if old is not None and old.allowed == 0 and (kind == "DELETED" or budget.allowed > 0):
            self.forget_all()
            return True
        return False

    def forget_all(self) -> None:
        """Queues, namespaces or budgets changed: every sleeper is worth trying at once."""
        self.waits.forget_all()

    def holder_left(self, key: str, group: str | None) -> bool:
        """A pod of the unit ``key`` (of ``group``) was bound, ended or went: if its unit held
        room for itself, that room is free to take (everyone wakes; True)."""
        if key in self._holders or (group is not None and group in self._holders):
            self.waits.wake_all()
            return True
        return False

    def member_gone(self, uid: PodUID) -> None:
        self.gangs.member_gone(uid)

    def freed_root(self, root: str | None) -> None:
        """The usage of the queue tree ``root`` fell (a charged pod went; None: no queue)."""
        if root is not None:
            self._freed_roots.add(root)

    def pod_changed(
        self, kind: str, pod: Pod, *, was: Pod | None, now: Pod | None, group: str | None, now_group: str | None,
        moved: bool, capacity: bool,
    ) -> bool:
        """A pod event, as the mirror took it: ``was`` and ``now``, the pending pod before and
        after (None: not pending); ``group`` and ``now_group``, its gang's key before and
        after; ``moved``, whether its gang changed; ``capacity``, whether the event changed
        capacity (a step is wanted for that alone). Returns whether it is worth a step."""
        wake = False
        gangs = [k for k in (group, now_group) if k is not None]
        # a member arrived, left, or changed what placement reads: the gang is tried again
        # (not for a change of its status, such as the condition we wrote)
        if now is not None and gangs and (kind == "DELETED" or was is None or moved or self.changed_class(was, now)):
            for key in gangs:
                self.forget_gang(key)
            wake = True
        if kind == "DELETED" or pod.holds_resources or pod.terminal:
            self.gangs.member_gone(pod.uid)
            wake = (was is not None and self.holder_left(pod.key, group)) or wake
        if not capacity and now is not None and (was is None or was is not now):
            # new or changed: worth a step unless its class sleeps (a gang's member was
            # handled above; a gated pod waits)
            wake = self.pending_changed(pod.uid) or wake
        return wake

    def pending_changed(self, uid: PodUID) -> bool:
        """A pending single pod is new or changed: whether that is worth a step (not when
        its class sleeps: it would fail alike)."""
        ckey = self.singles.class_of(uid)
        if own_class(ckey):
            self.waits.forget(("class", ckey))  # a class of its own: any change may matter
        return ckey is not None and ("class", ckey) not in self.waits

    def not_bound(self, uid: PodUID, pod: Pod | None, now: float) -> None:
        """A pod's binding was refused or unanswered: its class waits out a back-off
        instead of being bound again, and failing again, at once."""
        ckey = self.singles.class_of(uid)
        if ckey is not None and pod is not None:
            self.waits.sleep(("class", ckey), now, pod.requests)
            self.waits.wake(("class", ckey))

    def wake(self, state: ClusterState) -> None:
        """Wake the sleepers the events since the last step could make fit."""
        if state.node_generation != self._node_generation:
            self._node_generation = state.node_generation
            self.waits.wake_all()
        freed = state.freed_nodes
        if freed or self._freed_roots:
            rows = [state.node_row[n] for n in freed if n in state.node_row]
            columns = {c: i for i, c in enumerate(state.columns)}
            self.waits.freed((state.alloc[r] - state.used[r] for r in rows), columns, self._freed_roots)
            freed.clear()
            self._freed_roots.clear()

    def prune(self, groups: GroupBook) -> None:
        """Forget sleepers whose class or gang has no pods left, and classes no pod has."""
        def still_waiting(key: object) -> bool:
            if isinstance(key, tuple) and key[0] == "class":
                return key[1] in self.singles.classes
            return isinstance(key, str) and GroupKey(key) in groups.groups

        self.waits.prune(still_waiting)
        self.gangs.prune(self.waits)

    # -- what the views read -------------------------------------------------------------------

    @property
    def holding_count(self) -> int:
        return len(self._holders)

    def holds(self, key: str) -> bool:
        return key in self._holders

    @property
    def turned(self) -> frozenset[str]:
        """The units handed over for a fair turn in this step."""
        return frozenset(self._turned)

    def asleep_class(self, ckey: Any) -> bool:
        return ("class", ckey) in self.waits

    # -- the units to try ------------------------------------------------------------------------

    def units(
        self, now: float, *, state: ClusterState, groups: GroupBook, queues: QueueBook,
        nominated: Mapping[str, Any], snapshot: Callable[[], Snapshot], restored: bool,
        heads: int | None = None,
    ) -> list[Unit]:
        """The units worth trying at ``now``: pending and not gated; of each class of single
        pods that is awake, the oldest members that could fit in the free capacity and one
        more (:func:`~batchsched.core.equivalence.fit_count`); each gang that is awake (or
        blocked, to be told so); and every unit holding a nomination (``nominated``), asleep
        or not. ``snapshot()``: the step's snapshot; ``restored``: the nominations of before
        a start were looked at (else pods nominated then are tried too). ``heads``: of the
        gangs awake only the first ``heads`` of each queue, of each class its first
        ``heads`` members at most (:mod:`batchsched.core.queues.heads`; :attr:`limits`
        says where each queue was cut)."""
        self.gangs.new_step()
        units: list[Unit] = []
        seen: set[PodUID] = set()
        self._cut = {}
        self.limits = {}
        fits = _fitter(snapshot)
        tree = functools.cache(lambda: queues.tree(snapshot().columns))

        def hand(ckey: Any, members: Any, heads: int | None = None) -> None:
            limit = len(members)
            if limit > 2:
                fit = fits(members[0].requests)
                # one more than fits (two: the first may only hold a reservation)
                if 0 <= fit < limit - 2:
                    limit = fit + 2
                    self._cut[ckey] = arrival_order(members[limit - 1])
            if heads is not None and heads < limit:
                # the first step's heads: the class's first members (alike: the class's
                # word is shared as when cut to what fits), and where its queue is cut
                limit = heads
                last = members[limit - 1]
                self._cut[ckey] = arrival_order(last)
                found = single_place(last, queues, tree(), now)
                if found is not None:
                    self.limits = narrowed(self.limits, *found)
            for pod in members.islice(0, limit):
                seen.add(pod.uid)
                units.append(single_unit(pod))

        for ckey, members in self.singles.items():
            if not self.waits.asleep(("class", ckey), now, self.retry):
                hand(ckey, members, heads)
        for key in nominated:
            uid = state.by_name.get(tuple(key.split("/", 1)))  # type: ignore[arg-type]
            if uid is not None and uid not in seen and self.singles.class_of(uid) is not None:
                seen.add(uid)
                units.append(single_unit(state.pending[uid]))
        if not restored:
            # after a start: pods nominated before it are looked at, wherever they queue
            for uid in self.singles.nominated(seen):
                units.append(single_unit(state.pending[uid]))
        room = Room(state, groups, queues, snapshot, now)
        units.extend(self._gangs(now, state, groups, queues, room, nominated, fits, tree, heads))
        before = len(units)
        self._turn(now, units, hand, seen, state=state, groups=groups, queues=queues, room=room,
                   nominated=nominated, snapshot=snapshot, fits=fits)
        self._turned = {u.key for u in units[before:]}
        if units and self._holders:
            # reservations hold room against the others tried in a cycle: their holders
            # are tried too, asleep or not (with nothing else to try, they may sleep)
            for ckey in self._holder_classes:
                members = self.singles.classes.get(ckey)
                if members is not None and members[0].uid not in seen:
                    hand(ckey, members)
            built = {u.key for u in units}
            holders = {k for k in self._holders if k not in built and GroupKey(k) in groups.groups}
            if holders:
                units.extend(groups.units(state, now, room, want=holders.__contains__))
        return units

    def _turn(
        self, now: float, units: list[Unit], hand: Callable[[Any, Any], None], seen: set[PodUID], *,
        state: ClusterState, groups: GroupBook, queues: QueueBook, room: Room, nominated: Mapping[str, Any],
        snapshot: Callable[[], Snapshot], fits: Fits,
    ) -> None:
        """The sleepers given a fair turn, handed over (appended to ``units``)."""
        gang_turns: list[tuple[Order, str]] = []
        self._turned_classes = set()
        for turn in self._fair_turns(now, units, state, groups, queues, snapshot, fits):
            if isinstance(turn, tuple):  # a class of single pods: its first members, as when awake
                members = self.singles.classes.get(turn[1])
                if members is not None and members[0].uid not in seen:
                    self._turned_classes.add(turn[1])
                    hand(turn[1], members)
            elif isinstance(turn, str) and turn in self.gangs and turn not in nominated:
                gang_turns.append((self.gangs.order_of(turn), turn))
        if gang_turns:
            units.extend(self._gang_turns(gang_turns, now, state, groups, room, nominated, fits))

    def _gangs(self, now: float, state: ClusterState, groups: GroupBook, queues: QueueBook, room: Room,
               nominated: Mapping[str, Any], fits: Fits, tree: Callable[[], QueueTree],
               heads: int | None) -> list[Unit]:
        """The gangs to hand to the cycle: those awake (with ``heads``, the first of each
        queue), and of each class of alike gangs only the oldest that could fit and one
        more (the rest share their outcome)."""
        def asleep(key: str) -> bool:
            return self.waits.asleep(key, now, self.retry)

        skip = self.gangs.cut_awake(nominated, asleep, fits)

        def want(key: str) -> bool:
            return key in nominated or (key not in skip and not asleep(key))

        if heads is not None:
            first = first_heads(groups, state, queues, tree(), now=now, per_queue=heads, want=want)
            if first.limits:
                for q, place in first.limits.items():
                    self.limits = narrowed(self.limits, q, place)

                def want(key: str) -> bool:
                    return key in nominated or key in first.keys

        return self.gangs.cut_alike(groups.units(state, now, room, want=want), groups, nominated, fits)

    def _gang_turns(self, turns: list[tuple[Order, str]], now: float, state: ClusterState, groups: GroupBook,
                    room: Room, nominated: Mapping[str, Any], fits: Fits) -> list[Unit]:
        """Gangs given a fair turn: of each class, as many as could fit and one more, built."""
        want = self.gangs.turns_wanted(turns, fits)
        return self.gangs.cut_alike(groups.units(state, now, room, want=want.__contains__), groups, nominated, fits)

    def _fair_turns(self, now: float, units: Sequence[Unit], state: ClusterState, groups: GroupBook,
                    queues: QueueBook, snapshot: Callable[[], Snapshot], fits: Fits) -> list[object]:
        """The sleepers backing off that are tried now anyway: those the fair order puts
        before a unit handed over from another queue of their cohort, and that free
        capacity could take now (the fair turn of :mod:`batchsched.core.requeue`)."""
        held = self.waits.backing_off(now, self.retry)
        if held and units:
            room = {key: fits(self.waits.sleepers[key].need) for key in held}
            held = {key: leaf for key, leaf in held.items()
                    if room[key] < 0 or room[key] >= (self.gangs.quorum_of(key) if isinstance(key, str) else 1)}
        if not held or not units:
            return []
        need = {key: self.waits.sleepers[key].need for key in held}
        return _first_owed(held, need, units, state=state, groups=groups, queues=queues, snapshot=snapshot, now=now,
                           head_order=lambda key: _head_order(key, self.singles, self.gangs))

    def classes(self, groups: GroupBook) -> Callable[[Unit], Any]:
        """Each unit's class, as the cycle groups alike units."""
        return self.gangs.of(groups)

    # -- after a cycle ---------------------------------------------------------------------------

    def sleep_classes(
        self, failed: Mapping[Any, tuple[str, str, Pod]], awake: set[Any], plan: Plan, queues: QueueBook,
        now: float,
    ) -> tuple[dict[Any, tuple[str, str]], bool]:
        """Classes of single pods that failed sleep (but those a victim search is owed to,
        ``awake``). Returns the word each failed class is to be told (a fair turn that failed
        is told nothing: its back-off runs on to its own try, with its victim search), and
        whether a step is wanted at once (a class was cut and none of it failed)."""
        told: dict[Any, tuple[str, str]] = {}
        for ckey, (reason, message, pod) in failed.items():
            if ckey in self._turned_classes:
                continue
            if ckey not in awake:
                self.waits.sleep(("class", ckey), now, pod.requests, quota=_quota_root(pod.key, plan, queues),
                                 queue=_waits_in(pod.key, queues))
            told[ckey] = (reason, message)
        return told, any(ckey not in failed for ckey in self._cut)

    @property
    def cut(self) -> frozenset[Any]:
        """The classes of single pods cut short in this step."""
        return frozenset(self._cut)

    def members_after_cut(self, ckey: Any) -> Iterable[Pod]:
        """The members of a class after the last one handed over (the order of the index)."""
        return self.singles.classes[ckey].irange_key(min_key=self._cut[ckey], inclusive=(False, True))  # type: ignore[no-any-return]

    def gang_result(
        self, unit: Unit, result: UnitResult, plan: Plan, *, groups: GroupBook, queues: QueueBook, now: float,
    ) -> None:
        """A gang's result: placed (or preempting) it is tried next cycle; failed, it sleeps."""
        key = unit.key
        if result.status is UnitStatus.SCHEDULED or result.holding:
            # placed, or it preempted others (or waits for them to go): tried next cycle
            self.forget_gang(key)
        elif (result.failed or result.reason == RESERVED) and not unit.blocked and key not in plan.deferred:
            # failed, or holds a reservation (tried again whenever others are)
            need = _smallest(unit)
            self.waits.sleep(key, now, need, quota=_quota_root(key, plan, queues), queue=_waits_in(key, queues))
            self.gangs.remember(unit, groups, need)

    def share_gang_results(
        self, plan: Plan, gangs: Mapping[str, Unit], groups: GroupBook, queues: QueueBook, now: float,
    ) -> tuple[list[tuple[list[str], UnitResult]], bool]:
        """Gangs left out as alike to others: when the class failed, they share its outcome
        and sleep (returned: their keys and the outcome to tell them); when it did not, they
        are handed over next (True: a step is wanted at once)."""
        first_failed = self.gangs.first_failed(plan, gangs, groups)
        shared_out: list[tuple[list[str], UnitResult]] = []
        again = False
        for ckey, keys in self.gangs.cut.items():
            first = first_failed.get(ckey)
            if first is None:
                again = True  # the class was not found failing: hand the rest over now
                continue
            result = plan.results[first.key]
            if result.reason == RESERVED:
                shared = UnitResult(UnitStatus.UNSCHEDULABLE, "Unschedulable", explain.behind(f"gang {first.display}"))
            else:
                shared = UnitResult(result.status, result.reason, explain.like_gang(first.display, result.message))
            if first.key in self._turned:
                continue  # a fair turn that failed: they wait for their own try, as they did
            quota, queue = _quota_root(first.key, plan, queues), _waits_in(first.key, queues)
            for key in keys:
                self.waits.sleep(key, now, self.gangs.need_of(key), quota=quota, queue=queue)
            shared_out.append((keys, shared))
        return shared_out, again

    def held(self, plan: Plan, gangs: Mapping[str, Unit]) -> None:
        """Which units hold a reservation or a nomination after the cycle (a holder a walk
        that stopped early did not reach still holds)."""
        kept = self._holders - set(plan.tried) if plan.unfinished else set()
        self._holders = kept | {k for k, r in plan.results.items() if r.holding or r.reason == RESERVED}
        self._holders.update(n.unit for n in plan.nominations)
        self._holder_classes = {
            self.singles.class_of(u.pod.uid) for u in plan.unschedulable
            if u.reason == RESERVED and u.unit not in gangs} - {None} | (self._holder_classes if kept else set())


class GangClasses:
    """Gangs by their class across gangs (their shape, members and queue): of a class of
    alike gangs only the oldest that could fit and one more are built and handed over, the
    rest are *cut* and share the class's outcome (one writer: this module)."""

    def __init__(self, singles: SingleIndex) -> None:
        #: the classes of single pods (read only here: a member's class is its own if single)
        self._singles = singles
        #: gang members' classes, by UID, with the version of the pod they were computed for
        self._member_classes: dict[PodUID, tuple[Pod, Any]] = {}
        self._member_keys: dict[Any, Any] = {}
        #: gang key -> its class across gangs, order, smallest member's request, quorum
        #: (kept while it sleeps: of a class woken together only the first few are built)
        self._entries: dict[str, GangEntry] = {}
        #: class -> the gangs of it left out of this step's cycle
        self._cut: dict[Any, list[str]] = {}
        #: this step's class of each gang handed over
        self._step: dict[str, Any] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def new_step(self) -> None:
        self._step = {}

    def keyed_anew(self) -> list[str]:
        """The label keys read grew: members' classes are found anew; returns the gangs
        known (each to be forgotten)."""
        self._member_classes.clear()
        self._member_keys.clear()
        return list(self._entries)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)

    def member_gone(self, uid: PodUID) -> None:
        self._member_classes.pop(uid, None)

    def prune(self, asleep: Container[object]) -> None:
        """Keep the classes of the gangs still ``asleep``, and the member classes in use."""
        self._entries = {k: v for k, v in self._entries.items() if k in asleep}
        live = {id(v[1]) for v in self._member_classes.values()}
        self._member_keys = {k: v for k, v in self._member_keys.items() if id(v) in live}

    def order_of(self, key: str) -> Order:
        return self._entries[key][1]

    def need_of(self, key: str) -> Mapping[str, int]:
        return self._entries[key][2]

    def quorum_of(self, key: str) -> int:
        """How many members of a sleeping gang must be placed together."""
        entry = self._entries.get(key)
        return max(entry[3], 1) if entry is not None else 1

    def remember(self, unit: Unit, groups: GroupBook, need: Mapping[str, int]) -> None:
        """A gang that sleeps: its class, kept while it does."""
        self._entries[unit.key] = (self.key(unit, groups), unit.order(), need, unit.min_count)

    @property
    def cut(self) -> Mapping[Any, list[str]]:
        """Class -> the gangs of it left out of this step's cycle."""
        return self._cut

    def cut_awake(self, nominated: Mapping[str, Any], asleep: Callable[[str], bool], fits: Fits) -> set[str]:
        """Of the gangs known to fail alike that are awake, those not to build at all (of
        each class, all but the first few)."""
        self._cut = {}
        awake: dict[Any, list[tuple[Order, str]]] = {}
        for key, (ckey, order, _, _) in self._entries.items():
            if key not in nominated and not asleep(key):
                awake.setdefault(ckey, []).append((order, key))
        skip: set[str] = set()
        for ckey, members in awake.items():
            members.sort()
            n = _gang_fit(self._entries[members[0][1]], fits, len(members))
            if n < len(members):
                self._cut[ckey] = [k for _, k in members[n:]]
                skip.update(k for _, k in members[n:])
        return skip

    def cut_alike(self, built: list[Unit], groups: GroupBook, nominated: Mapping[str, Any], fits: Fits) -> list[Unit]:
        """Of each class of alike gangs built, the oldest that could fit and one more; the
        rest are left out (:attr:`cut`) to share their outcome."""
        out: list[Unit] = []
        by_class: dict[Any, list[Unit]] = {}
        for unit in built:
            ckey = self.key(unit, groups)
            if unit.blocked or unit.key in nominated or not gang_like(ckey.parts[1]):
                out.append(unit)
            else:
                by_class.setdefault(ckey, []).append(unit)
        for ckey, alike in by_class.items():
            alike.sort(key=Unit.order)
            first = alike[0]
            need = _smallest(first)  # alike members ask alike: the same for every gang of the class
            n = _gang_fit((ckey, first.order(), need, first.min_count), fits, len(alike))
            out.extend(alike[:n])
            if n < len(alike):
                self._cut.setdefault(ckey, []).extend(u.key for u in alike[n:])
                for u in alike[n:]:
                    self._entries[u.key] = (ckey, u.order(), need, u.min_count)
        return out

    def turns_wanted(self, turns: list[tuple[Order, str]], fits: Fits) -> set[str]:
        """Of the gangs given a fair turn, of each class as many as could fit and one more."""
        by_class: dict[Any, list[tuple[Order, str]]] = {}
        for order, key in sorted(turns):
            by_class.setdefault(self._entries[key][0], []).append((order, key))
        want: set[str] = set()
        for alike in by_class.values():
            n = _gang_fit(self._entries[alike[0][1]], fits, len(alike))
            want.update(key for _, key in alike[:n])
        return want

    def first_failed(self, plan: Plan, gangs: Mapping[str, Unit], groups: GroupBook) -> dict[Any, Unit]:
        """Of each class of the gangs handed over, the first that failed (or holds a
        reservation) in ``plan``, its victim search not owed."""
        out: dict[Any, Unit] = {}
        for key, unit in gangs.items():
            result = plan.results.get(key)
            if result is None or unit.blocked:
                continue
            ckey = self.key(unit, groups)
            if (result.failed or result.reason == RESERVED) and key not in plan.deferred:
                out.setdefault(ckey, unit)
        return out

    def _pod_class(self, pod: Pod) -> Any:
        """A pod's equivalence class: the index's for a single pod, else computed once per
        version of the pod."""
        found = self._singles.class_of(pod.uid)
        if found is not None:
            return found
        cached = self._member_classes.get(pod.uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        found = pod_class(pod, self._singles.read)
        found = self._member_keys.setdefault(found, found)  # one key object per class
        self._member_classes[pod.uid] = (pod, found)
        return found

    def key(self, unit: Unit, groups: GroupBook) -> Any:
        """A gang's class across gangs: its shape and members (:func:`unit_class`) and the
        queue its PodGroup names."""
        found = self._step.get(unit.key)
        if found is None:
            group = groups.groups.get(GroupKey(unit.key))
            queue = (group.queue, group.labels.get(QUEUE_LABEL, "")) if group is not None else ("", "")
            found = self._step[unit.key] = ClassKey((queue, unit_class(unit, self._pod_class)))
        return found

    def of(self, groups: GroupBook) -> Callable[[Unit], Any]:
        """Each unit's class, as the cycle groups alike units."""
        def of(unit: Unit) -> Any:
            return unit_class(unit, self._pod_class) if unit.single else self.key(unit, groups)

        return of


def _first_owed(
    held: Mapping[object, str], need: Mapping[object, Mapping[str, int]], units: Sequence[Unit], *,
    state: ClusterState, groups: GroupBook, queues: QueueBook, snapshot: Callable[[], Snapshot], now: float,
    head_order: Callable[[object], Order],
) -> list[object]:
    """Of the sleepers ``held`` back (key -> the queue each waits in; ``need``: what each
    asks), the first of each queue that the fair order puts before a unit handed over from
    another queue of its cohort (``head_order``: where a sleeper comes in its queue)."""
    structure = queues.structure()
    asks: dict[object, tuple[str, Mapping[str, int]]] = {}
    for unit in units:
        if not unit.blocked:
            q = queues.queue_of(unit.pods, groups.groups.get(GroupKey(unit.key)), structure)
            if isinstance(q, str):
                asks[unit.key] = (q, _quorum(unit))
    if not asks:
        return []
    awake = set(asks)
    asks.update((key, (q, need[key])) for key, q in held.items())
    ranks = queues.ranks(asks, state=state, groups=groups, snap=snapshot(), now=now)
    last: dict[str, dict[str, tuple[bool, float]]] = {}  # cohort -> queue -> its last unit awake
    for key in awake & ranks.keys():
        root, rank = ranks[key]
        by_queue = last.setdefault(root, {})
        leaf = asks[key][0]
        by_queue[leaf] = max(by_queue.get(leaf, rank), rank)
    heads: dict[str, tuple[Order, object]] = {}  # queue -> its first sleeper due a turn
    for key, leaf in held.items():
        if key in ranks and any(other != leaf and rank > ranks[key][1]
                                for other, rank in last.get(ranks[key][0], {}).items()):
            order = head_order(key)
            if leaf not in heads or order < heads[leaf][0]:
                heads[leaf] = (order, key)
    return [key for _, key in heads.values()]


def _spec(group: PodGroup) -> tuple[Any, ...]:
    """What of a group decides its placement (its status, which we write, does not)."""
    return (
        group.min_member, dict(group.min_resources), dict(group.min_task_member),
        group.priority_class, group.invalid, group.uid, group.queue, group.labels.get(QUEUE_LABEL),
        group.annotations.get(TOPOLOGY_ANNOTATION), group.annotations.get(TOPOLOGY_PREFERRED_ANNOTATION),
        group.upstream, group.suspended,
    )


def _head_order(key: object, singles: SingleIndex, gangs: GangClasses) -> Order:
    """Where a sleeper comes in its queue: its first pod's (a class) or its own (a gang)
    priority, then first come, first served (:meth:`~batchsched.core.plan.Unit.order`)."""
    if isinstance(key, tuple):
        members = singles.classes.get(key[1])
        if members:
            pod = members[0]
            return (-pod.priority, pod.created, pod.arrival, pod.uid)
    elif isinstance(key, str) and key in gangs:
        return gangs.order_of(key)
    return (0, float("inf"), 0, "")


def _quota_root(key: str, plan: Plan, queues: QueueBook) -> str | None:
    """For a unit its queue's quota held back: the top of that queue's tree (whose usage
    falling wakes it); None when quota did not hold it back."""
    if key not in plan.quota_blocked:
        return None
    q = queues.waiting.get(key)
    return queues.root_of(q) if isinstance(q, str) else ""


def _waits_in(key: str, queues: QueueBook) -> str | None:
    """The queue a unit the last cycle tried waits in (None: unqueued or a problem)."""
    q = queues.waiting.get(key)
    return q if isinstance(q, str) else None


def _fitter(snapshot: Callable[[], Snapshot]) -> Fits:
    """How many times a request fits in the free capacity of the snapshot (taken when
    first asked). Each distinct request is counted once per step: thousands of sleepers
    backing off ask a few dozen different requests between them."""
    free: Any = None
    columns: dict[str, int] = {}
    counted: dict[tuple[tuple[str, int], ...], int] = {}

    def fits(need: Mapping[str, int]) -> int:
        nonlocal free, columns
        key = tuple(need.items())
        found = counted.get(key)
        if found is not None:
            return found
        if free is None:
            snap = snapshot()
            free = snap.alloc - snap.used
            columns = {c: i for i, c in enumerate(snap.columns)}
        found = counted[key] = fit_count(free, columns, need)
        return found

    return fits


def _gang_fit(entry: GangEntry, fits: Fits, count: int) -> int:
    """How many gangs of a class to hand over: as many as could fit, and one more."""
    _, _, need, quorum = entry
    per = fits(need)
    return count if per < 0 else min(count, per // max(quorum, 1) + 1)


def _smallest(unit: Unit) -> dict[str, int]:
    """What one node must have free for the gang's smallest member (each resource)."""
    need: dict[str, int] = {}
    for i, pod in enumerate(unit.pods):
        for name, value in pod.requests.items():
            need[name] = value if i == 0 else min(need.get(name, 0), value)
        if i:
            for name in [n for n in need if n not in pod.requests]:
                need[name] = 0
    return need


def _quorum(unit: Unit) -> dict[str, int]:
    """What a unit's quorum asks for in all (a single pod's request)."""
    total: dict[str, int] = {}
    for pod in unit.pods[: max(unit.min_count, 1)]:
        for name, value in pod.requests.items():
            total[name] = total.get(name, 0) + value
    return total
