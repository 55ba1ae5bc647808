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
that suffices: sets of extras alone are tried first. Among valid sets the search prefers
the one losing the fewest GPU-hours of work already done (GPUs x time since start), then
the fewest pods, then lower priority, then newer units: candidates are added cheapest
first until the quorum fits (fit = quota check with the victims released, and
``place_members`` on a scratch copy of ``used`` with the victims' pods removed), then every
victim that is not needed is dropped again, most expensive first (a whole gang may shrink
to its extras). Greedy, not exhaustive: the set is minimal (no victim can be dropped) but
not always the cheapest.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from batchsched.core.placement import kernels
from batchsched.core.placement.scoring import ScoringArrays
from batchsched.core.plan import QueueName, RunningPod, RunningUnit, Victim, VictimKind
from batchsched.core.preemption.candidates import eviction_kind
from batchsched.core.quantity import format_units
from batchsched.core.queues import (
    QueueTree,
    ReclaimPolicy,
    WithinQueuePolicy,
)

__all__ = [
    "NoPreemption",
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
Kernel = Callable[..., int]

SECONDS_PER_HOUR = 3600.0


@dataclass(slots=True, frozen=True)
class Preemptor:
    """The pending unit, laid out as :func:`batchsched.core.placement.kernels.place_members` takes it.

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


@dataclass(slots=True)
class _Piece:
    unit: RunningUnit
    pods: tuple[RunningPod, ...]
    whole: bool
    kind: VictimKind
    vec: IntArray
    gpu_hours: float
    message: str = ""
    borrowed: str = ""
    cost: tuple[float, int, int, float, str, int] = field(default=(0.0, 0, 0, 0.0, "", 0))


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
        place: Kernel,
    ) -> None:
        self.p = p
        self.alloc = alloc
        self.used = used
        self.tree = tree
        self.scoring = scoring
        self.now = now
        self.place = place
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
        self.pieces: list[_Piece] = []
        if self.valid:
            for w in running:
                self._candidates(w)
        self.pieces.sort(key=lambda pc: pc.cost)

    # -- candidates

    def _queue_arrays(self, q: str) -> tuple[IntArray, IntArray]:
        assert self.tree is not None
        if q not in self.usage:
            self.usage[q] = self.tree.usage_vector(q)
            self.nominal[q] = self.tree.nominal_vector(q)
        return self.usage[q], self.nominal[q]

    def _kind(self, w: RunningUnit) -> tuple[VictimKind, str] | None:
        return eviction_kind(w, self.p, self.tree)

    def _borrowing_columns(self, queue: str) -> list[int]:
        """The columns P asks for that ``queue`` is borrowing in."""
        cols = self._borrowing.get(queue)
        if cols is None:
            used, nominal = self._queue_arrays(queue)
            cols = self._borrowing[queue] = [int(c) for c in np.flatnonzero(self.managed & (self.x > 0) & (used > nominal))]
        return cols

    def _borrowed_resource(self, queue: str, vec: IntArray) -> int:
        """A column P asks for, ``vec`` uses and ``queue`` is borrowing in; -1 if none."""
        return next((c for c in self._borrowing_columns(queue) if vec[c] > 0), -1)

    def _candidates(self, w: RunningUnit) -> None:
        if w.queue is not None and w.queue != self.p.queue and self.tree is not None and (
                self.tree.leaf_problem(w.queue) is not None or not self._borrowing_columns(w.queue)):
            return  # another queue's work is only ever reclaimed, and only from a borrower
        kind = self._kind(w)
        if kind is None or not w.pods:
            return
        width = self.used.shape[1]
        options: list[tuple[tuple[RunningPod, ...], bool]] = [(w.pods, True)]
        extras = tuple(pod for pod in w.pods if pod.elastic)
        if extras and len(extras) < len(w.pods):
            options.append((extras, False))
        span = max(0.0, self.now - w.start) / SECONDS_PER_HOUR
        for pods, whole in options:
            if len(pods) == 1:
                vec = pods[0].req  # read only
            else:
                vec = np.zeros(width, dtype=np.int64)
                for pod in pods:
                    vec += pod.req
            message, borrowed = kind[1], ""
            if kind[0] is VictimKind.RECLAIM:
                assert w.queue is not None
                col = self._borrowed_resource(w.queue, vec)
                if col < 0:
                    continue
                borrowed = self.columns[col]
                message = f"{message}: queue {w.queue} was borrowing {borrowed}"
            if not whole:
                message = f"{message}; only its {len(pods)} elastic extra pod(s)"
            gpu_hours = sum(pod.gpus for pod in pods) * span
            piece = _Piece(w, pods, whole, kind[0], vec, gpu_hours, message, borrowed)
            piece.cost = (gpu_hours, len(pods), w.priority, -w.created, w.uid, int(whole))
            self.pieces.append(piece)

    # -- checks

    def _removed(self, pieces: Sequence[_Piece]) -> dict[str, IntArray]:
        out: dict[str, IntArray] = {}
        for pc in pieces:
            if pc.unit.queue is None:
                continue
            q = pc.unit.queue
            out[q] = out[q] + pc.vec if q in out else pc.vec.copy()
        return out

    def _below_nominal(self, pieces: Sequence[_Piece]) -> str | None:
        """Rule "never below nominal" for the reclaim victims' queues."""
        removed = self._removed(pieces)
        reclaimed = {pc.unit.queue for pc in pieces if pc.kind is VictimKind.RECLAIM}
        for q in sorted(q for q in reclaimed if q is not None):
            used, nominal = self._queue_arrays(q)
            borrowing = self.managed & (used > nominal)
            bad = borrowing & (used - removed[q] < nominal)
            if bad.any():
                c = int(np.argmax(bad))
                res = self.columns[c]
                return (
                    f"evicting it would take queue {q} below its nominal "
                    f"{format_units(res, int(nominal[c]))} {res}"
                )
        return None

    def _check(self, pieces: Sequence[_Piece]) -> tuple[str, str, IntArray | None]:
        """``(failure kind, message, nodes)``; kind "" and the quorum's nodes when it fits."""
        p = self.p
        if p.queue is not None and self.tree is not None:
            removed = self._removed(pieces)
            if any(pc.kind is VictimKind.RECLAIM for pc in pieces):
                below = self._below_nominal(pieces)
                if below is not None:
                    return "victim", below, None
                used, nominal = self._queue_arrays(p.queue)
                after = used - removed.get(p.queue, 0) + self.x
                over = self.managed & (self.x > 0) & (after > nominal)
                if over.any():
                    c = int(np.argmax(over))
                    res = self.columns[c]
                    return "nominal", (
                        f"queue {p.queue} would use {format_units(res, int(after[c]))} {res}, above "
                        f"its nominal {format_units(res, int(nominal[c]))}: reclaim only restores a "
                        "queue's nominal"
                    ), None
            reason = self.tree.admissible(p.queue, self.x, without=sorted(removed.items()))
            if reason is not None:
                return "quota", reason, None
        scratch = self.used.copy()
        for pc in pieces:
            for pod in pc.pods:
                scratch[pod.node] -= pod.req
        out = np.full(self.mc, -1, dtype=np.int64)
        s = self.scoring
        placed = self.place(
            self.alloc, scratch, self.core, self.core_sig, p.masks, p.static_score,
            s.weights, s.scalar, s.shape_u, s.shape_s, s.strategy, self.mc, out, s.device,
        )
        if placed < self.mc:
            return "place", f"the quorum of {self.mc} pod(s) does not fit on the nodes", None
        return "", "", out

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
        chosen: list[_Piece] = []
        failure, message, _ = self._check(chosen)
        if not failure:
            return chosen, ""
        for pc in candidates:
            same = [c for c in chosen if c.unit is pc.unit]
            if same and (same[0].whole or not pc.whole):
                continue
            if not self._helps(pc, failure):
                continue
            trial = [c for c in chosen if c.unit is not pc.unit] + [pc]
            if pc.kind is VictimKind.RECLAIM and self._below_nominal(trial) is not None:
                continue
            chosen = trial
            failure, message, _ = self._check(chosen)
            if not failure:
                return chosen, ""
        return None, message

    def _prune(self, chosen: list[_Piece]) -> list[_Piece]:
        extras = {id(pc.unit): pc for pc in self.pieces if not pc.whole}
        for pc in sorted(chosen, key=lambda c: c.cost, reverse=True):
            rest = [c for c in chosen if c is not pc]
            if not self._check(rest)[0]:
                chosen = rest
                continue
            smaller = extras.get(id(pc.unit))
            if pc.whole and smaller is not None:
                trial = [*rest, smaller]
                if not self._check(trial)[0]:
                    chosen = trial
        return chosen

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
        if not self.pieces:
            return NoPreemption(self._nobody())
        extras = [pc for pc in self.pieces if not pc.whole]
        chosen: list[_Piece] | None = None
        if extras:
            chosen, _ = self._greedy(extras)
        message = ""
        if chosen is None:
            chosen, message = self._greedy(self.pieces)
        if chosen is None:
            units = len({id(pc.unit) for pc in self.pieces})
            return NoPreemption(f"evicting any of the {units} unit(s) it may preempt does not make room: {message}")
        chosen = self._prune(chosen)
        failure, message, out = self._check(chosen)
        if failure or out is None:  # pruning only keeps sets that pass: a bug
            raise AssertionError(f"preemption search lost its solution: {message}")
        chosen.sort(key=lambda c: c.cost)
        victims = tuple(Victim(pc.unit, pc.pods, pc.kind, pc.gpu_hours, pc.message, pc.borrowed) for pc in chosen)
        return Preemption(
            victims=victims,
            nodes=tuple(int(n) for n in out),
            gpu_hours=sum(v.gpu_hours for v in victims),
            pods=sum(len(v.pods) for v in victims),
            placed=self.core.copy(),
        )

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


def select_victims(
    preemptor: Preemptor,
    running: Sequence[RunningUnit],
    *,
    alloc: IntArray,
    used: IntArray,
    tree: QueueTree | None,
    scoring: ScoringArrays,
    now: float,
    place: Kernel = kernels.place_members,
) -> Preemption | NoPreemption:
    """The victims that make room for ``preemptor``'s quorum, or why there are none.

    ``alloc``/``used``: the snapshot's arrays with every running unit's pods charged;
    ``tree``: the queues with every running unit charged (None: no queues at all);
    ``running``: the candidates (the caller may pass all running units: the rules above
    filter them). ``place`` is the placement kernel or its twin. Nothing is modified.
    A unit that fits already gets a :class:`Preemption` with no victims.
    """
    search = _Search(
        preemptor, running, alloc=alloc, used=used, tree=tree, scoring=scoring, now=now, place=place
    )
    return search.run()
