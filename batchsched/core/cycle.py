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

Without a :class:`QueueInput` (or with one holding no queues) every unit is unqueued and
the order is priority, then first come, first served, as kube-scheduler's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.devices import annotations_for
from batchsched.core.equivalence import unit_class
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import Pod
from batchsched.core.placement import kernels, reference
from batchsched.core.placement.cards import CardPolicy, assigned, descriptor, held_cards, shortfalls
from batchsched.core.placement.layout import (
    Layout,
    PlacementCaches,
    build_layout,
    gang_message,
    narrow,
    request_matrix,
)
from batchsched.core.placement.podtopology import TopologyCache
from batchsched.core.placement.problem import Place, PlaceMembers, PlacementProblem, positional
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.placement.topology import (
    CLUSTER,
    DomainCache,
    Domains,
    TopologyLevels,
    place_gang_topology,
    topology_placer,
)
from batchsched.core.placement.views import NodeViews
from batchsched.core.plan import (
    INSUFFICIENT_MIN_RESOURCES,
    Binding,
    Nomination,
    Plan,
    RunningUnit,
    Unit,
    UnitResult,
    UnitStatus,
    Unschedulable,
    blocked_status,
)
from batchsched.core.preemption import CyclePreemption, Held, Terminating, held_nominations
from batchsched.core.queues import (
    QUEUE_STOPPED,
    FairOrder,
    QueueInput,
    QueueName,
    QueueProblem,
    QueueTree,
    StopPolicy,
)
from batchsched.core.queues.running import RunningBook
from batchsched.core.reservation import Reservations, ReservationSettings

IntArray = npt.NDArray[np.int64]


class Cycle:
    """Holds what survives between cycles (node filter, scoring arrays, topology domains)
    and runs one. ``levels``: the topology levels gangs may ask for (the default ones when
    None); ``reservation``: see :mod:`batchsched.core.reservation`."""

    def __init__(
        self, scoring: ScoringConfig, *, use_jit: bool = True, levels: TopologyLevels | None = None,
        reservation: ReservationSettings | None = None, cards: CardPolicy | None = None,
    ) -> None:
        self.reservations = Reservations(reservation)
        self.cards = cards if cards is not None else CardPolicy()
        self.cards.validate()
        scoring.validate()
        self.scoring = scoring
        self.levels = levels if levels is not None else TopologyLevels()
        self._domain_cache = DomainCache()
        self._place: Place = kernels.place if use_jit else reference.place
        self._insufficient: Callable[..., Any] = (
            kernels.insufficient_counts if use_jit else reference.insufficient_counts
        )
        self.caches = PlacementCaches(scoring)
        self._pod_topology = TopologyCache()

    def _topology(self, snap: Snapshot) -> Domains:
        return self._domain_cache.get(snap.nodes, self.levels)

    def run(
        self, snap: Snapshot, units: Sequence[Unit], *, queues: QueueInput | None = None,
        state: ClusterState | None = None, classes: Callable[[Unit], Hashable] = unit_class,
    ) -> Plan:
        """``classes``: each unit's equivalence class (:func:`~batchsched.core.equivalence.unit_class`,
        or a cached one): once a unit fails, the later units of its class and queue fail alike."""
        return _Walk(self, snap, units, queues, state, classes).run()

    def account(self, snap: Snapshot, queues: QueueInput) -> QueueTree:
        """Charge running work and the nominations to ``queues.tree`` and record the usage
        history, as a cycle does before it walks: the usage Queue statuses report when no
        cycle ran. Returns the charged tree."""
        return _Walk(self, snap, (), queues).account()


class _Walk:
    """The state of one cycle: the working copy of usage and the charged queue tree."""

    def __init__(self, cycle: Cycle, snap: Snapshot, units: Sequence[Unit], queues: QueueInput | None,
                 state: ClusterState | None = None, classes: Callable[[Unit], Hashable] = unit_class) -> None:
        self.t0 = time.perf_counter()
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
        self.filt, self.rows = cycle.caches.node_filter(snap.nodes, snap.node_generation)
        self.arrays = replace(
            cycle.caches.scoring_arrays(snap.columns),
            device=descriptor(snap.columns, cycle.cards, snap.card_mix),
        )
        self.used = snap.used.copy()
        self.col = {c: i for i, c in enumerate(snap.columns)}
        self.explain_cache: dict[tuple[Any, ...], str] = {}
        self.kernel_time = 0.0
        self.layouts: dict[str, Layout] = {}
        #: unit key -> its layout narrowed to the domain its placed members are in
        self.narrowed: dict[str, Layout] = {}
        self._domains: Domains | None = None
        self.requests: dict[str, IntArray | None] = {}
        self.running: list[RunningUnit] | None = None
        self.victims: set[str] = set()
        for n in self.qi.nominations:
            self.victims.update(n.victims)
        self.views = NodeViews(len(snap.nodes))
        self.gone = Terminating(self.used, snap.alloc, touch=self.touch, device=self.arrays.device)
        self.held: dict[str, Held] = {}
        self.preemption = CyclePreemption(self)
        self.reserve = cycle.reservations.begin(self, state)
        self.topo = cycle._pod_topology.begin(self.filt, self.rows, state, snap, self.arrays, cycle._place, cycle._insufficient)

    # -- setup: running work, nominations, history -----------------------------------------

    def load_running(self) -> list[RunningUnit]:
        if self.running is not None:
            return self.running
        src = self.qi.running
        given = src() if callable(src) else src
        book = self.qi.running_book
        if book is not None and all(self.tree.leaf_problem(q) is None for q in book.usage):
            self.running = self._running_from(book, list(given))
            return self.running
        width = len(self.snap.columns)
        # each queue's running work charged at once (the tree's sums do not depend on order)
        charged: dict[QueueName, IntArray] = {}
        out: list[RunningUnit] = []
        for w in given:
            if self.victims and any(p.uid in self.victims for p in w.pods):
                # evicted for a nomination: gone for this cycle's decisions
                for p in w.pods:
                    if p.uid in self.victims:
                        self.gone.add(p.uid, p.node, p.req)
                w = replace(w, pods=tuple(p for p in w.pods if p.uid not in self.victims))
                if not w.pods:
                    continue
            q = w.queue
            if q is not None:
                if self.tree.leaf_problem(q) is not None:
                    w = replace(w, queue=None)
                else:
                    total = charged.get(q)
                    if total is None:
                        total = charged[q] = np.zeros(width, dtype=np.int64)
                    for p in w.pods:
                        total += p.req
            out.append(w)
        for q, total in charged.items():
            self.tree.admit(q, total)
        self.running = out
        return out

    def _running_from(self, book: RunningBook, out: list[RunningUnit]) -> list[RunningUnit]:
        """:meth:`load_running` from a book that keeps each queue's running usage and
        which unit each pod is in: only the units of victims are looked at."""
        totals = {q: v.copy() for q, v in book.usage.items()}
        emptied: set[int] = set()
        for uid in self.victims:
            unit = book.unit_of(uid)
            if unit is None:
                continue
            at = book.position(unit.key)
            w = out[at]
            gone = [p for p in w.pods if p.uid == uid]
            if not gone:
                continue
            pod = gone[0]
            # evicted for a nomination: gone for this cycle's decisions
            self.gone.add(pod.uid, pod.node, pod.req)
            out[at] = replace(w, pods=tuple(p for p in w.pods if p.uid != uid))
            if w.queue is not None:
                totals[w.queue] -= pod.req
            if not out[at].pods:
                emptied.add(at)
        for queue, summed in totals.items():
            if summed.any():
                self.tree.admit(queue, summed)
        return [w for i, w in enumerate(out) if i not in emptied] if emptied else out

    def _hold(self) -> None:
        """Charge each nomination to its nodes and queue; drop those that cannot hold."""
        for h in held_nominations(self.qi.nominations, self.rows, self.col, self.tree):
            self.charge(h.nomination.queue, h.rows, h.reqs, 1)
            self.held[h.nomination.unit] = h
            self.preemption.spare(h.nomination.unit)

    def charge(self, queue: QueueName | None, rows: Sequence[int], reqs: IntArray, sign: int) -> None:
        for m, row in enumerate(rows):
            self.used[row] += sign * reqs[m]
        self.touch(list(rows))
        if queue is not None:
            (self.tree.admit if sign > 0 else self.tree.release)(queue, reqs.sum(axis=0))

    # -- layouts and messages -----------------------------------------------------------------

    def request_matrix(self, pods: Sequence[Pod], key: str | None = None) -> IntArray | None:
        if key is not None and key in self.requests:
            return self.requests[key]
        reqs = request_matrix(pods, self.col)
        if key is not None:
            self.requests[key] = reqs
        return reqs

    def layout(self, pods: Sequence[Pod], key: str | None = None) -> Layout:
        if key is not None:
            cached = self.layouts.get(key)
            if cached is not None:
                return cached
        out = build_layout(pods, self.request_matrix(pods, key), self.filt, len(self.snap.nodes))
        if key is not None:
            self.layouts[key] = out
        return out

    def domains(self) -> Domains:
        """The topology domains of the snapshot's nodes (built once, when first needed)."""
        if self._domains is None:
            self._domains = self.cycle._topology(self.snap)
        return self._domains

    def unit_layout(self, unit: Unit) -> Layout:
        """:meth:`layout` of the unit's pods; for a gang that must stay inside one domain
        and already has members placed there, with its masks narrowed to that domain."""
        lay = self.layout(unit.pods, unit.key)
        level = unit.topology_level
        if level is None or not unit.topology_required or not unit.placed_on:
            return lay
        narrowed = self.narrowed.get(unit.key)
        if narrowed is not None:
            return narrowed
        # the domain of the first placed member on a known node that has the level's label
        rows = (self.rows.get(name, -1) for name in unit.placed_on)
        found = (narrow(lay, self.domains(), level, r) for r in rows if r >= 0)
        narrowed = next((n for n in found if n), None)
        if narrowed is None:
            return lay  # nothing to keep to: place the rest as a gang of its own
        self.narrowed[unit.key] = narrowed
        return narrowed

    def quorum_vector(self, unit: Unit) -> IntArray:
        reqs = self.request_matrix(unit.pods, unit.key)
        if reqs is None:
            return np.zeros(len(self.snap.columns), dtype=np.int64)
        n = 1 if unit.single else unit.min_count
        out: IntArray = reqs[:n].sum(axis=0)
        return out

    def explain(
        self, pod: Pod, req: IntArray | None, mask: npt.NDArray[np.bool_], usage: IntArray | None = None
    ) -> str:
        """Why ``pod`` fits no node, against ``usage`` (the walk's usage by default)."""
        if req is not None and self.topo.affected((pod,)):
            return self.topo.explain(pod, req, mask, self.used if usage is None else usage)
        key = (pod.constraint_key(), None if req is None else req.tobytes())
        cached = self.explain_cache.get(key) if usage is None else None
        if cached is not None:
            return cached
        if req is None:
            missing = sorted(set(pod.requests) - set(self.col))
            message = explain.no_node_has(len(self.snap.nodes), missing)
        else:
            use = self.used if usage is None else usage
            counts = self.cycle._insufficient(self.snap.alloc, use, req, mask)
            insufficient = {self.snap.columns[r]: int(n) for r, n in enumerate(counts) if n > 0}
            cards = shortfalls(self.snap.alloc, use, req, mask, self.arrays.device) if pod.card_asks else None
            message = self.filt.explain(pod, insufficient, cards)
        if usage is None:
            self.explain_cache[key] = message
        return message

    def _problem(self, reqs: IntArray, lay: Layout, sig: IntArray, min_count: int) -> PlacementProblem:
        """Members ``reqs`` (signatures ``sig``, masks and static scores of ``lay``) on the
        snapshot's nodes and the walk's usage, scored as this cycle scores."""
        return PlacementProblem(self.snap.alloc, self.used, reqs, sig, lay.masks, lay.static, self.arrays, min_count)

    def _kernel(self, reqs: IntArray, lay: Layout, sig: IntArray, min_count: int, out: IntArray,
                place: Place | None = None, pods: Sequence[Pod] = ()) -> int:
        k0 = time.perf_counter()
        fn = place or self.cycle._place
        problem = self._problem(reqs, lay, sig, min_count)
        if fn is kernels.place and pods and not lay.domain:
            # the plain layout of these pods on the walk's usage: the kinds' views carry over
            placed = kernels.place(problem, out, views=self.views, kinds=self.views.kinds(pods))
        else:
            placed = fn(problem, out)
            self.touch(out[: reqs.shape[0]][out[: reqs.shape[0]] >= 0])
        self.kernel_time += time.perf_counter() - k0
        return int(placed)

    def touch(self, rows: Any) -> None:
        """The walk's usage changed on these rows outside the cached kernel."""
        self.views.touch(rows)

    def touch_all(self) -> None:
        self.views.touch_all()

    def place(self, unit: Unit, lay: Layout, k: int, mc: int, out: IntArray) -> tuple[int, str]:
        """Place the first ``k`` members of ``unit``, the first ``mc`` all or none:
        ``(members placed, where)``.

        Without a topology policy, and for elastic extras alone (``mc == 0``: their quorum
        is placed, the masks keep them to its domain when it must be kept), the kernel
        places them as they are, and ``where`` is the domain the masks were narrowed to
        (if any). A gang with a policy goes through :func:`place_gang_topology`: ``where``
        is the domain it got, or :data:`CLUSTER`, or when nothing was placed, why."""
        assert lay.reqs is not None
        reqs = np.ascontiguousarray(lay.reqs[:k])
        sig = lay.sig[:k]
        level = unit.topology_level
        if level is None or mc == 0:
            placed = self._kernel(reqs, lay, sig, mc, out, self.topo.kernel(unit.pods), unit.pods[:k])
            return placed, lay.domain if placed else ""
        k0 = time.perf_counter()
        placed, where = place_gang_topology(
            self._problem(reqs, lay, sig, mc), out,
            self.domains(), required_level=level if unit.topology_required else None,
            place=self.topo.kernel(unit.pods), columns=self.snap.columns,
        )
        self.touch(out[:k][out[:k] >= 0])
        self.kernel_time += time.perf_counter() - k0
        return placed, where

    def placer(self, unit: Unit) -> PlaceMembers:
        """The placement the victim search checks room with: topology-aware for a gang with
        a policy, so that the room it frees is room the gang can use."""
        level = unit.topology_level
        place = self.topo.kernel(unit.pods)
        if level is None:
            return positional(place)
        return positional(topology_placer(
            self.domains(), required_level=level if unit.topology_required else None,
            place=place, columns=self.snap.columns,
        ))

    def fail(
        self, unit: Unit, message: str, *, reason: str = "",
        status: UnitStatus = UnitStatus.UNSCHEDULABLE,
    ) -> None:
        plan = self.plan
        reason = reason or "Unschedulable"
        plan.record(unit.key, UnitResult(status, reason, message))
        for pod in unit.pods:
            plan.unschedulable.append(Unschedulable(pod, message, unit.key, reason))

    def _bind(self, unit: Unit, pod: Pod, row: int, where: str = "",
              cards: tuple[tuple[int, ...], ...] | None = None) -> None:
        self.topo.add(pod, row)
        notes: tuple[tuple[str, str], ...] = ()
        labels: tuple[tuple[str, str], ...] = ()
        if cards is not None:
            a, lb = annotations_for(pod.card_asks, cards)
            notes, labels = tuple(sorted(a.items())), tuple(sorted(lb.items()))
        self.plan.bindings.append(Binding(
            pod.uid, pod.namespace, pod.name, self.snap.nodes[row].name, unit.key, where,
            cards=cards, annotations=notes, labels=labels,
        ))

    # -- the walk ---------------------------------------------------------------------------

    def account(self) -> QueueTree:
        """Step 1: running work, nominations and the usage history charged to the tree."""
        qi, tree = self.qi, self.tree
        if tree.names or qi.nominations:
            self.load_running()
        self._hold()
        if qi.history is not None:
            for name in tree.names:
                if tree.is_leaf(name):
                    qi.history.record(name, tree.usage_vector(name), qi.now)
        return tree

    def run(self) -> Plan:
        qi, plan, tree = self.qi, self.plan, self.tree
        self.account()
        by_key = {u.key: u for u in self.units}
        first = [h for h in self.held.values() if h.nomination.unit in by_key
                 and not _held_back(by_key[h.nomination.unit])]
        for key, h in self.held.items():
            if key not in by_key or _held_back(by_key[key]):
                plan.nominations.append(h.nomination)  # its unit was not handed in: keep holding
        done: set[str] = set()
        for h in first:
            unit = by_key[h.nomination.unit]
            plan.tried.append(unit.key)
            if self._nominee(unit, h):
                done.add(unit.key)
        by_queue: dict[QueueName | None, list[Unit]] = {}
        for u in self.units:
            if u.key in done:
                continue
            q = None if u.blocked else qi.queue_of.get(u.key)
            if isinstance(q, QueueProblem):
                self.fail(u, q.message, reason=q.reason, status=UnitStatus.UNRESOLVABLE)
                continue
            stop = tree.stop_policy(q) if q is not None else StopPolicy.NONE
            if stop is not StopPolicy.NONE:
                self.fail(u, explain.queue_stopped(str(q), stop.value), reason=QUEUE_STOPPED,
                          status=UnitStatus.UNRESOLVABLE)
                continue
            by_queue.setdefault(q, []).append(u)
        order: FairOrder[Unit] = FairOrder(
            tree, by_queue, now=qi.now, history=qi.history, max_wait=qi.max_wait,
            request=self.quorum_vector if tree.names else None,
        )
        plan.timings["order"] = time.perf_counter() - self.t0
        for q, unit in order:
            plan.tried.append(unit.key)
            if unit.blocked:
                self.fail(unit, unit.blocked, reason=unit.blocked_reason, status=blocked_status(unit))
                order.skipped(unit)
            elif self._failed_alike(q, unit):
                order.skipped(unit)
            elif (unit.single and q is None and unit.topology_level is None and not unit.min_resources_short
                  and not self.topo.affected(unit.pods)):
                more = order.more(self.topo.alike(self.reserve.alike(unit)))
                plan.tried.extend(u.key for u in more)
                self._singles(order, [unit, *more])
                for u in (unit, *more):
                    self._learn(q, u)
            else:
                self._unit(order, q, unit)
                self._learn(q, unit)
        self.reserve.finish()
        plan.timings["kernel"] = self.kernel_time
        plan.timings["preempt"] = self.preemption.time
        plan.searches = self.preemption.searches
        plan.timings["total"] = time.perf_counter() - self.t0
        return plan

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
        self.fail(unit, message, reason=reason, status=status)
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

    def _nominee(self, unit: Unit, h: Held) -> bool:
        """A unit holding a nomination: place it if it can be; keep holding while its victims
        terminate. False when the nomination is given up and the unit must go the usual way."""
        n = h.nomination
        left = n.victims & self.gone.live
        if left:
            if self._place_on_free_room(unit, h):
                return True
            # keep holding: its nodes are not free until the victims are gone
            self.plan.nominations.append(n)
            self.plan.record(unit.key, UnitResult(
                UnitStatus.WAITING, "WaitingForPreemption", explain.waiting_for_victims(len(left), n.nodes),
            ))
            return True
        self.charge(n.queue, h.rows, h.reqs, -1)
        # placed, or given up: the victims are gone and still it does not fit, start over
        return self._try_place(n.queue, unit)

    def _place_on_free_room(self, unit: Unit, h: Held) -> bool:
        """A nominee whose victims still terminate is placed now if it fits where nothing
        terminates (room may have freed since it preempted: it goes there before the units
        behind it). Its held room is given back for the attempt; when it does not fit,
        everything is as before."""
        n = h.nomination
        self.charge(n.queue, h.rows, h.reqs, -1)
        placed = self.place_on_free_room(n.queue, unit)
        if not placed:
            self.charge(n.queue, h.rows, h.reqs, 1)
        return placed

    def place_on_free_room(self, q: QueueName | None, unit: Unit) -> bool:
        """Place ``unit`` (bound now) where no victim still terminates; nothing on failure.
        A preemptor whose victims only held quota (or whose room freed meanwhile) need not
        wait for them to go."""
        with self._victims_room_closed():
            return self._try_place(q, unit)

    def _victims_terminate(self) -> bool:
        gone = self.gone
        return any(bool(gone.term[r].any()) for r in gone.pods)

    @contextmanager
    def _victims_room_closed(self) -> Iterator[None]:
        """Within: the room victims still hold (they terminate) is not free to place on.
        What is placed meanwhile stays charged."""
        gone = self.gone
        rows = [r for r in gone.pods if bool(gone.term[r].any())]
        saved = {r: gone.term[r].copy() for r in rows}
        for r in rows:
            self.used[r] += saved[r]
            gone.term[r] = 0
        self.touch(rows)
        try:
            yield
        finally:
            for r in rows:
                gone.term[r] = saved[r]
                self.used[r] -= saved[r]
            self.touch(rows)

    def _free_room_first(self, reqs: IntArray, lay: Layout, out: IntArray, pods: Sequence[Pod]) -> None:
        """Place single pods, in their order, on room nothing holds first; those that do not
        fit there then on room victims still hold (they wait for them, nominated). A pod
        submitted earlier is not left waiting for a victim while a later one takes free room."""
        if not self._victims_terminate():
            self._kernel(reqs, lay, lay.sig, 0, out, pods=pods)
            return
        with self._victims_room_closed():
            self._kernel(reqs, lay, lay.sig, 0, out, pods=pods)
        left = np.flatnonzero(out < 0)
        if len(left):
            rest = np.full(len(left), -1, dtype=np.int64)
            self._kernel(np.ascontiguousarray(reqs[left]), lay, np.ascontiguousarray(lay.sig[left]), 0, rest,
                         pods=[pods[int(i)] for i in left])
            out[left] = rest

    def _try_place(self, q: QueueName | None, unit: Unit) -> bool:
        """Place ``unit`` if quota and nodes allow, recording bindings; nothing on failure."""
        pods = unit.pods
        lay = self.unit_layout(unit)
        if lay.reqs is None or any(p.invalid for p in pods[: max(1, unit.min_count)]):
            return False
        mc = 1 if unit.single else unit.min_count
        k = len(pods) if q is None else self.tree.admissible_prefix(q, lay.reqs, mc)
        if k == 0:
            return False
        out = np.full(k, -1, dtype=np.int64)
        placed, where = self.place(unit, lay, k, mc, out)
        if placed == 0:
            return False
        self.admitted(q, unit, lay, out, k, where)
        return True

    def admitted(
        self, q: QueueName | None, unit: Unit, lay: Layout, out: IntArray, k: int, where: str = ""
    ) -> None:
        """Record the placed members of ``unit`` (``out``: node per member of the first
        ``k``; ``where``: the topology domain they are in, if any); extras that did not
        fit, or that quota refused, are told why.

        Members placed on capacity that preempted pods still hold (they are terminating)
        are not bound yet: the unit gets a nomination on those nodes instead."""
        assert lay.reqs is not None
        plan = self.plan
        self.preemption.spare(unit.key)
        members = [m for m in range(k) if out[m] >= 0]
        if q is not None:
            self.tree.admit(q, lay.reqs[members].sum(axis=0))
        rows = [int(out[m]) for m in members]
        waiting = self.gone.blocked_by(rows)
        if waiting:
            names = tuple(self.snap.nodes[r].name for r in rows)
            self.plan.nominations.append(Nomination(
                unit=unit.key, queue=q, pods=tuple(unit.pods[m].uid for m in members), nodes=names,
                requests=tuple({**unit.pods[m].requests, **held_cards(lay.reqs[m], self.arrays.device, self.snap.columns)}
                               for m in members),
                victims=frozenset(waiting), since=self.qi.now, priority=unit.priority,
            ))
            self.plan.record(unit.key, UnitResult(
                UnitStatus.WAITING, "WaitingForPreemption", explain.waiting_for_victims(len(waiting), names),
            ))
            return
        plan.record(unit.key, UnitResult(UnitStatus.SCHEDULED, "Scheduled", placed=len(members), where=where))
        domain = "" if where == CLUSTER else where
        level = unit.topology_level
        told = lay
        if domain and unit.topology_required and level is not None and not lay.domain and rows:
            # the extras left out were held to the gang's domain: explain them there
            told = narrow(lay, self.domains(), level, rows[0]) or lay
        # read the cards now: explaining the others below runs the kernel on these rows
        cards = {m: assigned(unit.pods[m].card_asks, lay.reqs[m], self.arrays.device)
                 for m in members if unit.pods[m].card_asks}
        for m, pod in enumerate(unit.pods):
            if m < k and out[m] >= 0:
                self._bind(unit, pod, int(out[m]), domain, cards.get(m))
                continue
            if pod.invalid:
                message = explain.invalid_pod(pod.key, pod.invalid)
            elif m >= k and q is not None:
                message = self.tree.admissible(q, lay.reqs[m]) or explain.QUEUE_FULL_ANY
            else:
                message = self._explain_member(pod, told, m)
            plan.unschedulable.append(
                Unschedulable(pod, explain.elastic_member(message), unit.key)
            )

    def _singles(self, order: FairOrder[Unit], batch: list[Unit]) -> None:
        """A run of unqueued single pods with the same constraints: one kernel call."""
        pods = [u.pods[0] for u in batch]
        if len(pods) == 1 and pods[0].invalid:
            message = explain.invalid_pod(pods[0].key, pods[0].invalid)
            self.fail(batch[0], message, status=UnitStatus.UNRESOLVABLE)
            order.skipped(batch[0])
            return
        lay = self.layout(pods, batch[0].key if len(batch) == 1 else None)
        out = np.full(len(pods), -1, dtype=np.int64)
        if lay.reqs is not None:
            with self.reserve.lifted(batch[0]):
                self._free_room_first(lay.reqs, lay, out, pods)
        for m, (u, pod) in enumerate(zip(batch, pods, strict=True)):
            if out[m] >= 0:
                assert lay.reqs is not None
                one = Layout(lay.reqs[m : m + 1], lay.sig[m : m + 1], lay.masks, lay.static)
                self.admitted(None, u, one, out[m : m + 1], 1)
                order.admitted(u)
                continue
            all_reqs = lay.reqs
            reqs = None if all_reqs is None else all_reqs[m]
            message = self.explain(pod, reqs, lay.masks[lay.sig[m]])
            if all_reqs is not None and not pod.invalid:
                preempted, why = self.preemption.preempt(None, u, lay.member(m))
                if preempted:
                    order.admitted(u)
                    continue
                message = explain.with_preemption(message, why, never=u.never_preempts)
            self.reserve.fail(None, u, lay if all_reqs is None else lay.member(m), 1, message)
            order.skipped(u)

    def _unit(self, order: FairOrder[Unit], q: QueueName | None, unit: Unit) -> None:
        """A gang, or a queued single pod: quota, then the kernel, then maybe preemption."""
        pods = list(unit.pods)
        evicted = self.preemption.evicted.get(unit.key)
        if evicted:
            # its running members are victims of this cycle: new ones would be a partial gang
            self.fail(unit, explain.gang_evicting(unit.display, evicted), reason="GangEvicting")
            order.skipped(unit)
            return
        mc = 1 if unit.single else unit.min_count
        core = pods[:mc] if not unit.single else pods
        invalid = next((p for p in core if p.invalid), None)
        if invalid is not None:
            self.fail(unit, explain.invalid_pod(invalid.key, invalid.invalid), status=UnitStatus.UNRESOLVABLE)
            order.skipped(unit)
            return
        lay = self.unit_layout(unit)
        reqs = lay.reqs
        if reqs is None:
            k = 0
        elif q is None:
            k = len(pods)
        else:
            k = self.tree.admissible_prefix(q, reqs, mc)
        if unit.min_resources_short and mc > 0:
            self._short(order, q, unit, lay, k)
            return
        if reqs is not None and k > 0 and self._victims_terminate():
            # room nothing holds first: waiting for a victim while free room goes to later units is not first come
            with self.reserve.lifted(unit):
                if self.place_on_free_room(q, unit):
                    order.admitted(unit)
                    return
        out = np.full(len(pods), -1, dtype=np.int64)
        placed, where = 0, ""
        if reqs is not None and k > 0:
            with self.reserve.lifted(unit):
                placed, where = self.place(unit, lay, k, mc, out)
        if placed:
            self.admitted(q, unit, lay, out, k, where)
            order.admitted(unit)
            return
        if mc == 0:
            # the quorum is placed already; of the extras waiting, none fits (or quota refuses)
            for m, pod in enumerate(pods):
                if pod.invalid:
                    why = explain.invalid_pod(pod.key, pod.invalid)
                elif reqs is not None and m >= k and q is not None:
                    why = self.tree.admissible(q, reqs[m]) or explain.queue_full(q)
                else:
                    why = self._explain_member(pod, lay, m)
                message = explain.elastic_member(why)
                self.plan.record(unit.key, UnitResult(UnitStatus.UNSCHEDULABLE, "Unschedulable", message),
                                 keep_first=True)
                self.plan.unschedulable.append(Unschedulable(pod, message, unit.key))
            order.skipped(unit)
            return
        # the quorum is not placed: by quota, or on the nodes
        if reqs is not None and k == 0 and q is not None and len(pods) >= mc:
            self.plan.quota_blocked.add(unit.key)
            reason = self.tree.admissible(q, reqs[:mc].sum(axis=0)) or explain.queue_full(q)
        elif unit.topology_required and where and len(pods) >= mc:
            # no domain of the required level holds the quorum: ``where`` says why
            reason = where if not lay.domain else explain.rest_in_domain(lay.domain, where)
        elif unit.single:
            reason = self.explain(pods[0], None if reqs is None else reqs[0], lay.masks[lay.sig[0]])
        elif reqs is not None and len(pods) >= mc and self.topo.affected(pods):
            reason = self.topo.gang_message(pods, mc, reqs, lay.sig, lay.masks, self.used)
        else:
            reason = gang_message(
                pods, unit.min_count, lay, self.explain, alloc=self.snap.alloc, used=self.used,
                columns=self.snap.columns, arrays=self.arrays, place=self.cycle._place,
            )
        why, lay = "", self.topo.narrow(pods, lay)
        if reqs is not None and mc > 0 and len(pods) >= mc:
            preempted, why = self.preemption.preempt(q, unit, lay)
            if preempted:
                order.admitted(unit)
                return
        self.reserve.fail(q, unit, lay, k, explain.with_preemption(reason, why, never=unit.never_preempts))
        order.skipped(unit)

    def _short(self, order: FairOrder[Unit], q: QueueName | None, unit: Unit, lay: Layout, k: int) -> None:
        """A gang whose ``minResources`` the cluster cannot meet now: never placed, and no
        victims sought (what it may preempt is counted in already, and falls short). It
        keeps its turn: at the head of its queue it holds a reservation like any gang whose
        quorum does not fit, else it is told its ``minResources`` reason."""
        mc = unit.min_count
        if lay.reqs is not None and k == 0 and q is not None and len(unit.pods) >= mc:
            self.plan.quota_blocked.add(unit.key)  # woken when its queue's usage falls too
        lay = self.topo.narrow(list(unit.pods), lay)
        self.reserve.fail(q, unit, lay, k, unit.min_resources_short, reason=INSUFFICIENT_MIN_RESOURCES)
        order.skipped(unit)

    def _explain_member(self, pod: Pod, lay: Layout, m: int) -> str:
        """Why member ``m`` of a unit fits no node it may use (its domain's, when narrowed)."""
        req = None if lay.reqs is None else lay.reqs[m]
        mask = lay.masks[lay.sig[m]]
        if not lay.domain:
            return self.explain(pod, req, mask)
        # not cached: the cache is keyed by the pod's constraints, which do not narrow
        detail = self.explain(pod, req, mask, self.used)
        return explain.stays_in_domain(lay.domain, detail)


def _held_back(unit: Unit) -> bool:
    """Whether ``unit`` may not be placed in this cycle, whatever the nodes hold (it keeps a
    nomination it has, unused)."""
    return bool(unit.blocked or unit.min_resources_short)
