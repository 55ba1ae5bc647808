"""One scheduling cycle: a snapshot and the units waiting for nodes in, a :class:`Plan` out.

Pure and deterministic: the same snapshot, units and :class:`QueueInput` give the same plan;
no I/O, no clock (the time is passed in).

A *unit* is what is placed all at once: a gang of pods, or a single pod (a gang of one).
The algorithm, in order:

1. Queues: build nothing, the caller passes a :class:`QueueInput` whose tree is not charged
   yet. Charge every running (bound or assumed) unit to its queue; treat the victims of
   earlier preemptions as gone and charge each preemptor's *nomination* (the nodes held for
   it) to those nodes and its queue, so nobody else takes the freed capacity. Record each
   leaf's usage in the usage history (when there is one).
2. Nominated units go first: once their victims are gone they are placed (normally on the
   nodes held for them); while victims remain, they are placed where nothing terminates if
   room freed there since, else they keep their nomination. A unit whose
   queue is unknown or unusable is reported (never placed under a silent default).
3. The rest is walked in fair order (:class:`~batchsched.core.queues.FairOrder`): among
   queues, the lowest weighted dominant share first, heads within their nominal before
   borrowers; within a queue (and for unqueued work) priority, then age, then arrival
   (:meth:`Unit.order`: first come, first served within a second). Runs of
   unqueued single pods that share their constraints go to the placement kernel together
   (best effort, one kernel call); any other unit is handed over alone with ``min_count``
   = its quorum, so the kernel places all of its first ``min_count`` members or none, and
   its extra (elastic) members only as room allows. A queued unit is first admitted by
   quota (its quorum, then as many extras as quota allows). A gang with a topology policy
   (:attr:`Unit.topology_level`) goes through
   :func:`~batchsched.core.placement.topology.place_gang_topology` instead of the bare kernel: its
   quorum inside one rack (or block...), else anywhere (preferred) or nowhere (required);
   the rest of a required gang whose members already hold nodes stays in their domain.
4. A unit whose quorum does not fit (by quota or on the nodes) may preempt:
   :mod:`batchsched.core.preemption.attempt` searches for victims it may evict and, when it
   finds them, records a :class:`Nomination`; the unit is bound in a later cycle, once its
   victims are gone. Else the head of its queue holds a reservation, which later units may
   use only if they cannot delay it (:mod:`batchsched.core.reservation`). A gang short of
   its ``minResources`` (:attr:`Unit.min_resources_short`) is not placed and seeks no victims,
   but takes its turn all the same: at the head of its queue it holds a reservation.
5. Each placed member becomes a :class:`Binding`; each pod that could not be placed
   becomes an :class:`Unschedulable` with a message a person can act on.

Since usage grows as the walk goes, a lower unit never takes what a higher one got, and a
gang never ends up partly placed while another takes the rest: no interleaving deadlock.

Every write of the cycle goes to one :class:`~batchsched.core.statement.Statement`: the
working usage, the queue charges, the victims' evictions, the reservations' holds and the
plan. The parts act on it side by side and never call each other back:
:class:`~batchsched.core.placer.Placer` lays units out and runs the kernels,
:class:`~batchsched.core.admission.Admission` records a placed unit,
:class:`~batchsched.core.preemption.CyclePreemption` evicts and nominates,
:class:`~batchsched.core.reservation.CycleReservations` holds nodes, and
:class:`~batchsched.core.accounting.RunningWork` charges the running work. :meth:`_Walk.run`
lists the phases in order; a unit's own turn is place, else preempt, else reserve
(:meth:`_Walk._unit`).

Without a :class:`QueueInput` (or with one holding no queues) every unit is unqueued and
the order is priority, then first come, first served, as kube-scheduler's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from batchsched.core import explain
from batchsched.core.accounting import RunningWork
from batchsched.core.admission import Admission
from batchsched.core.dra.book import DeviceCycle
from batchsched.core.equivalence import unit_class
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.placement.cards import CardPolicy
from batchsched.core.placement.layout import Layout, gang_message
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.placement.topology import TopologyLevels
from batchsched.core.placer import CycleKernels, Placer
from batchsched.core.plan import (
    INSUFFICIENT_MIN_RESOURCES,
    Plan,
    Unit,
    UnitResult,
    UnitStatus,
    Unschedulable,
    blocked_status,
)
from batchsched.core.preemption import CyclePreemption, Held, Offers, Verdict, held_nominations
from batchsched.core.queues import (
    QUEUE_STOPPED,
    FairOrder,
    QueueInput,
    QueueName,
    QueueProblem,
    QueueTree,
    StopPolicy,
)
from batchsched.core.queues.fair import Place
from batchsched.core.reservation import RESERVED, Reservation, Reservations, ReservationSettings
from batchsched.core.statement import Statement


@dataclass(frozen=True, slots=True)
class Stopped:
    """What a walk stopped at its budget settled, for the walks that take it up (so that
    they decide as the rest of that one walk would): the units it placed or held room for
    (spared from victim searches: a pod bound a moment ago is the cheapest victim there
    is; their nominations held as they are) and the reservations it made, on the rows of
    its snapshot (``node_generation``, ``width`` columns)."""

    spared: frozenset[str] = frozenset()
    #: each reservation, and what its holder was told
    reservations: tuple[tuple[Reservation, str], ...] = ()
    node_generation: int = -1
    width: int = 0
    #: when the walk stopped (the cycle's clock): a cycle later than
    #: :data:`WALK_STOP_INTERVAL` after it takes nothing up
    at: float = -math.inf


class Cycle(CycleKernels):
    """Holds what survives between cycles (node filter, scoring arrays, topology domains:
    :class:`~batchsched.core.placer.CycleKernels`; the reservations' ages) and runs one.
    ``levels``: the topology levels gangs may ask for (the default ones when None);
    ``reservation``: see :mod:`batchsched.core.reservation`."""

    def __init__(
        self, scoring: ScoringConfig, *, use_jit: bool = True, levels: TopologyLevels | None = None,
        reservation: ReservationSettings | None = None, cards: CardPolicy | None = None,
        walk_budget: float | None = None, first_walk_budget: float | None = None,
    ) -> None:
        self.reservations = Reservations(reservation)
        #: what each running unit offers preemptors, kept across cycles
        self.offers = Offers()
        #: seconds after which a walk that placed something stops (None: every unit tried)
        self.walk_budget = walk_budget
        #: the budget of the first walk (the same as the others when None)
        self.first_walk_budget = walk_budget if first_walk_budget is None or walk_budget is None else first_walk_budget
        #: walks run so far
        self.walks = 0
        #: when a walk last stopped at its budget: walks within :data:`WALK_STOP_INTERVAL`
        #: of it go to the end (each stop costs the next cycle its preparation again)
        self.stopped_at = -math.inf
        #: what the last walk settled when it stopped at its budget (empty when it ended)
        self.resumed = Stopped()
        super().__init__(scoring, use_jit=use_jit, levels=levels, cards=cards)

    def run(
        self, snap: Snapshot, units: Sequence[Unit], *, queues: QueueInput | None = None,
        state: ClusterState | None = None, classes: Callable[[Unit], Hashable] = unit_class,
        devices: DeviceCycle | None = None, limits: Mapping[QueueName | None, Place] | None = None,
    ) -> Plan:
        """``classes``: each unit's equivalence class (:func:`~batchsched.core.equivalence.unit_class`,
        or a cached one): once a unit fails, the later units of its class and queue fail alike.
        ``devices``: the cycle's use of DRA devices, where the units' ResourceClaims are
        allocated (None when no unit has any). ``limits``: the queues whose units were not
        all handed over, and the place in each after which none was: the walk stops before
        any unit after it (:class:`~batchsched.core.queues.FairOrder`)."""
        if queues is not None and queues.now - self.resumed.at > WALK_STOP_INTERVAL:
            self.resumed = Stopped()  # no cycle took the stopped walk up soon: its word is stale
        plan = _Walk(self, snap, units, queues, state, classes, devices, limits or {}).run()
        self.walks += 1
        return plan

    def account(self, snap: Snapshot, queues: QueueInput) -> QueueTree:
        """Charge running work and the nominations to ``queues.tree`` and record the usage
        history, as a cycle does before it walks: the usage Queue statuses report when no
        cycle ran. Returns the charged tree."""
        return _Walk(self, snap, (), queues).account()


@dataclass(slots=True)
class _Try:
    """One unit's turn in :meth:`_Walk.attempt` (a gang, or a queued single pod), handed
    from phase to phase: ``k`` members its queue's quota admits, ``mc`` its quorum."""

    q: QueueName | None
    unit: Unit
    lay: Layout
    k: int
    mc: int
    #: placed, or holding a nomination: the turn is taken
    admitted: bool = False
    #: why the quorum was not placed, and what the victim search said
    reason: str = ""
    why: str = ""


class _Walk:
    """One cycle: its phases in order (:meth:`run`), over a :class:`Statement` that every
    phase writes (usage, queue charges, evictions, holds, the plan), a :class:`Placer`,
    preemption and reservations acting on that statement."""

    def __init__(self, cycle: Cycle, snap: Snapshot, units: Sequence[Unit], queues: QueueInput | None,
                 state: ClusterState | None = None, classes: Callable[[Unit], Hashable] = unit_class,
                 devices: DeviceCycle | None = None, limits: Mapping[QueueName | None, Place] | None = None) -> None:
        self.t0 = time.perf_counter()
        #: the queues whose units were not all handed over: where each was cut
        self.limits = limits or {}
        self.class_of = classes
        #: (queue, class) -> how its first unit failed: (reason, message, status, that unit)
        self.failed_classes: dict[Hashable, tuple[str, str, UnitStatus, Unit]] = {}
        self.cycle = cycle
        self.snap = snap
        self.units = units
        self.qi = queues if queues is not None else QueueInput(
            tree=QueueTree((), snap.columns), preemption=False
        )
        self.tree = self.qi.tree
        self.plan = Plan()
        arrays = cycle.arrays(snap)
        self.st = Statement(snap.alloc, snap.used, self.tree, self.plan, device=arrays.device)
        for key in sorted(cycle.resumed.spared):
            self.st.spare(key)
        self.placer = Placer(cycle, snap, self.st, arrays, state, devices)
        self.running = RunningWork(self.qi, self.st, len(snap.columns))
        #: unit key -> its nomination, charged in this cycle
        self.held: dict[str, Held] = {}
        self.preemption = CyclePreemption(self.qi, snap, self.st, self.placer, self.running, cycle.offers)
        self.admission = Admission(snap, self.qi.now, self.st, self.placer, devices)
        self.reserve = cycle.reservations.begin(self.placer, self.st, self.qi.now, state)

    # -- the phases -------------------------------------------------------------------------

    def run(self) -> Plan:
        """The phases of a cycle, in order."""
        self.account()  # running work, held nominations, usage history: charged
        by_key = {u.key: u for u in self.units}
        done = self.nominated(by_key)  # units holding a nomination, first
        done |= self.carried(by_key)  # the reservations of the walk this one takes up, held again
        order = self.fair_order(done)  # the rest, in fair order
        for q, unit in order:
            if self._out_of_time():
                self.plan.unfinished = True  # the rest in the next cycle: these Bindings leave now
                break
            self.attempt(order, q, unit)  # each: place, else preempt, else reserve
        if order.cut_short:
            self.plan.unfinished = True  # a queue's next unit was not handed over: the next cycle has it
        if self.plan.unfinished:
            # the units not tried, in any order (nothing is learnt after the stop): no
            # shares to weigh for each, as the fair order would
            for q, rest in order.remaining().items():
                for unit in rest:
                    self._after_stop(q, unit)
        return self.finish()

    def _out_of_time(self) -> bool:
        """Whether the walk has spent its budget (:attr:`Cycle.walk_budget`, from the
        cycle's start; :attr:`Cycle.first_walk_budget` in the first cycle) and has Bindings
        to send: the units not tried yet wait for the next cycle, which runs at once and
        walks to the end (as do those of the following :data:`WALK_STOP_INTERVAL` seconds). Without a Binding the walk goes on
        (stopping would send nothing sooner), so every cycle that stops early placed
        something: the units left are tried in order, as in one walk, only later."""
        cycle = self.cycle
        budget = cycle.walk_budget if cycle.walks else cycle.first_walk_budget
        return (budget is not None and self.qi.now - self.cycle.stopped_at >= WALK_STOP_INTERVAL
                and bool(self.plan.bindings) and time.perf_counter() - self.t0 >= budget)

    def _after_stop(self, q: QueueName | None, unit: Unit) -> None:
        """A unit after the walk stopped: one of a class that failed in this cycle fails
        alike now, as in a whole walk (its class sleeps from this cycle on, so a later one
        would not be handed it to tell it why); any other waits for the next cycle, not
        tried."""
        if self._failed_alike(q, unit):
            self.plan.tried.append(unit.key)

    def account(self) -> QueueTree:
        """Running work, nominations and the usage history charged to the tree."""
        qi, tree = self.qi, self.tree
        if tree.names or qi.nominations:
            self.running.units()
        for h in held_nominations(qi.nominations, self.placer.rows, self.placer.col, tree):
            self.st.charge(h.nomination.queue, h.rows, h.reqs, 1)
            self.held[h.nomination.unit] = h
            self.st.spare(h.nomination.unit)
        if qi.history is not None:
            for name in tree.names:
                if tree.is_leaf(name):
                    qi.history.record(name, tree.usage_vector(name), qi.now)
        return tree

    def nominated(self, by_key: Mapping[str, Unit]) -> set[str]:
        """The units holding a nomination go first (``by_key``: the units handed in);
        returns those it settled. One made by the walk this one takes up
        (:attr:`Cycle.resumed`) is held as it is: in the one walk they stand for, it was
        settled once (unless its unit is held back since: then it is told why, in its turn)."""
        resumed = self.cycle.resumed.spared
        first = [h for h in self.held.values() if h.nomination.unit in by_key
                 and not _held_back(by_key[h.nomination.unit]) and h.nomination.unit not in resumed]
        done: set[str] = set()
        for key, h in self.held.items():
            if key not in by_key or _held_back(by_key[key]) or key in resumed:
                self.st.nominate(h.nomination)  # its unit was not handed in (or settled): keep holding
                if key in resumed and key in by_key and not _held_back(by_key[key]):
                    done.add(key)
        for h in first:
            unit = by_key[h.nomination.unit]
            self.plan.tried.append(unit.key)
            if self._nominee(unit, h):
                done.add(unit.key)
        return done

    def carried(self, by_key: Mapping[str, Unit]) -> set[str]:
        """The reservations the walk this one takes up made (:attr:`Cycle.resumed`), held
        again as they were, for the units still handed in (``by_key``) that may still be
        placed in their queue; returns those units (they are not tried again: in the one
        walk they stand for, each was tried once). A unit held back since, or whose queue
        turned unusable or stopped, goes its turn and is told why. Nothing is carried when
        the nodes changed since (their rows would not be the same)."""
        stopped, snap = self.cycle.resumed, self.snap
        if not stopped.reservations or (stopped.node_generation, stopped.width) != (snap.node_generation, len(snap.columns)):
            return set()
        kept = [(r, told) for r, told in stopped.reservations
                if r.unit in by_key and not _held_back(by_key[r.unit]) and self._queue(by_key[r.unit])[1] is None]
        self.reserve.carry([r for r, _ in kept])
        for r, told in kept:  # told again: a holder is known as one by what the cycle says of it
            self.st.fail(by_key[r.unit], told, reason=RESERVED, status=UnitStatus.WAITING)
        return {r.unit for r, _ in kept}

    def _queue(self, unit: Unit) -> tuple[QueueName | None, tuple[str, str] | None]:
        """The queue ``unit`` is tried in (None: none, or held back before any queue), and
        why that queue refuses it in this cycle, as (reason, message): unknown or unusable,
        or stopped; None when it may be tried."""
        q = None if unit.blocked else self.qi.queue_of.get(unit.key)
        if isinstance(q, QueueProblem):
            return None, (q.reason, q.message)
        stop = self.tree.stop_policy(q) if q is not None else StopPolicy.NONE
        if stop is not StopPolicy.NONE:
            return q, (QUEUE_STOPPED, explain.queue_stopped(str(q), stop.value))
        return q, None

    def fair_order(self, done: set[str]) -> FairOrder[Unit]:
        """The units not ``done``, by queue in fair order; those whose queue is unknown,
        unusable or stopped are told so."""
        qi, tree = self.qi, self.tree
        by_queue: dict[QueueName | None, list[Unit]] = {}
        for u in self.units:
            if u.key in done:
                continue
            q, refused = self._queue(u)
            if refused is not None:
                self.st.fail(u, refused[1], reason=refused[0], status=UnitStatus.UNRESOLVABLE)
                continue
            by_queue.setdefault(q, []).append(u)
        # a stopped queue refuses the units not handed over too: nothing to wait for there
        limits = {q: place for q, place in self.limits.items()
                  if q is None or self.tree.stop_policy(q) is StopPolicy.NONE}
        order: FairOrder[Unit] = FairOrder(
            tree, by_queue, now=qi.now, history=qi.history, max_wait=qi.max_wait,
            request=self.placer.quorum_vector if tree.names else None, limits=limits,
        )
        self.plan.timings["order"] = time.perf_counter() - self.t0
        return order

    def attempt(self, order: FairOrder[Unit], q: QueueName | None, unit: Unit) -> None:
        """``unit``'s turn: held back, failed like its class, or tried (with the run of
        unqueued single pods alike that follows it)."""
        plan = self.plan
        plan.tried.append(unit.key)
        if unit.blocked:
            self.st.fail(unit, unit.blocked, reason=unit.blocked_reason, status=blocked_status(unit))
            order.skipped(unit)
        elif self._failed_alike(q, unit):
            order.skipped(unit)
        elif (unit.single and q is None and unit.topology_level is None and not unit.min_resources_short
              and not self.placer.topo.affected(unit.pods)):
            more = order.more(self.placer.topo.alike(self.reserve.alike(unit)), limit=SINGLES_RUN - 1)
            plan.tried.extend(u.key for u in more)
            self._singles(order, [unit, *more])
            for u in (unit, *more):
                self._learn(q, u)
        else:
            self._unit(order, q, unit)
            self._learn(q, unit)

    def finish(self) -> Plan:
        """The reservations' ages, and the cycle's timings."""
        plan = self.plan
        if plan.unfinished:
            self.cycle.stopped_at = self.qi.now
        self.cycle.resumed = Stopped(
            frozenset(self.st.spared), tuple((r, told.message) for r in self.reserve.made
                                             if (told := plan.results.get(r.unit)) is not None),
            self.snap.node_generation, len(self.snap.columns), self.qi.now,
        ) if plan.unfinished else Stopped()
        self.reserve.finish(set(plan.tried) if plan.unfinished else None)
        plan.timings["kernel"] = self.placer.kernel_time
        plan.timings["preempt"] = self.preemption.time
        plan.searches = self.preemption.searches
        plan.timings["total"] = time.perf_counter() - self.t0
        return plan

    # -- classes that failed ----------------------------------------------------------------

    def _failed_alike(self, q: QueueName | None, unit: Unit) -> bool:
        """A unit of a class that already failed in this cycle (in the same queue) fails
        the same way, without a kernel call or a victim search."""
        if unit.min_resources_short:
            return False  # told its own reason (and at the head of its queue, it reserves)
        shared = self.failed_classes.get((q, self.class_of(unit)))
        if shared is None:
            return False
        reason, message, status, first = shared
        if not unit.single:
            message = explain.like_gang(first.display, message)
        self.st.fail(unit, message, reason=reason, status=status)
        if first.key in self.plan.deferred:
            self.plan.deferred.add(unit.key)  # its victim search is owed too
        return True

    def _learn(self, q: QueueName | None, unit: Unit) -> None:
        """After ``unit`` was tried: if it failed (not waiting for a reservation or for
        victims), the rest of its class fails alike; if its victim search was put off to
        the next cycle (the search budget was spent), theirs are too."""
        result = self.plan.results.get(unit.key)
        if result is None or not result.failed or not unit.pods or unit.min_resources_short:
            return
        if unit.single or unit.min_count > 0:
            self.failed_classes[(q, self.class_of(unit))] = (result.reason, result.message, result.status, unit)

    # -- nominated units --------------------------------------------------------------------

    def _nominee(self, unit: Unit, h: Held) -> bool:
        """A unit holding a nomination: place it if it can be; keep holding while its victims
        terminate. False when the nomination is given up and the unit must go the usual way."""
        n = h.nomination
        left = n.victims & self.st.gone.live
        if left:
            if self._place_on_free_room(unit, h):
                return True
            # keep holding: its nodes are not free until the victims are gone
            self.st.nominate(n)
            self.st.record(unit.key, UnitResult(
                UnitStatus.WAITING, "WaitingForPreemption", explain.waiting_for_victims(len(left), n.nodes),
            ))
            return True
        self.st.charge(n.queue, h.rows, h.reqs, -1)
        # placed, or given up: the victims are gone and still it does not fit, start over
        return self.admission.try_place(n.queue, unit)

    def _place_on_free_room(self, unit: Unit, h: Held) -> bool:
        """A nominee whose victims still terminate is placed now if it fits where nothing
        terminates (room may have freed since it preempted: it goes there before the units
        behind it). An attempt: its held room is given back for it, and when it does not
        fit, the statement discards it."""
        n = h.nomination
        mark = self.st.checkpoint()
        self.st.charge(n.queue, h.rows, h.reqs, -1)
        placed = self.admission.place_on_free_room(n.queue, unit)
        if placed:
            self.st.commit(mark)
        else:
            self.st.discard(mark)
        return placed

    # -- preemption ------------------------------------------------------------------------

    def _preempt(self, q: QueueName | None, unit: Unit, lay: Layout) -> tuple[bool, str]:
        """Preemption for ``unit``, whose quorum did not fit: ``(True, "")`` when it holds a
        nomination now, or when the search found it fits after all and it was placed;
        else ``(False, why)``."""
        verdict, why = self.preemption.preempt(q, unit, lay)
        if verdict is Verdict.FITS:
            return self.admission.place_quorum(q, unit, lay), ""
        return verdict is Verdict.PREEMPTED, why

    # -- unqueued single pods ---------------------------------------------------------------

    def _singles(self, order: FairOrder[Unit], batch: list[Unit]) -> None:
        """A run of unqueued single pods with the same constraints: one kernel call; each
        pod left out may preempt, else reserve."""
        pods = [u.pods[0] for u in batch]
        if len(pods) == 1 and pods[0].invalid:
            message = explain.invalid_pod(pods[0].key, pods[0].invalid)
            self.st.fail(batch[0], message, status=UnitStatus.UNRESOLVABLE)
            order.skipped(batch[0])
            return
        placer = self.placer
        lay = placer.layout(pods, batch[0].key if len(batch) == 1 else None)
        out = np.full(len(pods), -1, dtype=np.int64)
        if lay.reqs is not None:
            with self.reserve.lifted(batch[0]):
                placer.free_room_first(lay.reqs, lay, out, pods)
        for m, (u, pod) in enumerate(zip(batch, pods, strict=True)):
            if out[m] >= 0:
                assert lay.reqs is not None
                one = Layout(lay.reqs[m : m + 1], lay.sig[m : m + 1], lay.masks, lay.static)
                if self.admission.admitted(None, u, one, out[m : m + 1], 1):
                    order.admitted(u)
                    continue
                # its devices could not be allocated where the kernel put it: the long way
                # (elsewhere, else preemption, else a reservation)
                self._unit(order, None, u)
                continue
            all_reqs = lay.reqs
            reqs = None if all_reqs is None else all_reqs[m]
            message = placer.explain(pod, reqs, lay.masks[lay.sig[m]])
            if all_reqs is not None and not pod.invalid:
                preempted, why = self._preempt(None, u, lay.member(m))
                if preempted:
                    order.admitted(u)
                    continue
                message = explain.with_preemption(message, why, never=u.never_preempts)
            self.reserve.fail(None, u, lay if all_reqs is None else lay.member(m), 1, message)
            order.skipped(u)

    # -- a gang, or a queued single pod: place, else preempt, else reserve ------------------

    def _unit(self, order: FairOrder[Unit], q: QueueName | None, unit: Unit) -> None:
        """A gang, or a queued single pod: quota, then the kernel, then maybe preemption,
        else a reservation, in this order."""
        t = self._admissible(q, unit)
        if t is not None and unit.min_resources_short and t.mc > 0:
            self._short(t)
        elif t is not None:
            for phase in (self._place, self._preempt_quorum, self._reserve):
                if phase(t):
                    break
        if t is not None and t.admitted:
            order.admitted(unit)
        else:
            order.skipped(unit)

    def _admissible(self, q: QueueName | None, unit: Unit) -> _Try | None:
        """``unit``'s turn, with the members its quota admits; None (and the unit told why)
        when it may not be tried: victims of this cycle among its members, or an invalid one
        in its quorum."""
        pods = unit.pods
        evicted = self.st.evicted.get(unit.key)
        if evicted:
            # its running members are victims of this cycle: new ones would be a partial gang
            self.st.fail(unit, explain.gang_evicting(unit.display, evicted), reason="GangEvicting")
            return None
        mc = 1 if unit.single else unit.min_count
        core = pods[:mc] if not unit.single else pods
        invalid = next((p for p in core if p.invalid), None)
        if invalid is not None:
            self.st.fail(unit, explain.invalid_pod(invalid.key, invalid.invalid), status=UnitStatus.UNRESOLVABLE)
            return None
        lay = self.placer.unit_layout(unit)
        if lay.reqs is None:
            k = 0
        elif q is None:
            k = len(pods)
        else:
            k = self.tree.admissible_prefix(q, lay.reqs, mc)
        return _Try(q, unit, lay, k, mc)

    def _place(self, t: _Try) -> bool:
        """Phase: place the unit (on room nothing holds first); True when its turn is over:
        placed, or only extras were left to place and none fits."""
        q, unit, lay, k, mc = t.q, t.unit, t.lay, t.k, t.mc
        reqs = lay.reqs
        if reqs is not None and k > 0 and self.st.gone.remaining():
            # room nothing holds first: waiting for a victim while free room goes to later units is not first come
            with self.reserve.lifted(unit):
                if self.admission.place_on_free_room(q, unit):
                    t.admitted = True
                    return True
        placed, where, refused = 0, "", False
        for _ in range(DEVICE_TRIES if reqs is not None and k > 0 else 0):
            out = np.full(len(unit.pods), -1, dtype=np.int64)
            with self.reserve.lifted(unit):
                placed, where = self.placer.place(unit, lay, k, mc, out)
            if not placed:
                break
            if self.admission.admitted(q, unit, lay, out, k, where):
                t.admitted = True
                return True
            # its devices could not be allocated where the kernel put it: elsewhere, if anywhere
            refused = True
            avoided = self.admission.avoiding(lay)
            if avoided is None:
                break
            lay = avoided
        if refused:
            # preemption and the reservation go on without the nodes that refused its devices:
            # their free room counted in its class column is of devices it cannot use, and a
            # reservation holding it would keep other work from them (as later cycles do,
            # once the book remembers the refusal)
            t.reason, t.lay = self.admission.refused, lay
            return False
        if mc == 0:
            self._extras_left(t)
            return True
        t.reason = self._not_placed(t, where)
        return False

    def _extras_left(self, t: _Try) -> None:
        """The quorum is placed already; of the extras waiting, none fits (or quota refuses)."""
        q, unit, lay, k = t.q, t.unit, t.lay, t.k
        reqs = lay.reqs
        for m, pod in enumerate(unit.pods):
            if pod.invalid:
                why = explain.invalid_pod(pod.key, pod.invalid)
            elif reqs is not None and m >= k and q is not None:
                why = self.tree.admissible(q, reqs[m]) or explain.queue_full(q)
            else:
                why = self.placer.explain_member(pod, lay, m)
            message = explain.elastic_member(why)
            self.st.record(unit.key, UnitResult(UnitStatus.UNSCHEDULABLE, "Unschedulable", message),
                           keep_first=True)
            self.st.tell(Unschedulable(pod, message, unit.key))

    def _not_placed(self, t: _Try, where: str) -> str:
        """Why the quorum is not placed: by quota, or on the nodes (``where``: what the
        topology placement said)."""
        q, unit, lay, k, mc = t.q, t.unit, t.lay, t.k, t.mc
        pods, reqs, placer = list(unit.pods), lay.reqs, self.placer
        if reqs is not None and k == 0 and q is not None and len(pods) >= mc:
            self.plan.quota_blocked.add(unit.key)
            return self.tree.admissible(q, reqs[:mc].sum(axis=0)) or explain.queue_full(q)
        if unit.topology_required and where and len(pods) >= mc:
            # no domain of the required level holds the quorum: ``where`` says why
            return where if not lay.domain else explain.rest_in_domain(lay.domain, where)
        if unit.single:
            return placer.explain(pods[0], None if reqs is None else reqs[0], lay.masks[lay.sig[0]])
        if reqs is not None and len(pods) >= mc and placer.topo.affected(pods):
            return placer.topo.gang_message(pods, mc, reqs, lay.sig, lay.masks, self.st.used)
        return gang_message(
            pods, unit.min_count, lay, placer.explain, alloc=self.snap.alloc, used=self.st.used,
            columns=self.snap.columns, arrays=placer.arrays, place=self.cycle._place,
        )

    def _preempt_quorum(self, t: _Try) -> bool:
        """Phase: make room for the quorum by evicting others; True when it preempted."""
        unit = t.unit
        t.lay = self.placer.topo.narrow(list(unit.pods), t.lay)
        if t.lay.reqs is not None and t.mc > 0 and len(unit.pods) >= t.mc:
            preempted, t.why = self._preempt(t.q, unit, t.lay)
            if preempted:
                t.admitted = True
                return True
        return False

    def _reserve(self, t: _Try) -> bool:
        """Phase: at the head of its queue the unit holds a reservation, else it is told why
        it waits."""
        message = explain.with_preemption(t.reason, t.why, never=t.unit.never_preempts)
        self.reserve.fail(t.q, t.unit, t.lay, t.k, message)
        return True

    def _short(self, t: _Try) -> None:
        """A gang whose ``minResources`` the cluster cannot meet now: never placed, and no
        victims sought (what it may preempt is counted in already, and falls short). It
        keeps its turn: at the head of its queue it holds a reservation like any gang whose
        quorum does not fit, else it is told its ``minResources`` reason."""
        unit, mc = t.unit, t.unit.min_count
        if t.lay.reqs is not None and t.k == 0 and t.q is not None and len(unit.pods) >= mc:
            self.plan.quota_blocked.add(unit.key)  # woken when its queue's usage falls too
        lay = self.placer.topo.narrow(list(unit.pods), t.lay)
        self.reserve.fail(t.q, unit, lay, t.k, unit.min_resources_short, reason=INSUFFICIENT_MIN_RESOURCES)


#: seconds (on the cycle's clock) after a walk stopped at its budget before another may:
#: a large backlog's first cycle sends its Bindings early, a busy cluster's cycles are not
#: each cut in two
WALK_STOP_INTERVAL = 10.0

#: alike single pods placed in one kernel call at most: the walk looks at its budget between
#: runs, so a first cycle over 20,000 alike pods sends its Bindings after a run or two, not
#: after all of them (7.5 s at 5,000 nodes); each run sees the nodes as the last left them
SINGLES_RUN = 1000

#: placements of a unit tried in one cycle when its devices cannot be allocated where the
#: kernel put it (each without the node that refused)
DEVICE_TRIES = 3


def _held_back(unit: Unit) -> bool:
    """Whether ``unit`` may not be placed in this cycle, whatever the nodes hold (it keeps a
    nomination it has, unused)."""
    return bool(unit.blocked or unit.min_resources_short)
