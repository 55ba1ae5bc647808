"""Start-time estimates over classes of work: the policy's order on a virtual clock, without
stepping a copy of the session.

Stepping a copy of the session (:class:`~batchsched.insight.estimate.Forward`) gives every
decision exactly, but each of its cycles costs what a live cycle costs: at 1,000 nodes and
9,000 waiting pods a few seconds, so a budget of seconds reaches minutes ahead. This model
keeps what decides *when* a job starts and drops the rest:

- **what frees and when**: every charged pod's node row, request vector and end (declared,
  observed for like pods, or none), the ends taken in batches as the copy takes them;
- **the order**: the session's own :class:`~batchsched.core.queues.fair.FairOrder` over the
  same queue tree (quotas, borrowing, cohorts, the usage history it decays), charged with
  the running work and kept charged as jobs start and end: fair share between queues, then
  priority, age and arrival within one;
- **reservations**: the first ``per_queue`` jobs of a queue that quota admits but the nodes
  do not hold what their quorum needs beyond what frees by their start; later jobs take it
  only if they end by that start or have a higher priority
  (:mod:`batchsched.core.reservation`);
- **classes**: jobs of one queue and priority whose members ask the same and may use the
  same nodes are alike; once one fails in a round, the rest of its class in that round
  fail alike without a fit check (those kept out only by reservations: the rest kept out by
  the same ones), as the cycle fails a class
  (:func:`~batchsched.core.equivalence.unit_class`);
- **preemption**: a job that does not fit evicts what the policy lets it
  (:mod:`~batchsched.insight.victims`), at most ``maxSearches`` searches a round;
- **which nodes**: each member only on the nodes it passes every filter of (taints,
  cordons, node selectors and affinity, its ResourceClaims' nodes:
  :class:`~batchsched.core.placement.nodefilter.NodeFilter`), the fullest that fits first.

Left out, so the estimate is later or earlier than the scheduler by what they change: the
topology a gang asks for and pod (anti-)affinity and spread (members fit any allowed node
with room), cards shared by several pods (a share counts as the cards it holds), the victim
search's cheapest set (the fewest units of the lowest priority are evicted instead),
elastic members beyond the quorum, nominations, back-off timers, and the telling
(conditions, Events, statuses). Its error against the stepped copy is measured by
``python -m perf.estimatebench --compare`` (perf/reports/2026-11-26-estimates).

Pure: the caller bounds the work with ``keep_going`` (asked before each round).
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from batchsched.core.mirror import held
from batchsched.core.model import Pod
from batchsched.core.placement.nodefilter import NodeFilter
from batchsched.core.plan import QueueName, RunningUnit
from batchsched.core.queues.fair import FairOrder
from batchsched.core.queues.tree import QueueTree
from batchsched.core.reservation import declared_runtime
from batchsched.core.runtimes import RunTimes, like_key
from batchsched.core.session import Session
from batchsched.insight.victims import RunningWork

__all__ = ["ClassForward", "Started", "Waiting"]

IntArray = npt.NDArray[np.int64]

#: ends this close together (a fraction of their distance from now) are taken in one round
BATCH_FRACTION = 0.02


@dataclass(slots=True, frozen=True)
class Waiting:
    """A waiting job as the model advances it (what :class:`FairOrder` reads, and its work)."""

    key: str
    queue: QueueName | None
    priority: int
    created: float
    arrival: int
    #: the members still to bind, one request vector a row
    reqs: IntArray
    #: each member's run time once started (None: it runs on), and whether it was declared
    runs: tuple[tuple[float | None, str], ...]
    #: how the job waits the same way as others: queue, quorum, members' requests and
    #: what decides which nodes they may use
    cls: Hashable
    #: the members still to bind
    pods: tuple[Pod, ...] = ()
    #: how long its longest member runs (infinite when one declares no end)
    longest: float = 0.0
    #: the summed requests of the members (what its queue is charged)
    quorum: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def uid(self) -> str:
        return self.key


@dataclass(slots=True, frozen=True)
class Started:
    """When a job's quorum was bound, and the ends carried out before it by source."""

    at: float
    declared: int
    observed: int


@dataclass(slots=True)
class _Hold:
    """A reservation: its start, its holder's priority, what its quorum needs on each node
    and, in this round, what it holds there (the need beyond what frees by the start)."""

    start: float
    priority: int
    need: IntArray
    amount: IntArray


@dataclass(slots=True)
class _Round:
    """One round's walk: the classes failed so far and the holds made."""

    failed: set[Hashable] = field(default_factory=set)
    holds: dict[str, _Hold] = field(default_factory=dict)
    holders: dict[QueueName | None, int] = field(default_factory=dict)
    #: classes whose first member fits no node at all this round (no fit check needed)
    unfit: set[Hashable] = field(default_factory=set)
    #: victim searches made
    searches: int = 0


@dataclass(slots=True, frozen=True)
class _End:
    """A pod's expected end: where it frees what (node columns), what it gives back to its
    queue (quota columns) and what its end rests on."""

    at: float
    seq: int
    node: int
    frees: IntArray
    charge: IntArray
    queue: QueueName | None
    source: str


class ClassForward:
    """The model of one moment of the session (see the module docstring)."""

    def __init__(self, sim: Session, runtimes: RunTimes, waiting: Iterable[tuple[str, str | None, int, float, int,
                                                                                   Sequence[Pod], int]],
                 now: float) -> None:
        """``sim``: a copy of the live session (read and charged here, never stepped);
        ``waiting``: ``(key, queue, priority, created, arrival, pending pods, members
        needed)`` of each job to estimate."""
        self.now = now
        self.runtimes = runtimes
        state = sim.state
        self._groups = sim.groups
        # a job with no member left to bind has nothing to place: it gets no start here (a
        # DRA pod the copy does not hold as pending, say), rather than an empty request
        rows = [self._waiting(state.vector, *w) for w in waiting if len(w[5])]
        snap = state.snapshot()
        width = len(snap.columns)
        qi = sim.queues.prepare(state=state, groups=sim.groups, snap=snap, units=[], now=now)
        self.tree: QueueTree = qi.tree
        self.history = qi.history
        self.max_wait = qi.max_wait
        self.reserve = sim.settings.reservation
        kinds: dict[Hashable, int] = {}  # each class as a small number: cheap to hash, as it is often
        self.jobs = [dataclasses.replace(p, cls=kinds.setdefault(w.cls, len(kinds)), quorum=p.reqs.sum(axis=0))
                     for w in rows if w.queue is None or self.tree.leaf_problem(w.queue) is None
                     for p in (_pad(w, width),)]
        #: the node columns any waiting job asks for: the only ones that can keep one from fitting
        self.cols = np.flatnonzero(np.any([w.reqs.any(axis=0) for w in self.jobs], axis=0)) if self.jobs \
            else np.zeros(0, dtype=np.intp)
        #: each job's members' requests in those columns
        self.asks = {w.key: w.reqs[:, self.cols] for w in self.jobs}
        #: each job's runs of alike members, ``(first, past the last)``: placed in one pass
        self.alike = {key: _runs(asks) for key, asks in self.asks.items()}
        self.free: IntArray = (snap.alloc - snap.used)[:, self.cols]
        #: each job's nodes: those every member may use (taints, cordons, selectors, affinity)
        self.where = _eligible(self.jobs, NodeFilter(snap.nodes))
        self.alloc: IntArray = np.maximum(snap.alloc[:, self.cols], 1)
        #: each pod's expected end, soonest first (kept sorted: reservations read it in order),
        #: and their sequence numbers in the same order
        self.ends: list[tuple[float, int, _End]] = []
        self._seqs = array.array("q")
        self._seq = 0
        self.ended = {"declared": 0, "observed": 0}
        self.unknown = 0
        self._reserved: dict[str, _Hold] = {}
        #: the running units, which a job of higher priority or a queue reclaiming may evict
        self.work = RunningWork(self.free.shape)
        #: each pod's expected end, by its sequence number (an evicted pod's end is taken out)
        self._end_at: dict[int, float] = {}
        #: by sequence number, each pod's node and what it frees there (reservations sum them)
        self._node_of: npt.NDArray[np.intp] = np.zeros(1024, dtype=np.intp)
        self._frees_of: IntArray = np.zeros((1024, len(self.cols)), dtype=np.int64)
        self.preemption = sim.queues.settings.preemption
        self.max_searches = qi.max_searches
        self.evictions = 0
        #: counts the model's charges and releases to the tree: the same count, the same usage
        self._usage_mark = 0
        self._charge_running(sim, qi.running() if callable(qi.running) else qi.running, snap.rows, width)

    # -- building --------------------------------------------------------------------------

    def _charge_running(self, sim: Session, running: Iterable[RunningUnit], rows: npt.NDArray[np.intp],
                        width: int) -> None:
        """The running units charged to their queues, and each charged pod's end."""
        state = sim.state
        row_of = {int(r): i for i, r in enumerate(rows)}
        queue_of: dict[str, QueueName | None] = {}
        unit_of: dict[str, RunningUnit] = {}
        for unit in running:
            for rp in unit.pods:
                queue_of[rp.uid] = unit.queue
                if not unit.protected:
                    unit_of[rp.uid] = unit
            if unit.queue is not None and self.tree.leaf_problem(unit.queue) is None:
                self.tree.admit(unit.queue, np.sum([rp.req for rp in unit.pods], axis=0))
        for uid, (node, vec) in state.charges.items():
            pod = state.pods.get(uid)
            i = row_of.get(state.node_row.get(node, -1))
            if pod is None or i is None:
                continue
            q = queue_of.get(uid)
            if q is not None and self.tree.leaf_problem(q) is not None:
                q = None
            full = vec if len(vec) == width else np.pad(vec, (0, width - len(vec)))
            self._seq += 1
            owner = unit_of.get(uid)
            if owner is not None:
                self.work.add(self._seq, owner.key, q, owner.priority, owner.start, i, full[self.cols], full)
            self._end(pod, i, full, q)

    def _waiting(self, vector: Callable[[dict[str, int]], IntArray], key: str, queue: str | None, priority: int,
                 created: float, arrival: int, pods: Sequence[Pod], need: int) -> Waiting:
        members = list(pods)[:max(1, need)]
        vecs = [vector(held(p, None)) for p in members]
        width = max((len(v) for v in vecs), default=0)
        reqs = np.array([np.pad(v, (0, width - len(v))) for v in vecs], dtype=np.int64).reshape(len(vecs), width)
        runs = tuple(self._run_time(p) for p in members)
        q = QueueName(queue) if queue else None
        where = tuple(p.constraint_key() for p in members)
        longest = max((math.inf if r is None else r for r, _ in runs), default=0.0)
        return Waiting(key=key, queue=q, priority=priority, created=created, arrival=arrival, reqs=reqs, runs=runs,
                       cls=(q, priority, reqs.tobytes(), reqs.shape, where), pods=tuple(members), longest=longest)

    def _run_time(self, pod: Pod) -> tuple[float | None, str]:
        run = declared_runtime(pod)
        if run is not None:
            return run, "declared"
        group = self._groups.group_of(pod.uid)
        run = self.runtimes.typical(like_key(pod, group.key if group is not None else None))
        return (run, "observed") if run is not None else (None, "unknown")

    def _end(self, pod: Pod, node: int, vec: IntArray, queue: QueueName | None) -> None:
        if pod.deleting:
            end, source = self.now, "declared"
        else:
            run, source = self._run_time(pod)
            if run is None:
                self.unknown += 1
                return
            end = max(self.now, (pod.started or self.now) + run)
        self._push(end, node, vec[self.cols], vec, queue, source)

    def _push(self, end: float, node: int, frees: IntArray, charge: IntArray, queue: QueueName | None,
              source: str) -> None:
        """The end of the pod given sequence number ``self._seq``."""
        at = bisect.bisect_left(self.ends, (end, self._seq))
        self.ends.insert(at, (end, self._seq, _End(end, self._seq, node, frees, charge, queue, source)))
        self._seqs.insert(at, self._seq)
        self._end_at[self._seq] = end
        if self._seq >= len(self._node_of):
            grow = max(len(self._node_of), self._seq + 1 - len(self._node_of))
            self._node_of = np.pad(self._node_of, (0, grow))
            self._frees_of = np.pad(self._frees_of, ((0, grow), (0, 0)))
        self._node_of[self._seq] = node
        self._frees_of[self._seq] = frees

    # -- the run ---------------------------------------------------------------------------

    def run(self, *, horizon: float, keep_going: Callable[[], bool] | None = None,
            max_rounds: int | None = None) -> tuple[dict[str, Started], float, int, bool]:
        """Rounds at now and at each batch of ends until every job started, the horizon or
        no end is left; returns the starts by job key, the time reached, the rounds taken
        and whether ``keep_going`` (or ``max_rounds``) cut it short."""
        started: dict[str, Started] = {}
        left = list(self.jobs)
        t, rounds = self.now, 0
        while left:
            if (keep_going is not None and not keep_going()) or (max_rounds is not None and rounds >= max_rounds):
                return started, t, rounds, True
            if rounds:
                if not self.ends:
                    break
                t = self._next_batch()
                if t > self.now + horizon:
                    break
                self._finish_due(t)
            rounds += 1
            now_started = self._round(left, t)
            for key in now_started:
                started[key] = Started(t, self.ended["declared"], self.ended["observed"])
            if now_started:
                left = [w for w in left if w.key not in started]
        return started, t, rounds, False

    def _next_batch(self) -> float:
        """The next end, and with it the ends up to :data:`BATCH_FRACTION` of its distance
        from now later (at least a second): the last of them."""
        first = self.ends[0][0]
        limit = first + max(1.0, BATCH_FRACTION * (first - self.now))
        return self.ends[bisect.bisect_right(self.ends, (limit, math.inf)) - 1][0]

    def _finish_due(self, t: float) -> None:
        due = bisect.bisect_right(self.ends, (t, math.inf))
        for _, _, e in self.ends[:due]:
            self._end_at.pop(e.seq, None)
            self.work.ended(e.seq)
            self.free[e.node] += e.frees
            if e.queue is not None:
                self.tree.release(e.queue, e.charge)
                self._usage_mark += 1
            self.ended[e.source] = self.ended.get(e.source, 0) + 1
        del self.ends[:due]
        del self._seqs[:due]

    def _round(self, left: Sequence[Waiting], t: float) -> list[str]:
        """One pass over the waiting jobs in the policy's order at ``t``: each placed if its
        queue's quota admits and the nodes (less what reservations hold from it) hold its
        quorum; returns the keys of the jobs started."""
        if self.history is not None:
            for name in self.tree.names:
                if self.tree.is_leaf(name):
                    self.history.record(name, self.tree.usage_vector(name), t)
        walk = _Round(unfit=self._unfit(left))
        if len(walk.unfit) == len({w.cls for w in left}) and not any(self._may_evict(w) for w in left):
            return []  # nothing fits anywhere and nobody may evict: nothing starts, no order to walk
        left = self._admissible(left)
        order = FairOrder(self.tree, self._contenders(left, walk.unfit, t), now=t, history=self.history, max_wait=self.max_wait,
                          request=_quorum if self.tree.names else None)
        out: list[str] = []
        for q, w in order:
            if w.cls in walk.failed or (q is not None and self.tree.admissible(q, _quorum(w)) is not None):
                walk.failed.add(w.cls)
                order.skipped(w)
                continue
            held = self._held_from(w, t, walk.holds)
            if (w.cls, held) in walk.failed:  # alike, and kept from the same reservations
                order.skipped(w)
                continue
            nodes = None if w.cls in walk.unfit else self._place(w.key, self._room(w, t, walk.holds))
            if nodes is None and walk.searches < self.max_searches and self._may_evict(w):
                walk.searches += 1
                nodes = self._preempt(w, t, walk.holds)
            if nodes is None:
                # the rest of its class fails alike: all of it when no reservation kept it out,
                # else those kept from the same reservations (a shorter one may go ahead)
                walk.failed.add(w.cls if not held else (w.cls, held))
                self._hold(w, t, walk)
                order.skipped(w)
                continue
            self._start(w, nodes, t)
            if q is not None:
                self.tree.admit(q, _quorum(w))
                self._usage_mark += 1
            order.admitted(w)
            out.append(w.key)
        return out

    def _contenders(self, left: Sequence[Waiting], unfit: set[Hashable], t: float,
                    ) -> dict[QueueName | None, list[Waiting]]:
        """The jobs worth walking, by queue: those of classes that may fit, and the first
        job of each class that cannot (in the queue's order: it may hold its queue's
        reservation, or get in by evicting). The others would fail alike and change nothing."""
        by_queue: dict[QueueName | None, list[Waiting]] = {}
        for w in left:
            by_queue.setdefault(w.queue, []).append(w)
        for q, jobs in by_queue.items():
            jobs.sort(key=lambda w: self._within(w, t))
            kept: list[Waiting] = []
            heads: set[Hashable] = set()
            for w in jobs:
                if w.cls in unfit:
                    if w.cls in heads:
                        continue
                    heads.add(w.cls)
                kept.append(w)
            by_queue[q] = kept
        return {q: jobs for q, jobs in by_queue.items() if jobs}

    def _within(self, w: Waiting, t: float) -> tuple[int, int, float, int, str]:
        """A job's place within its queue, as :class:`FairOrder` sorts it (one waiting
        longer than ``max_wait`` first)."""
        if self.max_wait is not None and t - w.created > self.max_wait:
            return (0, 0, w.created, w.arrival, w.key)
        return (1, -w.priority, w.created, w.arrival, w.key)

    def _admissible(self, left: Sequence[Waiting]) -> list[Waiting]:
        """The jobs whose quorum their queue's quota admits now. Admissions only take quota
        during a round, so the others would fail it all round (and hold nothing)."""
        verdict: dict[Hashable, bool] = {}
        out: list[Waiting] = []
        for w in left:
            ok = verdict.get(w.cls)
            if ok is None:
                ok = verdict[w.cls] = w.queue is None or self.tree.admissible(w.queue, _quorum(w)) is None
            if ok:
                out.append(w)
        return out

    def _unfit(self, left: Sequence[Waiting]) -> set[Hashable]:
        """The classes whose first member fits none of its nodes as the nodes are now."""
        out: set[Hashable] = set()
        seen: set[Hashable] = set()
        for w in left:
            if w.cls in seen:
                continue
            seen.add(w.cls)
            fits = np.all(self.free >= self.asks[w.key][0], axis=1) & self.where[w.key]
            if not fits.any():
                out.add(w.cls)
        return out

    def _may_evict(self, w: Waiting) -> bool:
        """Whether ``w`` might get in by evicting (a quick bound: some running unit of its
        queue or unqueued has a lower priority, or it fits within its queue's nominal)."""
        if not self.preemption or any(p.never_preempts for p in w.pods):
            return False
        for queue in {w.queue, None}:
            lowest = self.work.lowest(queue)
            if lowest is not None and lowest <= w.priority:
                return True
        return w.queue is not None and not self.tree.would_borrow(w.queue, _quorum(w))

    def _preempt(self, w: Waiting, t: float, holds: dict[str, _Hold]) -> list[int] | None:
        """The fewest units ``w`` may evict (whom first: :mod:`~batchsched.insight.victims`)
        that let its quorum fit, evicted, and its nodes; None when no such set exists."""
        quorum = _quorum(w)
        reclaim = w.queue is not None and not self.tree.would_borrow(w.queue, quorum)
        groups = self.work.groups(self.tree, w.queue, w.priority, reclaim=reclaim, asks=quorum > 0,
                                  usage=self._usage_mark)
        room = self._room(w, t, holds)
        if not groups or self._place(w.key, room + self.work.held(groups)) is None:
            return None  # not even evicting all of them would make room
        found = self.work.candidates(groups, w.priority)
        lo, hi = 0, 1  # evicting the first ``lo`` does not make room; the first ``hi`` may
        while self._place(w.key, room + self.work.freed(found[:hi])) is None:
            lo, hi = hi, min(2 * hi, len(found))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._place(w.key, room + self.work.freed(found[:mid])) is None:
                lo = mid
            else:
                hi = mid
        for key in found[:hi]:
            for seq, node, frees, charge, queue in self.work.evict(key):
                self.free[node] += frees
                if queue is not None:
                    self.tree.release(queue, charge)
                    self._usage_mark += 1
                at = self._end_at.pop(seq, None)
                if at is not None:  # its end never comes
                    i = bisect.bisect_left(self.ends, (at, seq))
                    del self.ends[i]
                    del self._seqs[i]
        self.evictions += hi
        return self._place(w.key, self._room(w, t, holds))

    def _room(self, w: Waiting, t: float, holds: dict[str, _Hold]) -> IntArray:
        """What ``w`` may use: the free capacity less the holds it may not take."""
        room = self.free
        for key in self._held_from(w, t, holds):
            room = room - holds[key].amount
        return room

    @staticmethod
    def _held_from(w: Waiting, t: float, holds: dict[str, _Hold]) -> tuple[str, ...]:
        """The holds ``w`` may not take (it takes one when it ends by the hold's start or
        outranks its holder)."""
        end = t + w.longest
        return tuple(key for key, h in holds.items() if not (end <= h.start or w.priority > h.priority))

    def _place(self, key: str, room: IntArray) -> list[int] | None:
        """Nodes for job ``key``'s members, in order, among those it may use, the fullest
        node that fits first (as binpacking scores), filled with alike members before the
        next; None when the quorum does not fit. A run of alike members is placed in one
        pass."""
        asks, where, runs = self.asks[key], self.where[key], self.alike[key]
        if len(runs) > 1:
            room = room.copy()  # each run takes what it is given before the next is placed
        nodes: list[int] = []
        for i, j in runs:
            req = asks[i]
            asked = req > 0
            if not asked.any():
                usable = np.flatnonzero(where)
                if not len(usable):
                    return None
                nodes.extend([int(usable[0])] * (j - i))
                continue
            cap = np.where(where, np.maximum(0, (room[:, asked] // req[asked]).min(axis=1)), 0)
            if int(cap.sum()) < j - i:
                return None
            fits = np.flatnonzero(cap)
            left = ((room[fits][:, asked] - req[asked]) / self.alloc[fits][:, asked]).sum(axis=1)
            for node in fits[np.argsort(left, kind="stable")].tolist():
                take = min(int(cap[node]), j - len(nodes))
                if len(runs) > 1:
                    room[node] -= take * req
                nodes.extend([node] * take)
                if len(nodes) == j:
                    break
        return nodes

    def _start(self, w: Waiting, nodes: list[int], t: float) -> None:
        asks = self.asks[w.key]
        for node, ask, req, (run, source) in zip(nodes, asks, w.reqs, w.runs, strict=True):
            self.free[node] -= ask
            self._seq += 1
            self.work.add(self._seq, w.key, w.queue, w.priority, t, node, ask, req)
            if run is None:
                self.unknown += 1
            else:
                self._push(t + run, node, ask, req, w.queue, source)

    def _hold(self, w: Waiting, t: float, walk: _Round) -> None:
        """``w`` did not fit: the first ``per_queue`` of its queue to fail hold a reservation
        (kept from round to round while its start lies ahead)."""
        if not self.reserve.enabled or walk.holders.get(w.queue, 0) >= self.reserve.per_queue:
            return
        walk.holders[w.queue] = walk.holders.get(w.queue, 0) + 1
        hold = self._reserved.get(w.key)
        if hold is None or hold.start <= t:
            hold = self._reservation(w)
            if hold is None:
                return
            self._reserved[w.key] = hold
        else:  # the same start and nodes; what frees there by then is less as ends pass
            due = bisect.bisect_right(self.ends, (hold.start, math.inf))
            hold.amount = np.maximum(0, hold.need - self._freed_by(self._end_seqs(due), due))
        walk.holds[w.key] = hold

    def _end_seqs(self, k: int | None = None) -> npt.NDArray[np.intp]:
        """The sequence numbers of the first ``k`` ends to come (all by default)."""
        return np.frombuffer(self._seqs[:len(self._seqs) if k is None else k], dtype=np.int64).astype(np.intp)

    def _freed_by(self, seqs: npt.NDArray[np.intp], k: int) -> IntArray:
        """What the pods of the first ``k`` of ``seqs`` free on each node."""
        out = np.zeros_like(self.free)
        np.add.at(out, self._node_of[seqs[:k]], self._frees_of[seqs[:k]])
        return out

    def _reservation(self, w: Waiting) -> _Hold | None:
        """The earliest end by which ``w``'s quorum fits (the fewest ends, soonest first,
        found by doubling then halving), and what it then needs on each node beyond what
        frees there by then; None when no end makes it fit."""
        seqs = self._end_seqs()
        if not len(seqs):
            return None
        lo, hi = 0, 1  # the quorum does not fit after ``lo`` ends; after ``hi`` it may
        while self._place(w.key, self.free + self._freed_by(seqs, hi)) is None:
            if hi >= len(seqs):
                return None
            lo, hi = hi, min(2 * hi, len(seqs))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._place(w.key, self.free + self._freed_by(seqs, mid)) is None:
                lo = mid
            else:
                hi = mid
        gone = self._freed_by(seqs, hi)
        nodes = self._place(w.key, self.free + gone)
        assert nodes is not None
        need = np.zeros_like(self.free)
        for node, ask in zip(nodes, self.asks[w.key], strict=True):
            need[node] += ask
        return _Hold(start=self.ends[hi - 1][0], priority=w.priority, need=need, amount=np.maximum(0, need - gone))

def _eligible(jobs: Sequence[Waiting], nodes: NodeFilter) -> dict[str, npt.NDArray[np.bool_]]:
    """Per job, the nodes each of its members passes every filter of."""
    out: dict[str, npt.NDArray[np.bool_]] = {}
    for w in jobs:
        mask = np.ones(len(nodes), dtype=np.bool_)
        for pod in w.pods:
            mask &= nodes.mask(pod)
        out[w.key] = mask
    return out


def _runs(asks: IntArray) -> list[tuple[int, int]]:
    """The runs of equal rows of ``asks``: ``(first, past the last)``."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(asks):
        j = i + 1
        while j < len(asks) and np.array_equal(asks[j], asks[i]):
            j += 1
        out.append((i, j))
        i = j
    return out


def _quorum(w: Waiting) -> IntArray:
    return w.quorum


def _pad(w: Waiting, width: int) -> Waiting:
    if w.reqs.shape[1] == width:
        return w
    reqs = np.pad(w.reqs, ((0, 0), (0, width - w.reqs.shape[1])))
    return Waiting(key=w.key, queue=w.queue, priority=w.priority, created=w.created, arrival=w.arrival,
                   reqs=reqs, runs=w.runs, cls=w.cls, pods=w.pods, longest=w.longest)
