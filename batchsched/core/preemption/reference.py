"""The victim search written the plain way: the twin :mod:`batchsched.core.preemption.victims` is held to.

:func:`select_victims` here takes the same arguments and gives the same answer (victims,
nodes, reason) as :func:`batchsched.core.preemption.victims.select_victims`, whose
docstring states the rules and the search. This one rebuilds every piece of every
candidate for each call and sums every set it checks from scratch, with no bound taken
before the search; the fast one keeps per-unit pieces across a cycle's searches, sums sets
as they change and skips what cannot help. ``tests/unit/test_victim_search.py`` holds the
two equal on random worlds. Far too slow for a busy cluster; never called by the cycle.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core.placement import kernels
from batchsched.core.placement.problem import Place, PlacementProblem
from batchsched.core.placement.scoring import ScoringArrays
from batchsched.core.plan import RunningPod, RunningUnit, Victim, VictimKind
from batchsched.core.preemption.candidates import eviction_kind
from batchsched.core.preemption.victims import (
    EXHAUSTIVE_PIECES,
    FALLBACK_CHECKS,
    NODE_EXACT_UNITS,
    NODE_SETS,
    NODE_TRIALS,
    SECONDS_PER_HOUR,
    NoPreemption,
    Preemption,
    Preemptor,
)
from batchsched.core.quantity import format_units
from batchsched.core.queues import (
    QueueTree,
    ReclaimPolicy,
    WithinQueuePolicy,
)
from batchsched.core.queues.running import held

__all__ = ["select_victims"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: what a set of victims costs: GPU-hours done, pods, then its pieces' own costs
SetCost = tuple[float, int, tuple[Any, ...]]


def _set_cost(pieces: Sequence[_Piece]) -> SetCost:
    """The order in which sets of victims are preferred (see the module docstring); the
    GPU-hours are rounded so that the order of a sum does not decide between equal sets."""
    return (
        round(math.fsum(pc.gpu_hours for pc in pieces), 9), sum(len(pc.pods) for pc in pieces),
        tuple(sorted(pc.cost for pc in pieces)),
    )


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
        place: Place,
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
        span = max(0.0, self.now - w.start) / SECONDS_PER_HOUR
        for h in held(w, self.used.shape[1]):
            pods, whole, vec = h.pods, h.whole, h.vec
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
            gpu_hours = h.gpus * span
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
        problem = PlacementProblem(
            self.alloc, scratch, self.core, self.core_sig, p.masks, p.static_score, self.scoring, self.mc,
        )
        placed = self.place(problem, out)
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
        units: dict[int, _Piece] = {}
        for pc in candidates:  # one piece per unit: the whole unit frees the most
            if id(pc.unit) not in units or pc.whole:
                units[id(pc.unit)] = pc
        everything = sorted(units.values(), key=lambda pc: pc.cost)
        if not self._check(everything)[0]:
            return everything
        if len(candidates) <= EXHAUSTIVE_PIECES:
            return self._exhaustive(candidates, None, None, checks=FALLBACK_CHECKS)
        short = self._short()
        chosen = list(everything)
        for pc in reversed(everything):
            rest = [c for c in chosen if c is not pc]
            if not rest or bool((np.sum([self._in_reach(c) for c in rest], axis=0) < short).any()):
                continue
            chosen = rest
            if not self._check(chosen)[0]:
                return chosen
        return None

    def _short(self) -> IntArray:
        """What victims must free at least, in all, on the nodes in reach."""
        free = np.clip(self.alloc[self.reach] - self.used[self.reach], 0, None).sum(axis=0)
        return np.asarray((self.x - free) * (self.x > 0), dtype=np.int64)

    def _in_reach(self, pc: _Piece) -> IntArray:
        """What evicting ``pc`` frees on the nodes the quorum may use."""
        vec = np.zeros(self.used.shape[1], dtype=np.int64)
        for pod in pc.pods:
            if self.reach[pod.node]:
                vec += pod.req
        return vec

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
        freed = {id(pc): self._in_reach(pc) for pc in candidates}
        sets: list[tuple[SetCost, list[_Piece]]] = []
        for combo in itertools.product(*([None, *pcs] for pcs in units.values())):
            chosen = [pc for pc in combo if pc is not None]
            if not chosen:
                continue
            total = np.sum([freed[id(pc)] for pc in chosen], axis=0)
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
        if not self.pieces:
            return NoPreemption(self._nobody())
        extras = [pc for pc in self.pieces if not pc.whole]
        chosen: list[_Piece] | None = None
        if extras:
            chosen, _ = self._cheapest(extras)
        message = ""
        if chosen is None:
            chosen, message = self._cheapest(self.pieces)
        if chosen is None:
            units = len({id(pc.unit) for pc in self.pieces})
            return NoPreemption(f"evicting any of the {units} unit(s) it may preempt does not make room: {message}")
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
) -> Preemption | NoPreemption:
    """The victims that make room for ``preemptor``'s quorum, or why there are none.

    ``alloc``/``used``: the snapshot's arrays with every running unit's pods charged;
    ``tree``: the queues with every running unit charged (None: no queues at all);
    ``running``: the candidates (the caller may pass all running units: the rules above
    filter them). ``place`` is the placement: the kernel, its twin, or one built on them
    (:meth:`batchsched.core.placer.Placer.placer`). Nothing is modified. A unit that fits already gets a :class:`Preemption` with no victims.
    """
    search = _Search(
        preemptor, running, alloc=alloc, used=used, tree=tree, scoring=scoring, now=now, place=place
    )
    return search.run()
