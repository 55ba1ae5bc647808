"""Preemption and reclaim: which running units to evict so that a pending unit fits.

:func:`select_victims` is called for a unit that could not be admitted by quota or placed
on the nodes. It looks for a set of running units (or only their elastic extras) whose
eviction would make the unit's quorum both admissible by quota and placeable by the
placement kernel, and returns it with the nodes the quorum would land on (so the cycle can
hold them for it), or the reason no set works. Pure: nothing passed in is changed.

Who may be evicted, for a preemptor P of queue p (request of its quorum: ``x``):

- **within its queue** (kind ``Priority``), by p's ``withinQueue`` policy:
  ``LowerPriority`` takes units of p with a strictly lower priority;
  ``LowerOrNewerEqualPriority`` also those of equal priority created after P (creation
  time, then UID, so two units are never newer than each other); ``Never`` none.
- **reclaim** (kind ``Reclaim``) from the other leaves of p's tree, by p's
  ``reclaimWithinCohort`` policy (``Any``, ``LowerPriority``: strictly lower, ``Never``), only
  pieces of work *running on borrowed capacity*: the piece uses a resource r that P asks
  for, in which its queue v uses more than its nominal (``U_v,r > N_v,r``); and
    - (restore only) reclaim is used only when admitting P keeps p within its nominal in
      every managed resource P asks for: reclaim gives a queue back its nominal, it never
      lets it borrow;
    - (never below nominal) after all evictions, every victim queue keeps at least its
      nominal in each resource in which it was borrowing.
- **unqueued work** (no queue: no guarantee) by anyone of strictly higher priority; an
  unqueued preemptor may evict only unqueued work of strictly lower priority.
- never a **protected** unit (:attr:`RunningUnit.protected`: a PodDisruptionBudget without
  room for its pods, pods already terminating).

Gangs are evicted whole, or only their elastic extras (the members beyond the quorum) when
that suffices: sets of extras alone are tried first. Among valid sets (valid = the quota
check passes with the victims released, and the placement (``place``) places the quorum on a
scratch copy of ``used`` with the victims' pods removed) the search takes the one losing
the fewest GPU-hours of work already done (GPUs x time since start, summed over the set),
then the fewest pods, then lower priorities and newer units. How it finds it:

- candidates are added cheapest first until the quorum fits, then every victim that is not
  needed is dropped again, most expensive first (a whole gang may shrink to its extras).
  When that finds no set, freeing more is not always better: the placement kernel places
  members in order, each on its best node, so more room can lead a small member onto the
  node a large one needed. Evicting everything allowed is tried, then (few candidates) sets
  cheapest first, or (more) everything with pieces dropped most expensive first.
- **few candidates** (at most :data:`EXHAUSTIVE_PIECES`): every cheaper set is weighed,
  cheapest first, and the first valid one is taken: the cheapest there is.
- **more**: that set is compared with what freeing single nodes costs: the nodes the quorum
  may use are ranked by what freeing room for its largest member there costs (every node
  at once, array arithmetic), and on the :data:`NODE_TRIALS` cheapest, the cheapest set
  of the node's own work that frees that room (all sets weighed when the node runs at
  most :data:`NODE_EXACT_UNITS` candidates, else up to :data:`NODE_SETS` sets in the order
  of their cost) is put first and the same add-then-drop search
  runs from it; for a gang, one more run takes the nodes in that order. The cheapest valid
  set of all these wins. So eight 1-GPU pods that ran 7 hours on one node are not evicted
  for an 8-GPU pod when one 8-GPU pod started an hour ago on another node. For a single
  pod that the nodes (not quota) keep out, the result is the cheapest set whenever the
  nodes it is compared on include the cheapest one's; a gang's is a good set, not always
  the best.

The search is pure and bounded per call; the cycle bounds the searches per cycle in number
and time (:mod:`batchsched.core.preemption.attempt`).

**What a search costs.** A busy cluster runs thousands of units, and most searches of a
churn step find nothing: a queue above its nominal in a cohort that lends nothing. So a
search pays for what can matter:

- another queue's work is looked at only when that queue borrows a resource P asks for
  (else the queue is passed over whole), and its pieces come from the cycle's
  :class:`PieceCache`: built once per cycle for all the preemptors that share the cohort,
  the policy, the priority and the borrowed columns asked for, with their summed
  requests; each unit's pieces (what it holds, its cost) are kept there too, so a queue
  whose work changed (a victim left) is rebuilt from the pieces already made; they are
  priced and put in order only when a search first needs them so (most end on the sums);
- before any set is tried, what evicting every candidate could free bounds the search:
  on the nodes in reach (the quorum needs that much room in all), and in quota, apart for
  the sets that reclaim (P's queue within its nominal once its own candidates are gone)
  and those that do not (P admitted then). When no set can pass, no set is tried: the
  reason is the one adding candidates as they help ends with, read off the sums when
  quota decides (see ``_ruled_out_by_quota``), else found by that pass alone. Otherwise
  the sets of a kind that cannot pass are never checked;
- a set's per-queue release is kept as pieces come and go (``_Sums``), so that dropping
  pieces from everything, one by one, costs the same per step whatever the set's size.

The answer is the plain search's (:mod:`batchsched.core.preemption.reference`, the twin
``tests/unit/test_victim_search.py`` holds it equal to).

**Invariant (no ping-pong).** Once a preemption has been carried out (victims gone, P
placed and charged to p), selecting victims for any of P's victims V, as preemptor, in that
same state never evicts P:

- V of p (within the queue): P preempted V because V's priority is lower, or equal and V
  newer; the policy is a strict order, so P is neither lower nor newer than V.
- V of another queue (reclaim): P was admitted keeping p within nominal in every resource
  P uses (restore only). For V to reclaim P, p would have to use more than its nominal in
  some resource P uses. It does not.
- V unqueued: V may only evict unqueued work of lower priority than itself; P is queued,
  or unqueued with a higher priority.

And reclaim never leaves a victim queue below its nominal in a resource it was borrowing.
``tests/unit/test_preemption.py`` holds both as hypothesis properties.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core.placement import kernels, reference
from batchsched.core.placement.problem import Place, PlacementProblem
from batchsched.core.placement.scoring import ScoringArrays
from batchsched.core.plan import QueueName, RunningPod, RunningUnit, Victim, VictimKind
from batchsched.core.preemption.candidates import eviction_kind, eviction_rule
from batchsched.core.quantity import format_units
from batchsched.core.queues import (
    QueueTree,
    ReclaimPolicy,
    WithinQueuePolicy,
)
from batchsched.core.queues.running import Held, RunningBook, held

__all__ = [
    "NoPreemption",
    "PieceCache",
    "Preemption",
    "Preemptor",
    "RunningPod",
    "RunningUnit",
    "Victim",
    "VictimKind",
    "select_victims",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

SECONDS_PER_HOUR = 3600.0
#: up to this many candidate pieces, every set of them is weighed
EXHAUSTIVE_PIECES = 8
#: the nodes, cheapest to free first, whose own cheapest set is compared with the others
NODE_TRIALS = 3
#: up to this many candidate units on a node, every set of them is weighed for that node
NODE_EXACT_UNITS = 6
#: beyond that, up to this many of the node's sets are weighed, cheapest first
NODE_SETS = 512
#: at most this many sets are checked when adding candidates as they help found none
FALLBACK_CHECKS = 64

#: what a set of victims costs: GPU-hours done, pods, then its pieces' own costs
SetCost = tuple[float, int, tuple[Any, ...]]


def _set_cost(pieces: Sequence[_Piece]) -> SetCost:
    """The order in which sets of victims are preferred (see the module docstring); the
    GPU-hours are rounded so that the order of a sum does not decide between equal sets."""
    return (
        round(math.fsum(pc.gpu_hours for pc in pieces), 9), sum(len(pc.pods) for pc in pieces),
        tuple(sorted(pc.cost for pc in pieces)),
    )


@dataclass(slots=True, frozen=True)
class Preemptor:
    """The pending unit, laid out as a :class:`~batchsched.core.placement.problem.PlacementProblem` holds it.

    Only its quorum (the first ``min_count`` members) is a reason to evict anyone.
    """

    key: str
    queue: QueueName | None
    priority: int
    created: float
    uid: str
    reqs: IntArray
    sig: IntArray
    masks: BoolArray
    static_score: IntArray
    min_count: int = 1
    name: str = ""
    """How messages name it (``namespace/name``); the key when empty."""
    arrival: int = 0
    """Its place in line within its creation second (:attr:`~batchsched.core.plan.Unit.arrival`)."""


@dataclass(slots=True, frozen=True)
class Preemption:
    victims: tuple[Victim, ...]
    nodes: tuple[int, ...]
    """The node row of each quorum member once the victims are gone (hold them for it)."""
    gpu_hours: float
    pods: int
    #: the quorum's request rows as placed there, with the GPU cards each member got
    placed: IntArray | None = None


@dataclass(slots=True, frozen=True)
class NoPreemption:
    reason: str


#: a piece's place in the order of cost: GPU-hours, pods, priority, newer first, uid, whole
PieceCost = tuple[float, int, int, float, str, int]
#: a piece before it is priced: what it holds, as what kind of victim, the resource borrowed
_Shape = tuple[Held, VictimKind, str]
#: a unit that offers pieces: the unit, its pieces unpriced, whether it is the preemptor's own part
_Offer = tuple[RunningUnit, list[_Shape], bool]


class _Kept:
    """What the units under one key of :class:`Offers` offer (id of a unit -> the unit and
    its shapes), and, once a borrower's :class:`_Lent` was built from them, what their
    whole units hold per node and their names."""

    __slots__ = ("names", "on_nodes", "units")

    def __init__(self, units: dict[int, tuple[RunningUnit, list[_Shape]]] | None = None) -> None:
        self.units = {} if units is None else units
        self.on_nodes: IntArray | None = None
        self.names: set[str] = set()

    def carry(self, before: _Kept, shape: tuple[int, ...]) -> None:
        """Fill :attr:`on_nodes` and :attr:`names` from ``before``'s by the units that
        left and came (from scratch when it has none)."""
        if before.on_nodes is None or before.on_nodes.shape != shape:
            gone: list[RunningUnit] = []
            came = [w for w, _ in self.units.values()]
            self.on_nodes = np.zeros(shape, dtype=np.int64)
        else:
            gone = [w for i, (w, _) in before.units.items() if (hit := self.units.get(i)) is None or hit[0] is not w]
            came = [w for i, (w, _) in self.units.items() if (hit := before.units.get(i)) is None or hit[0] is not w]
            self.on_nodes = before.on_nodes.copy()
            self.names = set(before.names)
        for sign, ws, kept in ((-1, gone, before), (1, came, self)):
            whole = [s for w in ws for s, _, _ in kept.units[id(w)][1][:1] if s.whole]
            if whole:
                self.on_nodes += sign * _on_nodes(whole, shape)
        for w in gone:
            self.names.discard(w.key)
            self.names.discard(w.uid)
        for w in came:
            self.names.update((w.key, w.uid))


#: cycles a context of :class:`Offers` is kept after it was last asked for
OFFERS_KEPT_CYCLES = 30


class Offers:
    """What each running unit offers a preemptor before it is priced
    (:meth:`_Search.shapes_of`), kept across cycles under what that depends on besides the
    unit (see :meth:`PieceCache._offered`): a unit offers the same until it changes, and
    the running book keeps a unit that does not change. A context no cycle asked for in
    :data:`OFFERS_KEPT_CYCLES` is dropped."""

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], _Kept] = {}
        #: context -> the cycle that last asked for it
        self._asked: dict[tuple[Any, ...], int] = {}
        self._cycle = 0

    def cycle(self) -> None:
        """A new cycle."""
        self._cycle += 1
        for key in [k for k, n in self._asked.items() if self._cycle - n > OFFERS_KEPT_CYCLES]:
            del self._asked[key]
            self._kept.pop(key, None)

    def get(self, key: tuple[Any, ...]) -> _Kept:
        """What was kept under ``key`` (read only)."""
        self._asked[key] = self._cycle
        return self._kept.get(key) or _Kept()

    def put(self, key: tuple[Any, ...], kept: _Kept) -> None:
        """What the units offer under ``key`` now (those gone are dropped)."""
        self._kept[key] = kept


class PieceCache:
    """The pieces of running units, built once per cycle instead of once per search.

    What a unit holds (whole, or its elastic extras alone: :class:`Held`) depends on the
    unit only: the :class:`~batchsched.core.queues.running.RunningBook` the units come from
    keeps it across cycles (``book``; units of a cycle's own making are kept here for the
    cycle). The pieces a borrowing queue offers to be reclaimed are the same for every
    preemptor of a cohort that asks for the same borrowed resources under the same policy
    (and priority, under ``LowerPriority``) (:meth:`lent`): they are kept for the cycle,
    with their sums (their GPU-hours done depend on the time); what each unit offers,
    without its cost (:meth:`_Search.shapes_of`), is kept across cycles while the unit
    and that key hold, and priced anew each cycle. A victim chosen earlier in
    the cycle is replaced in the candidates by what is left of it (a new unit) or leaves
    them: the entries built from it are never asked for again, and :meth:`forget` drops
    what it held. What a victim changes besides (the queues' usage, the nodes' room) is
    read afresh by every search."""

    def __init__(self, book: RunningBook | None = None, offers: Offers | None = None) -> None:
        self.now: float | None = None
        self.tree: QueueTree | None = None
        #: the book the running units come from: it keeps what each holds across cycles
        self.book = book
        #: id of a unit the book does not keep -> the unit (kept, so that its id is not
        #: reused) and what it holds
        self._held: dict[int, tuple[RunningUnit, tuple[Held, ...]]] = {}
        #: what a borrowing queue lends, by :meth:`lent`'s key, with the ids of the units it
        #: was built from
        self._lent: dict[tuple[Any, ...], tuple[tuple[int, ...], _Lent]] = {}
        #: what the preemptors of one context may evict of their own queue's (or unqueued)
        #: running work (:meth:`own`), with the ids of the units it was built from
        self._own: dict[tuple[Any, ...], tuple[tuple[int, ...], list[_Piece]]] = {}
        #: the key of :meth:`_offered` -> id of a unit -> the unit and its pieces priced for
        #: the cycle
        self._priced: dict[tuple[Any, ...], dict[int, tuple[RunningUnit, list[_Piece]]]] = {}
        #: what each unit offers, unpriced, kept across cycles
        self.offers = Offers() if offers is None else offers
        self.offers.cycle()
        #: queue -> (its usage generation, its usage and nominal)
        self._arrays: dict[str, tuple[int, IntArray, IntArray]] = {}

    def _same_cycle(self, now: float, tree: QueueTree | None) -> None:
        if now != self.now or tree is not self.tree:
            self._held.clear()
            self._lent.clear()
            self._own.clear()
            self._priced.clear()
            self._arrays.clear()
            self.now, self.tree = now, tree

    def queue_arrays(self, tree: QueueTree, queue: str, now: float) -> tuple[IntArray, IntArray]:
        """``queue``'s usage and nominal vectors (read only), kept while its usage holds."""
        self._same_cycle(now, tree)
        gen = tree.queue_generation(queue)
        hit = self._arrays.get(queue)
        if hit is None or hit[0] != gen:
            hit = self._arrays[queue] = (gen, tree.usage_vector(queue), tree.nominal_vector(queue))
        return hit[1], hit[2]

    def held(self, w: RunningUnit, width: int) -> tuple[Held, ...]:
        """What ``w`` holds: whole, then its elastic extras alone when it has some and
        other pods (:func:`~batchsched.core.queues.running.held`)."""
        kept = None if self.book is None else self.book.held(w, width)
        if kept is not None:
            return kept
        hit = self._held.get(id(w))
        if hit is not None and hit[0] is w:
            return hit[1]
        out = held(w, width)
        self._held[id(w)] = (w, out)
        return out

    def lent(self, search: _Search, queue: QueueName, units: Sequence[RunningUnit], cols: Sequence[int]) -> _Lent | None:
        """The pieces ``search``'s preemptor may reclaim from ``units``, the running work of
        the borrowing queue ``queue`` (``cols``: the columns it asks for that ``queue``
        borrows in); None when the preemptor is one of them (it never evicts itself)."""
        p, tree = search.p, search.tree
        assert tree is not None and p.queue is not None
        self._same_cycle(search.now, tree)
        policy = tree.queue(p.queue).reclaim
        # the preemptor's priority decides who may be reclaimed only under LowerPriority
        # (:func:`~batchsched.core.preemption.candidates.eviction_rule`)
        priority = p.priority if policy is ReclaimPolicy.LOWER_PRIORITY else None
        context = (tree.root(p.queue), policy, priority, tuple(cols))
        ids = tuple(map(id, units))
        hit = self._lent.get((queue, *context))
        if hit is None or hit[0] != ids:
            built = self._build(search, queue, units, context)
            if built is None:
                return None
            hit = self._lent[(queue, *context)] = (ids, built)
        lent = hit[1]
        if p.key in lent.names or p.uid in lent.names:
            return None
        return lent

    def own(self, search: _Search, queue: QueueName | None, units: Sequence[RunningUnit]) -> list[_Piece]:
        """The pieces ``search``'s preemptor may evict of ``units``, the running work of its
        own queue (``queue``) or of no queue (read only)."""
        p, tree = search.p, search.tree
        self._same_cycle(search.now, tree)
        context: tuple[Any, ...]
        if queue is None:
            context = ("unqueued", p.priority)
        else:
            assert tree is not None
            policy = tree.queue(queue).within_queue
            # the preemptor's age decides only under LowerOrNewerEqualPriority
            # (:func:`~batchsched.core.preemption.candidates.eviction_rule`)
            newer = (p.created, p.arrival, p.uid) if policy is WithinQueuePolicy.LOWER_OR_NEWER_EQUAL_PRIORITY else None
            context = ("own", queue, policy, p.priority, newer)
        ids = tuple(map(id, units))
        hit = self._own.get(context)
        if hit is None or hit[0] != ids:
            pieces, _, mine, _, _ = self._offered(search, context, units)
            if mine:  # its own running part is among them: what they offer others differs
                return pieces
            hit = self._own[context] = (ids, pieces)
        return hit[1]

    def _offered(self, search: _Search, context: tuple[Any, ...],
                 units: Sequence[RunningUnit]) -> tuple[list[_Piece], int, bool, _Kept, _Kept]:
        """The pieces ``units`` offer (unsorted), how many units offer one, whether the
        preemptor's own running part is one of them, and what was kept before and is kept
        now. What each unit offers is kept across cycles under ``context`` (what it depends
        on besides the unit), priced for the cycle once."""
        key, offering, mine, before, now = self._shaped(search, context, units)
        pieces: list[_Piece] = []
        self._price(key, offering, search.now, pieces)
        return pieces, len(offering), mine, before, now

    def _shaped(self, search: _Search, context: tuple[Any, ...], units: Sequence[RunningUnit]) -> tuple[
            tuple[Any, ...], list[_Offer], bool, _Kept, _Kept]:
        """What ``units`` offer before they are priced: the key it is kept under, the units
        that offer a piece (with their shapes, and whether each is the preemptor's own
        running part: what that offers is not kept), whether the preemptor's own running part
        is among ``units``, and what was kept before and is kept now."""
        width = search.used.shape[1]
        key = (search.used.shape, *context)
        before = self.offers.get(key)
        kept = before.units
        shapes: dict[int, tuple[RunningUnit, list[_Shape]]] = {}
        offering: list[_Offer] = []
        seen = False
        for w in units:
            i = id(w)
            mine = search.is_preemptor(w)  # what it offers another preemptor differs
            seen = seen or mine
            shape = kept.get(i)
            if shape is None or shape[0] is not w:
                shape = (w, search.shapes_of(w, width))
            if not mine:
                shapes[i] = shape
            if shape[1]:
                offering.append((w, shape[1], mine))
        now = _Kept(shapes)
        self.offers.put(key, now)
        return key, offering, seen, before, now

    def _price(self, key: tuple[Any, ...], offering: Sequence[_Offer], now: float, out: list[_Piece]) -> None:
        """Append to ``out`` the pieces ``offering`` describe, priced at ``now``: once per
        cycle and key (but the preemptor's own part's)."""
        priced = self._priced.setdefault(key, {})
        for w, shapes, mine in offering:
            hit = priced.get(id(w))
            if hit is None or hit[0] is not w:
                hit = (w, [])
                _price(w, shapes, now, hit[1])
                if not mine:
                    priced[id(w)] = hit
            out.extend(hit[1])

    def _build(self, search: _Search, queue: QueueName, units: Sequence[RunningUnit],
               context: tuple[Any, ...]) -> _Lent | None:
        """A borrower's :class:`_Lent`; None when the preemptor is one of its units. What
        its whole units hold per node, and their names, are carried from the last build of
        the same key by what changed."""
        assert search.tree is not None
        key, offering, mine, before, now = self._shaped(search, (queue, search.tree.root(queue), *context), units)
        if mine:
            return None
        now.carry(before, search.used.shape)
        assert now.on_nodes is not None
        # a unit's whole piece is offered whenever any of it is (its extras ask a subset)
        whole = now.on_nodes.sum(axis=0)
        at = search.now

        def priced() -> list[_Piece]:
            pieces: list[_Piece] = []
            self._price(key, offering, at, pieces)
            return pieces

        return _Lent(queue, len(offering), whole, now.on_nodes, frozenset(now.names), offering, priced)

    def forget(self, w: RunningUnit) -> None:
        """``w`` was chosen as a victim: it is no candidate any more."""
        self._held.pop(id(w), None)


class _Lent:
    """What a borrowing queue offers a preemptor to reclaim: its pieces in the order of
    cost, with the sums the bounds and the reason read. The pieces are priced and sorted
    when first asked for: most searches end on the sums."""

    __slots__ = ("_offering", "_pieces", "_priced", "_vecs", "names", "on_nodes", "queue", "units", "whole")

    def __init__(self, queue: QueueName, units: int, whole: IntArray, on_nodes: IntArray, names: frozenset[str],
                 offering: Sequence[_Offer], priced: Callable[[], list[_Piece]]) -> None:
        self.queue = queue
        #: how many of its units offer a piece
        self.units = units
        #: the summed requests of those units, whole
        self.whole = whole
        #: per node row, the summed requests of those units' pods there
        self.on_nodes = on_nodes
        #: the keys and uids of all the queue's units looked at
        self.names = names
        self._offering = offering
        self._priced = priced
        self._pieces: tuple[_Piece, ...] | None = None
        self._vecs: IntArray | None = None

    @property
    def pieces(self) -> tuple[_Piece, ...]:
        """The pieces, cheapest first."""
        if self._pieces is None:
            pieces = self._priced()
            pieces.sort(key=lambda pc: pc.cost)
            self._pieces = tuple(pieces)
        return self._pieces

    @property
    def vecs(self) -> IntArray:
        """The pieces' requests, one row each (in no particular order)."""
        if self._vecs is None:
            rows = [s.vec for _, shapes, _ in self._offering for s, _, _ in shapes]
            self._vecs = np.stack(rows) if rows else np.zeros((0, self.whole.shape[0]), dtype=np.int64)
        return self._vecs


def _price(w: RunningUnit, shapes: Sequence[_Shape], now: float, out: list[_Piece]) -> None:
    """Append to ``out`` the pieces ``shapes`` of ``w`` describe, at their cost at ``now``."""
    span = max(0.0, now - w.start) / SECONDS_PER_HOUR
    for s, kind, borrowed in shapes:
        gpu_hours = s.gpus * span
        cost = (gpu_hours, len(s.pods), w.priority, -w.created, w.uid, int(s.whole))
        out.append(_Piece(w, s.pods, s.whole, kind, s.vec, gpu_hours, borrowed, cost))


def _on_nodes(pieces: Sequence[_Piece | Held], shape: tuple[int, ...]) -> IntArray:
    """Per node row, the summed requests of ``pieces``' pods there."""
    out = np.zeros(shape, dtype=np.int64)
    pods = [pod for pc in pieces for pod in pc.pods]
    if pods:
        np.add.at(out, np.fromiter((pod.node for pod in pods), dtype=np.int64, count=len(pods)),
                  np.stack([pod.req for pod in pods]))
    return out


@dataclass(slots=True, frozen=True)
class _Piece:
    """Pods of a unit that may go together (:class:`Held`) as one preemptor may evict
    them: as what kind of victim, at what cost now, and (a reclaim) the resource their
    queue was borrowing."""

    unit: RunningUnit
    pods: tuple[RunningPod, ...]
    whole: bool
    kind: VictimKind
    vec: IntArray
    gpu_hours: float
    borrowed: str
    cost: PieceCost


class _Sums:
    """A set of pieces and what evicting it releases per queue, kept as pieces come and go,
    so that changing a set and checking it cost the same whatever its size."""

    __slots__ = ("_count", "_pieces", "reclaimed", "removed")

    def __init__(self, pieces: Sequence[_Piece] = ()) -> None:
        #: id of a piece -> the piece, in the order they came
        self._pieces: dict[int, _Piece] = {}
        #: queue -> the requests of the set's pieces of that queue
        self.removed: dict[str, IntArray] = {}
        #: queue -> how many of the set's pieces are of that queue
        self._count: dict[str, int] = {}
        #: queue -> how many of the set's pieces are reclaimed from it
        self.reclaimed: dict[str, int] = {}
        for pc in pieces:
            self.add(pc)

    @property
    def pieces(self) -> list[_Piece]:
        return list(self._pieces.values())

    def __len__(self) -> int:
        return len(self._pieces)

    def add(self, pc: _Piece) -> None:
        self._pieces[id(pc)] = pc
        q = pc.unit.queue
        if q is None:
            return
        self.removed[q] = self.removed[q] + pc.vec if q in self.removed else pc.vec.copy()
        self._count[q] = self._count.get(q, 0) + 1
        if pc.kind is VictimKind.RECLAIM:
            self.reclaimed[q] = self.reclaimed.get(q, 0) + 1

    def drop(self, pc: _Piece) -> None:
        del self._pieces[id(pc)]
        q = pc.unit.queue
        if q is None:
            return
        if _decrement(self._count, q):
            self.removed[q] = self.removed[q] - pc.vec
        else:
            del self.removed[q]  # the last of its queue: nothing left over
        if pc.kind is VictimKind.RECLAIM:
            _decrement(self.reclaimed, q)


def _decrement(counts: dict[str, int], key: str) -> bool:
    """One fewer of ``key``; False (and the key gone) when none is left."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
    return bool(left)


class _Search:
    def __init__(
        self,
        p: Preemptor,
        running: Sequence[RunningUnit],
        *,
        alloc: IntArray,
        used: IntArray,
        tree: QueueTree | None,
        scoring: ScoringArrays,
        now: float,
        place: Place,
        cache: PieceCache,
    ) -> None:
        self.p = p
        self.alloc = alloc
        self.used = used
        self.tree = tree
        self.scoring = scoring
        self.now = now
        self.place = place
        self.cache = cache
        mc = max(1, p.min_count)
        self.mc = mc
        self.core = np.ascontiguousarray(p.reqs[:mc], dtype=np.int64)
        self.core_sig = np.ascontiguousarray(p.sig[:mc], dtype=np.int64)
        self.x = self.core.sum(axis=0)
        self.columns = tree.columns if tree is not None else ()
        self.valid = p.queue is None or (tree is not None and tree.leaf_problem(p.queue) is None)
        self.managed: BoolArray = np.zeros(used.shape[1], dtype=np.bool_)
        self.within = WithinQueuePolicy.NEVER
        self.reclaim = ReclaimPolicy.NEVER
        if p.queue is not None and tree is not None and self.valid:
            self.managed = tree.managed(p.queue)
            self.within = tree.queue(p.queue).within_queue
            self.reclaim = tree.queue(p.queue).reclaim
        # nodes any quorum member may use: victims elsewhere cannot help placement
        sigs = np.unique(self.core_sig)
        self.reach: BoolArray = np.asarray(p.masks[sigs].any(axis=0), dtype=np.bool_)
        self.usage: dict[str, IntArray] = {}
        self.nominal: dict[str, IntArray] = {}
        #: queue -> the columns P asks for that the queue is borrowing in
        self._borrowing: dict[str, list[int]] = {}
        #: queue -> the columns P manages that it borrows in, and by how much it borrows
        self._lendable: dict[str, tuple[IntArray, IntArray]] = {}
        #: id of a piece -> what evicting it frees on the nodes in reach
        self._reach_freed: dict[int, IntArray] = {}
        #: the pieces of P's own queue and of unqueued work (and, where no cache entry
        #: serves, of others), built for this search
        self._own: list[_Piece] = []
        #: what each borrowing queue offers to be reclaimed (:meth:`PieceCache.lent`)
        self._lent: list[_Lent] = []
        self._sorted: list[_Piece] | None = None
        if self.valid:
            self._gather(running)
        #: whether a set with a reclaimed piece, and one without, may pass the quota check,
        #: and whether any set may free room for every quorum member (:meth:`_bounds`)
        self.reclaim_may, self.plain_may, self.place_may = True, True, True

    # -- candidates

    def _queue_arrays(self, q: str) -> tuple[IntArray, IntArray]:
        assert self.tree is not None
        if q not in self.usage:
            self.usage[q], self.nominal[q] = self.cache.queue_arrays(self.tree, q, self.now)
        return self.usage[q], self.nominal[q]

    def _borrowing_columns(self, queue: str) -> list[int]:
        """The columns P asks for that ``queue`` is borrowing in."""
        cols = self._borrowing.get(queue)
        if cols is None:
            used, nominal = self._queue_arrays(queue)
            cols = self._borrowing[queue] = [int(c) for c in np.flatnonzero(self.managed & (self.x > 0) & (used > nominal))]
        return cols

    def _borrowed_resource(self, queue: str, positive: frozenset[int]) -> int:
        """A column P asks for, a piece uses (``positive``) and ``queue`` is borrowing in;
        -1 if none."""
        return next((c for c in self._borrowing_columns(queue) if c in positive), -1)

    @property
    def pieces(self) -> list[_Piece]:
        """Every candidate piece, cheapest first."""
        if self._sorted is None:
            self._sorted = sorted(itertools.chain(self._own, *(lent.pieces for lent in self._lent)),
                                  key=lambda pc: pc.cost)
        return self._sorted

    def _gather(self, running: Sequence[RunningUnit]) -> None:
        """The candidates, queue by queue: another queue's work is only ever reclaimed, and
        only from a borrower, so a queue that borrows nothing P asks for is passed over
        whole; a borrower's pieces come from the cycle's cache."""
        p, tree, width = self.p, self.tree, self.used.shape[1]
        groups: dict[QueueName | None, list[RunningUnit]] = {}
        for w in running:
            groups.setdefault(w.queue, []).append(w)
        for q, units in groups.items():
            lent: _Lent | None = None
            if q is not None and q != p.queue and tree is not None and p.queue is not None:
                if tree.leaf_problem(q) is not None:
                    continue
                cols = self._borrowing_columns(q)
                if not cols:
                    continue
                lent = self.cache.lent(self, q, units, cols)
            if lent is not None:
                if lent.units:
                    self._lent.append(lent)
                continue
            if tree is not None and p.queue is not None and q in (None, p.queue):
                self._own.extend(self.cache.own(self, q, units))
                continue
            for w in units:
                self.pieces_of(w, width, self._own)

    def is_preemptor(self, w: RunningUnit) -> bool:
        """Whether ``w`` is P's own running part."""
        return w.key == self.p.key or w.uid == self.p.uid

    def pieces_of(self, w: RunningUnit, width: int, out: list[_Piece]) -> None:
        """Append to ``out`` the pieces of ``w`` P may evict (whole first)."""
        self.priced(w, self.shapes_of(w, width), out)

    def shapes_of(self, w: RunningUnit, width: int) -> list[_Shape]:
        """What of ``w`` P may evict (whole first), as what kind of victim and (a reclaim)
        the resource its queue borrows: its pieces before they are priced."""
        if w.queue is not None and w.queue != self.p.queue and self.tree is not None and (
                self.tree.leaf_problem(w.queue) is not None or not self._borrowing_columns(w.queue)):
            return []  # another queue's work is only ever reclaimed, and only from a borrower
        if not w.pods:
            return []
        kind = eviction_rule(w, self.p, self.tree)
        if kind is None:
            return []
        out: list[_Shape] = []
        for s in self.cache.held(w, width):
            borrowed = ""
            if kind is VictimKind.RECLAIM:
                assert w.queue is not None
                col = self._borrowed_resource(w.queue, s.positive)
                if col < 0:
                    continue
                borrowed = self.columns[col]
            out.append((s, kind, borrowed))
        return out

    def priced(self, w: RunningUnit, shapes: Sequence[_Shape], out: list[_Piece]) -> None:
        """Append to ``out`` the pieces ``shapes`` of ``w`` describe, at their cost now."""
        _price(w, shapes, self.now, out)

    def _message(self, pc: _Piece) -> str:
        """What the victim ``pc`` is told (built for the chosen victims only)."""
        kind = eviction_kind(pc.unit, self.p, self.tree)
        assert kind is not None
        message = kind[1]
        if pc.kind is VictimKind.RECLAIM:
            message = f"{message}: queue {pc.unit.queue} was borrowing {pc.borrowed}"
        if not pc.whole:
            message = f"{message}; only its {len(pc.pods)} elastic extra pod(s)"
        return message

    # -- bounds

    def _bounds(self) -> bool:
        """Whether some set of the candidates may be valid, by what evicting every one of
        them (one piece per unit, the whole unit: it frees the most) could free at most:
        on the nodes in reach, and in quota. Quota is weighed apart for the sets that
        reclaim (restore only: P's queue within its nominal once its own candidates are
        gone) and for those that do not; :meth:`_check` skips a set whose kind cannot pass.
        A necessary condition only: the search decides."""
        width = self.used.shape[1]
        everything = self._one_per_unit(self._own)
        freed = np.zeros(width, dtype=np.int64)
        for pc in everything:
            freed += self._in_reach(pc)
        all_in_reach = bool(self.reach.all())
        for lent in self._lent:
            if all_in_reach:
                freed += lent.whole
            else:
                for pc in lent.pieces:
                    if pc.whole:
                        freed += self._in_reach(pc)
        if bool((freed < self._short()).any()) or not self._room_for_each_member(everything):
            self.reclaim_may = self.plain_may = self.place_may = False
            return False
        p, tree = self.p, self.tree
        if p.queue is None or tree is None:
            return True
        removed = _Sums(everything).removed
        for lent in self._lent:
            removed[lent.queue] = lent.whole
        own = [(p.queue, removed[p.queue])] if p.queue in removed else []
        _, over = self._after(removed.get(p.queue))
        reclaims = bool(self._lent) or any(pc.kind is VictimKind.RECLAIM for pc in everything)
        self.reclaim_may = reclaims and not bool(over.any()) \
            and tree.admissible(p.queue, self.x, without=sorted(removed.items())) is None
        self.plain_may = tree.admissible(p.queue, self.x, without=own) is None
        return self.reclaim_may or self.plain_may

    def _room_for_each_member(self, everything: Sequence[_Piece]) -> bool:
        """Whether each quorum member has a node it may use with room for it once every
        candidate there is gone (no set frees more on a node)."""
        freeable = _on_nodes(everything, self.used.shape)
        for lent in self._lent:
            freeable += lent.on_nodes
        room = self.alloc - self.used + freeable
        for req, sig in {(tuple(r), int(g)): (r, g) for r, g in zip(self.core.tolist(), self.core_sig.tolist(), strict=True)}.values():
            fits = (room >= np.asarray(req, dtype=np.int64)).all(axis=1) & self.p.masks[sig]
            if not bool(fits.any()):
                return False
        return True

    def _ruled_out_by_quota(self) -> str | None:
        """When quota alone rules every set out, the reason the search ends with, read off
        the sums without building or ordering the borrowers' pieces; else None.

        Every set fails the quota check when P's queue stays above its nominal with all its
        own candidates gone (no set may reclaim) and is not admitted then either (no set
        without reclaim passes). Adding candidates as they help then adds every piece of
        P's queue (each helps either failure; a unit ends whole) and, if any piece a
        borrower lends passes "never below nominal" alone, one such piece: it ends with
        "above its nominal" for P's queue without its own candidates, else with the quota's
        reason for that."""
        p, tree = self.p, self.tree
        if p.queue is None or tree is None or any(pc.kind is VictimKind.RECLAIM for pc in self._own):
            return None
        own = [pc.vec for pc in self._own if pc.unit.queue == p.queue and pc.whole]
        removed = np.sum(own, axis=0) if own else None
        after, over = self._after(removed)
        if self._lent and not over.any():
            return None
        quota = tree.admissible(p.queue, self.x, without=[] if removed is None else [(p.queue, removed)])
        if quota is None:
            return None
        if any(self._alone(lent) for lent in self._lent):
            return self._above_nominal(after, over)
        return quota

    def _alone(self, lent: _Lent) -> bool:
        """Whether some piece ``lent`` offers, reclaimed alone, keeps its queue at or above
        its nominal where it borrows (rule "never below nominal")."""
        cols, over = self._lending(lent.queue)
        return not bool((lent.vecs[:, cols] > over).any(axis=1).all())

    @staticmethod
    def _one_per_unit(pieces: Sequence[_Piece]) -> list[_Piece]:
        """One piece per unit, the whole unit where it is a candidate: it frees the most."""
        units: dict[int, _Piece] = {}
        for pc in pieces:
            if id(pc.unit) not in units or pc.whole:
                units[id(pc.unit)] = pc
        return sorted(units.values(), key=lambda pc: pc.cost)

    # -- checks

    def _below_nominal(self, sums: _Sums) -> str | None:
        """Rule "never below nominal" for the reclaim victims' queues."""
        q = self._taken_below(sums)
        if q is None:
            return None
        nominal = self._queue_arrays(q)[1]
        c = int(np.argmax(self._below_in(sums, q)))
        res = self.columns[c]
        return f"evicting it would take queue {q} below its nominal {format_units(res, int(nominal[c]))} {res}"

    def _taken_below(self, sums: _Sums) -> str | None:
        """The first reclaim victims' queue (by name) the set takes below its nominal in
        a resource it borrows; None when none."""
        for q in sorted(sums.reclaimed):
            if self._below(sums, q):
                return q
        return None

    def _lending(self, q: str) -> tuple[IntArray, IntArray]:
        """The columns P manages in which queue ``q`` borrows, and how much it borrows in
        each: taking more than that from it takes it below its nominal."""
        found = self._lendable.get(q)
        if found is None:
            used, nominal = self._queue_arrays(q)
            cols = np.flatnonzero(self.managed & (used > nominal))
            found = self._lendable[q] = (cols, (used - nominal)[cols])
        return found

    def _below(self, sums: _Sums, q: str) -> bool:
        """Whether the set takes queue ``q`` below its nominal in a resource it borrows."""
        cols, over = self._lending(q)
        return bool((sums.removed[q][cols] > over).any())

    def _below_in(self, sums: _Sums, q: str) -> BoolArray:
        """The columns the set takes queue ``q`` below its nominal in, of those it borrows."""
        cols, over = self._lending(q)
        out = np.zeros(self.managed.shape[0], dtype=np.bool_)
        out[cols] = sums.removed[q][cols] > over
        return out

    def _by_room(self) -> bool:
        """Whether more room never places fewer of the quorum: its members are alike (one
        request, one mask), none asks for cards, and the bare kernel (or its twin) places
        them, each wherever room is left, so how many it places is what each node has room
        for, summed, whatever the order."""
        return (self.place in (kernels.place, reference.place) and bool((self.core == self.core[0]).all())
                and bool((self.core_sig == self.core_sig[0]).all())
                and not reference.asks_cards(self.core[0].tolist(), self.scoring.device.tolist()))

    def _hopeless(self, sums: _Sums) -> bool:
        """Whether the bounds already say that the set fails the quota check."""
        return not (self.reclaim_may if sums.reclaimed else self.plain_may)

    def _check(self, pieces: Sequence[_Piece] | _Sums) -> tuple[str, str, IntArray | None]:
        """``(failure kind, message, nodes)``; kind "" and the quorum's nodes when it fits."""
        sums = pieces if isinstance(pieces, _Sums) else _Sums(pieces)
        p = self.p
        if p.queue is not None and self.tree is not None:
            if sums.reclaimed:
                below = self._below_nominal(sums)
                if below is not None:
                    return "victim", below, None
                after, over = self._after(sums.removed.get(p.queue))
                if over.any():
                    return "nominal", self._above_nominal(after, over), None
            reason = self.tree.admissible(p.queue, self.x, without=sorted(sums.removed.items()))
            if reason is not None:
                return "quota", reason, None
        if not self.place_may:  # the bounds: no set frees room for every member
            return "place", f"the quorum of {self.mc} pod(s) does not fit on the nodes", None
        scratch = self.used.copy()
        for pc in sums.pieces:
            for pod in pc.pods:
                scratch[pod.node] -= pod.req
        out = np.full(self.mc, -1, dtype=np.int64)
        problem = PlacementProblem(
            self.alloc, scratch, self.core, self.core_sig, p.masks, p.static_score, self.scoring, self.mc,
        )
        placed = self.place(problem, out)
        if placed < self.mc:
            return "place", f"the quorum of {self.mc} pod(s) does not fit on the nodes", None
        return "", "", out

    def _after(self, removed: IntArray | None) -> tuple[IntArray, BoolArray]:
        """P's queue's usage with ``removed`` released and P admitted, and the columns P
        asks for in which that is above its nominal (restore only)."""
        assert self.p.queue is not None
        used, nominal = self._queue_arrays(self.p.queue)
        after = used - (0 if removed is None else removed) + self.x
        return after, self.managed & (self.x > 0) & (after > nominal)

    def _above_nominal(self, after: IntArray, over: BoolArray) -> str:
        assert self.p.queue is not None
        nominal = self._queue_arrays(self.p.queue)[1]
        c = int(np.argmax(over))
        res = self.columns[c]
        return (
            f"queue {self.p.queue} would use {format_units(res, int(after[c]))} {res}, above "
            f"its nominal {format_units(res, int(nominal[c]))}: reclaim only restores a queue's nominal"
        )

    def _passes(self, sums: _Sums) -> bool:
        """Whether the set is valid; sets the bounds rule out are not checked."""
        return not self._hopeless(sums) and not self._check(sums)[0]

    def _helps(self, pc: _Piece, failure: str) -> bool:
        p = self.p
        if failure == "nominal":
            return pc.unit.queue == p.queue
        if failure == "quota":
            return pc.unit.queue is not None and (pc.unit.queue == p.queue or pc.kind is VictimKind.RECLAIM)
        if failure == "place":
            return any(bool(self.reach[pod.node]) for pod in pc.pods)
        return False

    # -- search

    def _greedy(self, candidates: Sequence[_Piece]) -> tuple[list[_Piece] | None, str]:
        chosen = _Sums()
        failure, message, _ = self._check(chosen)
        if not failure:
            return chosen.pieces, ""
        by_unit: dict[int, _Piece] = {}
        for pc in candidates:
            same = by_unit.get(id(pc.unit))
            if same is not None and (same.whole or not pc.whole):
                continue
            if not self._helps(pc, failure):
                continue
            if same is not None:
                chosen.drop(same)
            chosen.add(pc)
            # (only its queue may go below its nominal: an addition that took one there was undone)
            if pc.kind is VictimKind.RECLAIM and self._below(chosen, pc.unit.queue):  # type: ignore[arg-type]
                chosen.drop(pc)
                if same is not None:
                    chosen.add(same)
                continue
            by_unit[id(pc.unit)] = pc
            failure, message, _ = self._check(chosen)
            if not failure:
                return chosen.pieces, ""
        return None, message

    def _prune(self, chosen: list[_Piece]) -> list[_Piece]:
        extras = {id(pc.unit): pc for pc in self.pieces if not pc.whole}
        sums = _Sums(chosen)
        for pc in sorted(chosen, key=lambda c: c.cost, reverse=True):
            sums.drop(pc)
            if self._passes(sums):
                continue
            smaller = extras.get(id(pc.unit))
            if pc.whole and smaller is not None:
                sums.add(smaller)
                if self._passes(sums):
                    continue
                sums.drop(smaller)
            sums.add(pc)
        return sums.pieces

    def _cheapest(self, candidates: Sequence[_Piece]) -> tuple[list[_Piece] | None, str]:
        """The cheapest valid set of ``candidates`` the search finds (see the module
        docstring), or None and why the last set tried failed."""
        chosen, message = self._greedy(candidates)
        if chosen is None:
            chosen = self._fallback(candidates)
            if chosen is None:
                return None, message
        best = self._prune(chosen)
        cost = _set_cost(best)
        if len(candidates) <= EXHAUSTIVE_PIECES:
            return self._exhaustive(candidates, best, cost), ""
        # a cheaper set holds only pieces cheaper than ``best`` (candidates are sorted)
        cheaper = list(itertools.takewhile(lambda pc: _set_cost([pc]) < cost, candidates))
        for order in self._node_orders(cheaper, candidates, cost):
            trial, _ = self._greedy(order)
            if trial is None:
                continue
            trial = self._prune(trial)
            if _set_cost(trial) < cost:
                best, cost = trial, _set_cost(trial)
        return best, ""

    def _fallback(self, candidates: Sequence[_Piece]) -> list[_Piece] | None:
        """A valid set when adding candidates as they help found none. The placement
        kernel places members in order, each on its best node, so freeing more room can
        make it fail where less succeeds (a small member takes the room a large one
        needed): evicting everything is tried, then sets cheapest first (few candidates,
        at most :data:`FALLBACK_CHECKS` checks), else everything with the most expensive
        pieces dropped one by one while enough room is still freed in all."""
        everything = self._one_per_unit(candidates)
        chosen = _Sums(everything)
        failure = "quota" if self._hopeless(chosen) else self._check(chosen)[0]
        if not failure:
            return everything
        if failure == "place" and self._by_room():
            # every set frees at most this much room on each node: none places the quorum
            return None
        if len(candidates) <= EXHAUSTIVE_PIECES:
            return self._exhaustive(candidates, None, None, checks=FALLBACK_CHECKS)
        short = self._short()
        freed = np.zeros(self.used.shape[1], dtype=np.int64)
        for pc in everything:
            freed += self._in_reach(pc)
        below: str | None = None  # a queue the set takes below its nominal
        for pc in reversed(everything):
            rest = freed - self._in_reach(pc)
            if len(chosen) == 1 or bool((rest < short).any()):
                continue
            chosen.drop(pc)
            freed = rest
            if below is not None and below in chosen.reclaimed and (pc.unit.queue != below or self._below(chosen, below)):
                continue  # that queue is still taken below its nominal: the set fails
            if self._passes(chosen):
                return chosen.pieces
            below = self._taken_below(chosen) if chosen.reclaimed and self.p.queue is not None and self.tree is not None else None
        return None

    def _short(self) -> IntArray:
        """What victims must free at least, in all, on the nodes in reach."""
        free = np.clip(self.alloc[self.reach] - self.used[self.reach], 0, None).sum(axis=0)
        return np.asarray((self.x - free) * (self.x > 0), dtype=np.int64)

    def _in_reach(self, pc: _Piece) -> IntArray:
        """What evicting ``pc`` frees on the nodes the quorum may use (read only)."""
        freed = self._reach_freed.get(id(pc))
        if freed is None:
            freed = np.zeros(self.used.shape[1], dtype=np.int64)
            for pod in pc.pods:
                if self.reach[pod.node]:
                    freed += pod.req
            self._reach_freed[id(pc)] = freed
        return freed

    def _exhaustive(
        self, candidates: Sequence[_Piece], best: list[_Piece] | None, cost: SetCost | None, *,
        checks: int | None = None,
    ) -> list[_Piece] | None:
        """Every set of ``candidates`` (one piece per unit at most) cheaper than ``best``
        (a valid set of cost ``cost``; None: any set), cheapest first: the first valid one,
        else ``best``; at most ``checks`` of them are checked when given.
        Sets that cannot free enough on the nodes in reach, all summed, are not checked."""
        units: dict[int, list[_Piece]] = {}
        for pc in candidates:
            units.setdefault(id(pc.unit), []).append(pc)
        short = self._short()
        sets: list[tuple[SetCost, list[_Piece]]] = []
        for combo in itertools.product(*([None, *pcs] for pcs in units.values())):
            chosen = [pc for pc in combo if pc is not None]
            if not chosen:
                continue
            total = np.sum([self._in_reach(pc) for pc in chosen], axis=0)
            if bool((total < short).any()):
                continue
            c = _set_cost(chosen)
            if cost is None or c < cost:
                sets.append((c, chosen))
        sets.sort(key=lambda entry: entry[0])
        for _, chosen in sets[:checks]:
            if not self._check(chosen)[0]:
                return chosen
        return best

    def _node_orders(
        self, cheaper: Sequence[_Piece], candidates: Sequence[_Piece], best: SetCost,
    ) -> Iterator[list[_Piece]]:
        """Orders of ``candidates`` for the add-then-drop search that start with one
        node's cheapest set of ``cheaper`` pieces (those that cost less than ``best``
        alone): the :data:`NODE_TRIALS` nodes cheapest to free for the quorum's largest
        member, each only when it may beat ``best``; for a gang, one more that takes the
        nodes in that order."""
        if not cheaper:
            return
        ranked = _rank_nodes(cheaper, self.core.max(axis=0), self.alloc, self.used, self.reach)
        tried: list[tuple[SetCost, int, list[_Piece]]] = []
        for n, pieces in ranked[:NODE_TRIALS]:
            if _set_cost(pieces[:1]) >= best:
                continue  # its cheapest piece alone costs as much as the best set
            deficit = self.core.max(axis=0) - (self.alloc[n] - self.used[n])
            own = _node_set(n, pieces, deficit)
            if own is not None and _set_cost(own) < best:
                tried.append((_set_cost(own), n, own))
        tried.sort(key=lambda t: (t[0], t[1]))
        for _, _, own in tried:
            yield _first(own, candidates)
        if self.mc > 1 and len(ranked) > 1:
            yield _first([pc for _, pieces in ranked for pc in pieces], candidates)

    def run(self) -> Preemption | NoPreemption:
        p = self.p
        if not self.valid:
            return NoPreemption(f"queue {p.queue} is not a valid leaf queue")
        if p.reqs.shape[0] < self.mc:
            return NoPreemption(f"only {p.reqs.shape[0]} of {self.mc} required members exist")
        failure, _, out = self._check([])
        if not failure and out is not None:
            return Preemption(victims=(), nodes=tuple(int(n) for n in out), gpu_hours=0.0, pods=0,
                              placed=self.core.copy())
        if not self._own and not self._lent:
            return NoPreemption(self._nobody())
        ruled_out = self._ruled_out_by_quota()
        if ruled_out is not None:
            return self._none(ruled_out)
        if not self._bounds():
            # no set works: the reason is the one adding candidates as they help ends with
            _, message = self._greedy(self.pieces)
            return self._none(message)
        extras = [pc for pc in self.pieces if not pc.whole]
        chosen: list[_Piece] | None = None
        if extras:
            chosen, _ = self._cheapest(extras)
        message = ""
        if chosen is None:
            chosen, message = self._cheapest(self.pieces)
        if chosen is None:
            return self._none(message)
        failure, message, out = self._check(chosen)
        if failure or out is None:  # pruning only keeps sets that pass: a bug
            raise AssertionError(f"preemption search lost its solution: {message}")
        chosen.sort(key=lambda c: c.cost)
        victims = tuple(
            Victim(pc.unit, pc.pods, pc.kind, pc.gpu_hours, self._message(pc), pc.borrowed) for pc in chosen
        )
        return Preemption(
            victims=victims,
            nodes=tuple(int(n) for n in out),
            gpu_hours=sum(v.gpu_hours for v in victims),
            pods=sum(len(v.pods) for v in victims),
            placed=self.core.copy(),
        )

    def _none(self, message: str) -> NoPreemption:
        units = len({id(pc.unit) for pc in self._own}) + sum(lent.units for lent in self._lent)
        return NoPreemption(f"evicting any of the {units} unit(s) it may preempt does not make room: {message}")

    def _nobody(self) -> str:
        p = self.p
        if p.queue is None:
            return f"no running unqueued work has a priority below {p.priority}"
        within = self.within.value
        reclaim = self.reclaim.value
        return (
            f"no running work may be preempted for it: queue {p.queue} preempts {within} "
            f"within the queue and reclaims {reclaim} from borrowing queues of its cohort"
        )


def _first(lead: Sequence[_Piece], candidates: Sequence[_Piece]) -> list[_Piece]:
    """``lead`` (each piece once), then the other candidates in their order."""
    seen: set[int] = set()
    out: list[_Piece] = []
    for pc in (*lead, *candidates):
        if id(pc) not in seen:
            seen.add(id(pc))
            out.append(pc)
    return out


def _rank_nodes(
    candidates: Sequence[_Piece], need: IntArray, alloc: IntArray, used: IntArray, reach: BoolArray,
) -> list[tuple[int, list[_Piece]]]:
    """The nodes in reach that candidates run on, with the candidates touching each
    (cheapest first), ranked by what freeing room for ``need`` there costs when their work
    is evicted cheapest first (an upper bound of the node's cheapest set); nodes where that
    frees too little are left out. Array arithmetic over all (piece, node) pairs at once:
    this runs after every search that found a set among many candidates, at any cluster
    size."""
    rows: list[int] = []
    ranks: list[int] = []
    vecs: list[IntArray] = []
    touching: dict[int, list[_Piece]] = {}
    for rank, pc in enumerate(candidates):
        for pod in pc.pods:
            if not reach[pod.node]:
                continue
            pieces = touching.setdefault(pod.node, [])
            if not pieces or pieces[-1] is not pc:
                pieces.append(pc)
            rows.append(pod.node)
            ranks.append(rank)
            vecs.append(pod.req)
    if not rows:
        return []
    node = np.asarray(rows, dtype=np.int64)
    order = np.lexsort((np.asarray(ranks, dtype=np.int64), node))
    node = node[order]
    freed = np.cumsum(np.stack(vecs)[order], axis=0)
    ranked = np.asarray(ranks, dtype=np.int64)[order]
    first = np.ones(len(order), dtype=np.bool_)
    first[1:] = node[1:] != node[:-1]
    # a piece's hours count once on a node: at its first pod there
    new_piece = first.copy()
    new_piece[1:] |= ranked[1:] != ranked[:-1]
    hours = np.where(new_piece, np.asarray([candidates[r].gpu_hours for r in ranked.tolist()]), 0.0)
    start = np.flatnonzero(first)
    group = np.cumsum(first) - 1
    before = np.vstack([np.zeros((1, freed.shape[1]), dtype=np.int64), freed])[start][group]
    covered = ((freed - before) >= (need - (alloc[node] - used[node]))).all(axis=1)
    cost = np.cumsum(hours)
    cost = cost - np.concatenate([[0.0], cost])[start][group]
    best: dict[int, float] = {}
    for i in np.flatnonzero(covered):
        n = int(node[i])
        if n not in best:
            best[n] = float(cost[i])
    return [(n, touching[n]) for n in sorted(best, key=lambda n: (best[n], n))]


def _node_set(n: int, pieces: Sequence[_Piece], deficit: IntArray) -> list[_Piece] | None:
    """The cheapest set of ``pieces`` (one per unit) whose pods on node ``n`` free
    ``deficit`` there; every set is weighed for up to :data:`NODE_EXACT_UNITS` units, else
    sets are weighed cheapest first (up to :data:`NODE_SETS` of them), else pieces are
    taken cheapest first. None when they cannot."""
    units: dict[int, list[_Piece]] = {}
    for pc in pieces:
        units.setdefault(id(pc.unit), []).append(pc)
    on_node = {id(pc): sum((pod.req for pod in pc.pods if pod.node == n), np.zeros_like(deficit))
               for pc in pieces}
    if len(units) > NODE_EXACT_UNITS:
        found = _cheapest_first(pieces, on_node, deficit)
        if found is not None:
            return found
        chosen: list[_Piece] = []
        freed = np.zeros_like(deficit)
        for pc in pieces:
            if any(c.unit is pc.unit for c in chosen):
                continue
            chosen.append(pc)
            freed = freed + on_node[id(pc)]
            if bool((freed >= deficit).all()):
                return chosen
        return None
    best: tuple[SetCost, list[_Piece]] | None = None
    for combo in itertools.product(*([None, *pcs] for pcs in units.values())):
        chosen = [pc for pc in combo if pc is not None]
        freed = np.sum([on_node[id(pc)] for pc in chosen], axis=0) if chosen else np.zeros_like(deficit)
        if chosen and bool((freed >= deficit).all()):
            cost = _set_cost(chosen)
            if best is None or cost < best[0]:
                best = (cost, chosen)
    return None if best is None else best[1]


def _cheapest_first(
    pieces: Sequence[_Piece], on_node: dict[int, IntArray], deficit: IntArray,
) -> list[_Piece] | None:
    """The cheapest set of ``pieces`` (one per unit) whose ``on_node`` room covers
    ``deficit``, by weighing sets in the order of their GPU-hours and pods (a heap of sets
    over the pieces in that order: each set leads to itself with the next piece added, or
    with its last piece swapped for the next one); among sets of the first such cost, the
    one :func:`_set_cost` puts first. None when :data:`NODE_SETS` sets settle nothing."""
    order = sorted(pieces, key=lambda pc: (pc.gpu_hours, len(pc.pods), pc.cost))
    if not order:
        return None

    def key(idx: tuple[int, ...]) -> tuple[float, int]:
        return round(math.fsum(order[i].gpu_hours for i in idx), 9), sum(len(order[i].pods) for i in idx)

    room = [on_node[id(pc)] for pc in order]
    # (cost, indices into ``order``, the room they free): indices are unique, so the
    # arrays are never compared
    heap: list[tuple[tuple[float, int], tuple[int, ...], IntArray]] = [(key((0,)), (0,), room[0])]
    found: list[list[_Piece]] = []
    for _ in range(NODE_SETS):
        if not heap:
            break
        cost, idx, freed = heapq.heappop(heap)
        if found and cost > _set_cost(found[0])[:2]:
            break
        chosen = [order[i] for i in idx]
        if bool((freed >= deficit).all()) and len({id(pc.unit) for pc in chosen}) == len(chosen):
            found.append(chosen)
        nxt = idx[-1] + 1
        if nxt < len(order):
            heapq.heappush(heap, (key((*idx, nxt)), (*idx, nxt), freed + room[nxt]))
            swapped = (*idx[:-1], nxt)
            heapq.heappush(heap, (key(swapped), swapped, freed - room[idx[-1]] + room[nxt]))
    return min(found, key=_set_cost) if found else None


def select_victims(
    preemptor: Preemptor,
    running: Sequence[RunningUnit],
    *,
    alloc: IntArray,
    used: IntArray,
    tree: QueueTree | None,
    scoring: ScoringArrays,
    now: float,
    place: Place = kernels.place,
    cache: PieceCache | None = None,
) -> Preemption | NoPreemption:
    """The victims that make room for ``preemptor``'s quorum, or why there are none.

    ``alloc``/``used``: the snapshot's arrays with every running unit's pods charged;
    ``tree``: the queues with every running unit charged (None: no queues at all);
    ``running``: the candidates (the caller may pass all running units: the rules above
    filter them). ``place`` is the placement: the kernel, its twin, or one built on them
    (:meth:`batchsched.core.placer.Placer.placer`). ``cache``: the pieces of the running
    units kept across the searches of one cycle (:class:`PieceCache`; None: built for this
    search alone). Nothing else is modified. A unit that fits already gets a
    :class:`Preemption` with no victims.
    """
    search = _Search(
        preemptor, running, alloc=alloc, used=used, tree=tree, scoring=scoring, now=now, place=place,
        cache=PieceCache() if cache is None else cache,
    )
    return search.run()
