"""Reservations: the head of a queue that does not fit holds the nodes where it fits soonest.

Without them a large gang waits forever behind a stream of small work: every GPU that frees
is taken by a small pod that came later. The rule, recomputed from the snapshot in every
cycle (nothing is remembered between cycles but the age limit below):

1. **Who holds one.** Walking the fair order, the first unit of each queue (unqueued work
   counts as one queue) whose quorum quota admits but the nodes do not hold, and that could
   not preempt, gets a reservation; up to ``per_queue`` units per queue. A gang whose
   ``minResources`` the cluster cannot meet now (:attr:`~batchsched.core.plan.Unit.min_resources_short`)
   is such a unit too: it is never placed before they fit, but without a reservation every
   GPU that frees would go to later small work and they would never fit. A unit that has held
   one for ``max_hold`` seconds loses it for as long again (its queue's reservation passes
   to the next unit that does not fit), then may hold one anew.
2. **Which nodes, and when.** Every pod charged to a node (and every member the cycle
   placed before, which starts now) has an *expected end*: its
   ``status.startTime`` (or now, when it has not started) plus the shorter of its
   ``spec.activeDeadlineSeconds`` and its declared runtime (annotation
   :data:`RUNTIME_ANNOTATION`: a Go duration such as ``30m``, or seconds); a pod being
   deleted ends now; an end already past counts as now; a pod that declares neither never
   ends. The reservation's start is the earliest such end at which the quorum fits once
   every pod ending by then is gone, and its nodes are where the placement kernel (with
   the unit's topology) puts the quorum then. When no finite time works, the nodes are
   ranked by the work with no declared end they hold (its dominant share of the node, least
   first), and the reservation takes the fewest of them, in that order, whose freeing lets
   the quorum fit (every pod with a declared end freed too); its start is unknown. A unit
   that fits nowhere even on an idle cluster gets none.
3. **What later units may take.** On each reserved node the reservation *holds* what its
   quorum needs there beyond what the pods ending by its start free: a later unit in the
   same cycle may use that held capacity only if it cannot delay the reservation, that is
   if it is known to end before the start (every member declares a runtime and now plus it
   is at or before a known start), or if it has a higher priority than the holder (it could
   preempt the holder anyway; not with ``preemptionPolicy: Never``). Anything else fits only in what the hold leaves. Reservations
   made earlier in the cycle count as running with no end when a later one is computed.

The holder is told it waits (``WAITING``, reason :data:`RESERVED`, the message says on which
nodes and when it is expected to start); a unit held back by another's reservation is told
on which nodes capacity is reserved and for whom.

A cycle's reservations act on its :class:`~batchsched.core.statement.Statement` (the holds
on the nodes, the units told they wait) and place with its
:class:`~batchsched.core.placer.Placer`, each what-if placement inside an attempt that is
discarded; this module never calls the cycle.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import math
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.mirror import ChargeReader, ClusterState, Snapshot, to_width
from batchsched.core.model import Pod, PodUID
from batchsched.core.placement.layout import Layout
from batchsched.core.placer import Placer
from batchsched.core.plan import Unit, UnitStatus
from batchsched.core.queues import QueueName
from batchsched.core.statement import Statement

__all__ = [
    "RESERVED",
    "RUNTIME_ANNOTATION",
    "CycleReservations",
    "Reservation",
    "ReservationSettings",
    "Reservations",
    "declared_runtime",
    "expected_end",
    "parse_duration",
]

IntArray = npt.NDArray[np.int64]

#: the condition reason of a unit that holds a reservation
RESERVED = "Reserved"
#: how long a pod is expected to run, from its start: a Go duration (``1h30m``) or seconds
RUNTIME_ANNOTATION = "batchsched.io/expected-runtime"
NEVER = math.inf


@dataclass(slots=True, frozen=True)
class ReservationSettings:
    """The ``reservation`` section of the config file."""

    enabled: bool = True
    #: units per queue (unqueued work counts as one queue) that may hold a reservation
    per_queue: int = 1
    #: seconds a unit may hold a reservation before it is dropped (for as long again)
    max_hold: float = 3600.0


# -- expected ends -------------------------------------------------------------------------

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


@functools.lru_cache(maxsize=4096)
def parse_duration(text: str) -> float | None:
    """Seconds of a Go duration (``90s``, ``1h30m``, ``1.5h``) or of a plain number of
    seconds; None when it is neither or not positive."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pos, value = 0, 0.0
        for m in _GO_PART.finditer(text):
            if m.start() != pos:
                return None
            value += float(m.group(1)) * _GO_UNITS[m.group(2)]
            pos = m.end()
        if pos == 0 or pos != len(text):
            return None
    return value if math.isfinite(value) and value > 0 else None


def declared_runtime(pod: Pod) -> float | None:
    """The longest ``pod`` runs, in seconds from its start, as far as it says: the shorter of
    ``activeDeadlineSeconds`` and :data:`RUNTIME_ANNOTATION`; None when it says neither."""
    found = [d for d in (
        pod.active_deadline or None,
        parse_duration(pod.annotations.get(RUNTIME_ANNOTATION, "")),
    ) if d]
    return min(found) if found else None


def expected_end(pod: Pod, now: float) -> float:
    """When a running pod is expected to end (see the module docstring); :data:`NEVER`."""
    if pod.deleting:
        return now
    run = declared_runtime(pod)
    if run is None:
        return NEVER
    return max(now, (pod.started or now) + run)


def unit_runtime(unit: Unit) -> float | None:
    """How long ``unit`` runs once started, when every member declares it."""
    longest = 0.0
    for pod in unit.pods:
        run = declared_runtime(pod)
        if run is None:
            return None
        longest = max(longest, run)
    return longest


@dataclass(slots=True, frozen=True)
class _Ends:
    """The pods charged to the snapshot's nodes: node row, request, expected end. What
    ends by a time is summed once per cycle (the reservations a cycle makes search the same
    times: their binary searches start alike), and from the nearest time summed before: the
    pods in order of their ends, a time's sum is that of a prefix of them, got from the
    nearest prefix summed by adding or taking away the pods between."""

    rows: npt.NDArray[np.intp]
    reqs: IntArray
    ends: npt.NDArray[np.float64]
    nodes: int
    _sums: dict[float | None, IntArray] = field(default_factory=dict, compare=False)
    _prefixes: dict[str, _Prefixes] = field(default_factory=dict, compare=False)

    def until(self, t: float) -> IntArray:
        """Per node, the requests of the pods expected to end at or before ``t`` (read
        only; ``NEVER``: every pod with an end)."""
        out = self._sums.get(t)
        if out is None:
            prefixes = self._prefixes.get("")
            if prefixes is None:
                prefixes = self._prefixes[""] = _Prefixes(self.rows, self.reqs, self.ends, self.nodes)
            out = self._sums[t] = prefixes.until(t)
        return out

    def endless(self) -> IntArray:
        """Per node, the requests of the pods with no expected end (read only)."""
        out = self._sums.get(None)
        if out is None:
            out = self._sums[None] = _sum(self.rows, self.reqs, self.ends >= NEVER, self.nodes)
        return out


@dataclass(slots=True, frozen=True)
class _Joined:
    """The ends of the charged pods and of the members a cycle placed so far (few): each
    sum is the charged pods' (kept for the cycle) plus the members' (summed anew)."""

    charged: _Ends
    started: _Ends
    rows: npt.NDArray[np.intp]
    ends: npt.NDArray[np.float64]

    @classmethod
    def of(cls, charged: _Ends, started: _Ends) -> _Joined:
        return cls(charged, started, np.concatenate([charged.rows, started.rows]),
                   np.concatenate([charged.ends, started.ends]))

    def until(self, t: float) -> IntArray:
        return self.charged.until(t) + self.started.until(t)

    def endless(self) -> IntArray:
        return self.charged.endless() + self.started.endless()


def _sum(rows: npt.NDArray[np.intp], reqs: IntArray, which: npt.NDArray[np.bool_], nodes: int) -> IntArray:
    """Per node, the requests of the pods ``which`` selects (read only)."""
    out = np.zeros((nodes, reqs.shape[1]), dtype=np.int64)
    np.add.at(out, rows[which], reqs[which])
    out.setflags(write=False)
    return out


class _Prefixes:
    """Per node, the requests of the first ``k`` pods in order of their expected ends, for
    the ``k`` asked so far; a new ``k`` is summed from the nearest one known."""

    def __init__(self, rows: npt.NDArray[np.intp], reqs: IntArray, ends: npt.NDArray[np.float64], nodes: int) -> None:
        self.order = np.argsort(ends, kind="stable")
        self.sorted_ends = ends[self.order]
        self.rows, self.reqs = rows, reqs
        zero = np.zeros((nodes, reqs.shape[1]), dtype=np.int64)
        zero.setflags(write=False)
        self.known: list[int] = [0]
        self.sums: dict[int, IntArray] = {0: zero}

    def until(self, t: float) -> IntArray:
        if t >= NEVER:
            k = int(np.searchsorted(self.sorted_ends, NEVER, side="left"))  # every end short of NEVER
        else:
            k = int(np.searchsorted(self.sorted_ends, t, side="right"))  # every end at or before t
        out = self.sums.get(k)
        if out is not None:
            return out
        at = bisect.bisect_left(self.known, k)
        near = min(self.known[max(0, at - 1):at + 1], key=lambda j: abs(j - k))
        out = self.sums[near].copy()
        between = self.order[min(near, k):max(near, k)]
        (np.add if k > near else np.subtract).at(out, self.rows[between], self.reqs[between])
        out.setflags(write=False)
        self.sums[k] = out
        self.known.insert(at, k)
        return out


@dataclass(slots=True, frozen=True)
class _Charged:
    """What :class:`_Ends` is computed from, kept while nothing charged changes: each
    charged pod's row and request, its start (0: not started), declared runtime (inf: none)
    and whether it is being deleted."""

    rows: npt.NDArray[np.intp]
    reqs: IntArray
    started: npt.NDArray[np.float64]
    runtime: npt.NDArray[np.float64]
    deleting: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, entries: Collection[tuple[int, IntArray, float, float, bool]], width: int) -> _Charged:
        """From one entry per charged pod (:func:`_entry`)."""
        n = len(entries)
        return cls(np.fromiter((e[0] for e in entries), dtype=np.intp, count=n),
                   np.array([e[1] for e in entries], dtype=np.int64).reshape(n, width),
                   np.fromiter((e[2] for e in entries), dtype=np.float64, count=n),
                   np.fromiter((e[3] for e in entries), dtype=np.float64, count=n),
                   np.fromiter((e[4] for e in entries), dtype=np.bool_, count=n))

    def at(self, now: float, nodes: int) -> _Ends:
        """The expected ends at ``now`` (:func:`expected_end` of each pod) on ``nodes`` rows."""
        start = np.where(self.started > 0, self.started, now)
        ends = np.where(self.deleting, now, np.maximum(now, start + self.runtime))
        return _Ends(self.rows, self.reqs, ends, nodes)


def _entry(state: ClusterState, uid: PodUID, rows: Mapping[str, int],
           width: int) -> tuple[int, IntArray, float, float, bool] | None:
    """A charged pod as :class:`_Charged` reads it: node row, request, start, declared
    runtime (inf: none), deleting; None when it is not charged to a node of the snapshot."""
    charged = state.charges.get(uid)
    pod = state.pods.get(uid)
    if charged is None or pod is None:
        return None
    node, vec = charged
    row = rows.get(node)
    if row is None:
        return None
    run = declared_runtime(pod)
    return row, to_width(vec, width), pod.started, NEVER if run is None else run, pod.deleting


class _EndsCache:
    """:class:`_Charged`, kept as pods are charged and uncharged (the mirror's charge feed)
    and built anew when the nodes change."""

    def __init__(self) -> None:
        self._charges = ChargeReader()
        self._entries: dict[PodUID, tuple[int, IntArray, float, float, bool]] = {}
        self._value: _Charged | None = None

    def get(self, state: ClusterState | None, snap: Snapshot, rows: Mapping[str, int]) -> _Charged:
        width = len(snap.columns)
        if state is None:
            return _Charged.of((), width)
        changed = self._charges.read(state, (snap.node_generation, width))
        if changed is None:
            self._value = None
            self._entries = {uid: e for uid in state.charges if (e := _entry(state, uid, rows, width)) is not None}
        elif changed:
            self._value = None
            for uid in changed:
                e = _entry(state, uid, rows, width)
                if e is None:
                    self._entries.pop(uid, None)
                else:
                    self._entries[uid] = e
        if self._value is None:
            self._value = _Charged.of(list(self._entries.values()), width)
        return self._value


# -- reservations --------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Reservation:
    """Nodes held for a unit: ``rows`` (one per quorum member), the capacity ``hold`` on each
    of ``hold_rows`` that later units may not take, and the expected ``start``."""

    unit: str
    display: str
    queue: QueueName | None
    priority: int
    rows: tuple[int, ...]
    nodes: tuple[str, ...]
    start: float
    ending: int
    hold_rows: npt.NDArray[np.intp]
    hold: IntArray
    need: IntArray
    """What the quorum takes on each of ``hold_rows``."""


class Reservations:
    """The reservation policy of a :class:`~batchsched.core.cycle.Cycle`; remembers between
    cycles only since when each unit holds its reservation (for ``max_hold``)."""

    def __init__(self, settings: ReservationSettings | None = None) -> None:
        self.settings = settings or ReservationSettings()
        #: unit key -> when it first held its current reservation
        self.since: dict[str, float] = {}
        #: unit key -> when its reservation was dropped for having been held too long
        self.dropped: dict[str, float] = {}
        self.charged = _EndsCache()

    def begin(self, placer: Placer, st: Statement, now: float, state: ClusterState | None) -> CycleReservations:
        """The reservations of one cycle at ``now``, placing with ``placer`` and holding on ``st``."""
        return CycleReservations(self, placer, st, now, state)


@dataclass(slots=True)
class CycleReservations:
    """The reservations of one cycle: those made, and how many per queue."""

    policy: Reservations
    placer: Placer
    st: Statement
    now: float
    state: ClusterState | None
    made: list[Reservation] = field(default_factory=list)
    per_queue: dict[QueueName | None, int] = field(default_factory=dict)
    _ends: _Ends | None = None
    #: the ends with the members the cycle placed, and the last of those they count
    _with_started: tuple[_Joined, object] | None = None

    # -- what the cycle asks ---------------------------------------------------------------

    def alike(self, unit: Unit) -> Callable[[Unit], bool]:
        """Which units may join the unqueued single pod ``unit`` in one kernel call: single
        pods with the same constraints (not blocked, no topology); with reservations on,
        only those asking alike (a big pod never shares a call with the small ones that
        would take its room) that the reservations made so far let through alike."""
        ckey = unit.pods[0].constraint_key()

        def same(u: Unit) -> bool:
            return (u.single and not u.blocked and not u.min_resources_short and u.topology_level is None
                    and u.pods[0].constraint_key() == ckey)

        if not self.policy.settings.enabled:
            return same
        req, key = unit.pods[0].requests, self._exempt(unit)
        return lambda u: same(u) and u.pods[0].requests == req and self._exempt(u) == key

    @contextlib.contextmanager
    def lifted(self, unit: Unit) -> Iterator[None]:
        """While placing ``unit``: the holds of the reservations it cannot delay lifted."""
        lift = self._exempt(unit)
        for i in lift:
            r = self.made[i]
            self.st.hold(r.hold_rows, r.hold, -1)
        try:
            yield
        finally:
            for i in lift:
                r = self.made[i]
                self.st.hold(r.hold_rows, r.hold)

    def fail(self, q: QueueName | None, unit: Unit, lay: Layout, k: int, message: str, *, reason: str = "") -> None:
        """``unit`` did not fit: reserve for it if it is at the head of its queue, else
        record the failure (saying whose reservation holds room it could use) with
        ``reason`` (default: unschedulable)."""
        st, s = self.st, self.policy.settings
        mc = 1 if unit.single else unit.min_count
        eligible = (
            s.enabled and self.per_queue.get(q, 0) < s.per_queue and lay.reqs is not None
            and mc > 0 and k >= mc and len(unit.pods) >= mc
            and not any(p.invalid for p in unit.pods[:mc])
        )
        if eligible and self._too_long(unit.key):
            st.fail(unit, explain.reservation_dropped(message, s.max_hold), reason=reason)
            return
        r = self._reserve(q, unit, lay, mc) if eligible else None
        if r is None:
            st.fail(unit, self._held_back(unit, lay, message), reason=reason)
            return
        self.per_queue[q] = self.per_queue.get(q, 0) + 1
        start_in = None if r.start == NEVER else r.start - self.now
        st.fail(unit, explain.reserved(message, r.nodes, start_in, r.ending), reason=RESERVED,
                status=UnitStatus.WAITING)

    def carry(self, made: Collection[Reservation]) -> None:
        """Reservations made by a walk that stopped at its budget, held again as they were
        (the walk taking it up stands for the rest of that one walk)."""
        for r in made:
            self.st.hold(r.hold_rows, r.hold)
            self.made.append(r)
            self.per_queue[r.queue] = self.per_queue.get(r.queue, 0) + 1

    def finish(self, tried: Collection[str] | None = None) -> None:
        """After the walk: how long each holder has held its reservation. ``tried``: the
        units a walk that stopped early reached (None: all); a holder it did not reach keeps
        its age."""
        now, since, dropped = self.now, self.policy.since, self.policy.dropped
        held = {r.unit for r in self.made}
        for key in [k for k in since if k not in held and (tried is None or k in tried)]:
            del since[key]
        for key in held:
            since.setdefault(key, now)
        for key in [k for k, t in dropped.items() if now - t >= self.policy.settings.max_hold]:
            del dropped[key]

    # -- the policy ----------------------------------------------------------------------

    def _too_long(self, key: str) -> bool:
        now, p = self.now, self.policy
        if key in p.dropped:
            if now - p.dropped[key] < p.settings.max_hold:
                return True
            del p.dropped[key]
        since = p.since.get(key)
        if since is not None and now - since > p.settings.max_hold:
            p.dropped[key] = now
            del p.since[key]
            return True
        return False

    def _exempt(self, unit: Unit) -> tuple[int, ...]:
        """The reservations (indices into :attr:`made`) ``unit`` cannot delay."""
        if not self.made:
            return ()
        run = unit_runtime(unit)
        end = NEVER if run is None else self.now + run
        return tuple(
            i for i, r in enumerate(self.made)
            if (unit.priority > r.priority and not unit.never_preempts) or (r.start < NEVER and end <= r.start)
        )

    def ends(self) -> _Ends | _Joined:
        """The expected ends of the pods charged to the nodes and of the members the cycle
        placed so far (they are in the statement's usage: a reservation that did not count
        them would see them run forever)."""
        if self._ends is None:
            p = self.placer
            self._ends = self.policy.charged.get(self.state, p.snap, p.rows).at(self.now, len(p.snap.nodes))
        started = self.st.starting
        if not started:
            return self._ends
        last = started[-1]  # a new entry each time one is recorded: it tells whether they changed
        if self._with_started is None or self._with_started[1] is not last:
            n, now = len(started), self.now
            rows = np.fromiter((r for r, _, _ in started), dtype=np.intp, count=n)
            reqs = np.array([req for _, req, _ in started], dtype=np.int64).reshape(n, self._ends.reqs.shape[1])
            ends = np.fromiter((expected_end(pod, now) for _, _, pod in started), dtype=np.float64, count=n)
            self._with_started = (_Joined.of(self._ends, _Ends(rows, reqs, ends, self._ends.nodes)), last)
        return self._with_started[0]

    def _fits(self, unit: Unit, lay: Layout, mc: int, base: IntArray) -> npt.NDArray[np.int64] | None:
        """Where the quorum goes if the usage were ``base``; None when it does not fit. A
        what-if: everything it writes is discarded."""
        out = np.full(mc, -1, dtype=np.int64)
        mark = self.st.checkpoint()
        try:
            self.st.assume(np.maximum(base, 0))
            placed, _ = self.placer.place(unit, lay, mc, mc, out)
        finally:
            self.st.discard(mark)
        return out if placed >= mc else None

    def _reserve(self, q: QueueName | None, unit: Unit, lay: Layout, mc: int) -> Reservation | None:
        snap = self.placer.snap
        ends = self.ends()
        now = self.now
        cur = self.st.used.copy()
        for r in self.made:  # earlier reservations: their quorum runs, with no end
            cur[r.hold_rows] += r.need - r.hold
        finite = ends.ends < NEVER
        times = np.unique(ends.ends[finite])
        found: npt.NDArray[np.int64] | None = None
        start, freed = NEVER, np.zeros_like(cur)
        if len(times):
            last = ends.until(NEVER)
            found = self._fits(unit, lay, mc, cur - last)
            if found is not None:
                lo, hi = 0, len(times) - 1  # the earliest time it fits: times[hi]
                best, freed = found, last
                while lo < hi:
                    mid = (lo + hi) // 2
                    f = ends.until(float(times[mid]))
                    got = self._fits(unit, lay, mc, cur - f)
                    if got is None:
                        lo = mid + 1
                    else:
                        hi, best, freed = mid, got, f
                found, start = best, float(times[hi])
        if found is None:
            found, freed = self._unknown(unit, lay, mc, cur, ends)
            if found is None:
                return None
        rows = tuple(int(x) for x in found)
        assert lay.reqs is not None
        hold_rows = np.array(sorted(set(rows)), dtype=np.intp)
        need = np.zeros((len(hold_rows), cur.shape[1]), dtype=np.int64)
        for m, row in enumerate(rows):
            need[int(np.searchsorted(hold_rows, row))] += lay.reqs[m]
        hold = np.maximum(need - freed[hold_rows], 0)
        on = np.isin(ends.rows, hold_rows)
        ending = int(np.count_nonzero(on & (ends.ends <= start))) if start < NEVER else 0
        r = Reservation(
            unit=unit.key, display=unit.display, queue=q, priority=unit.priority, rows=rows,
            nodes=tuple(snap.nodes[x].name for x in hold_rows), start=max(start, now),
            ending=ending, hold_rows=hold_rows, hold=hold, need=need,
        )
        self.st.hold(hold_rows, hold)
        self.made.append(r)
        return r

    def _unknown(
        self, unit: Unit, lay: Layout, mc: int, cur: IntArray, ends: _Ends | _Joined,
    ) -> tuple[npt.NDArray[np.int64] | None, IntArray]:
        """No finite start: free the work with no declared end on the fewest nodes, those
        holding the least of it first, until the quorum fits (rule 2)."""
        snap = self.placer.snap
        nodes = len(snap.nodes)
        known = ends.until(NEVER)
        unknown = ends.endless()
        alloc = snap.alloc.astype(np.float64)
        share = np.divide(unknown, alloc, out=np.zeros_like(alloc), where=alloc > 0).max(axis=1, initial=0.0)
        ranked = np.argsort(share, kind="stable")
        if self._fits(unit, lay, mc, cur - known - unknown) is None:
            return None, known  # not even an idle cluster holds it
        lo, hi = 0, nodes  # the fewest ranked nodes to free: ranked[:hi]
        while lo < hi:
            mid = (lo + hi) // 2
            f = known.copy()
            f[ranked[:mid]] += unknown[ranked[:mid]]
            if self._fits(unit, lay, mc, cur - f) is None:
                lo = mid + 1
            else:
                hi = mid
        f = known.copy()
        f[ranked[:hi]] += unknown[ranked[:hi]]
        return self._fits(unit, lay, mc, cur - f), f

    def _held_back(self, unit: Unit, lay: Layout, message: str) -> str:
        """``message``, and whose reservation holds room ``unit``'s first member could use."""
        if not self.made or lay.reqs is None or not len(lay.reqs):
            return message
        snap, used = self.placer.snap, self.st.used
        req, mask = lay.reqs[0], lay.masks[int(lay.sig[0])]
        alloc = snap.alloc
        lift = set(self._exempt(unit))
        for i, r in enumerate(self.made):
            if i in lift:
                continue
            rows = r.hold_rows
            room = (alloc[rows] - used[rows] + r.hold >= req).all(axis=1) & mask[rows]
            if room.any():
                names = [snap.nodes[int(x)].name for x in rows[room]]
                return explain.behind_reservation(message, r.display, names)
        return message
