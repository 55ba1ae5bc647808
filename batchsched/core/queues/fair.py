"""Fair share: which queue's unit to try next, and the usage history shares decay over.

Fair share (:class:`FairOrder`): among queues with work waiting, heads that fit within
their queue's nominal go first; then the next unit comes from the queue whose weighted
dominant-resource share, ``max over managed resources of (U + w_h * past) / max(N, 1)``
divided by the queue's weight, would be lowest *with its head admitted* (``U`` counts the
head's request; as Kueue's fair sharing orders by the share with the workload), where
``past`` is the time-decayed usage kept by :class:`UsageHistory` (optional). Unqueued work
has share 0. Within a queue: priority, then age, then arrival (first come, first served among units
created in the same second: :attr:`~batchsched.core.plan.Unit.arrival`; the UID only keeps
the order total); a unit that waited longer than ``max_wait`` goes first. Ties between
queues: share, priority, creation time, arrival.

Heads that fit within their queue's nominal are ordered by the share *before* admission
instead: the queue furthest below its guarantee goes first, whatever the size of its head
(by the share after admission, a gang asking its queue's whole nominal would tie with, or
lose to, a 1-GPU pod of a queue just below its own nominal, and lose the room it reserves
to each of them in turn).

Why the share after admission among borrowers: comparing the shares before it, the unit a queue has
just lost is given back whenever the two shares tie, and who wins a tie is decided by the
heads' age, not by the weights. With queues of nominal 4 (weight 1) and 4 (weight 2) on 16
GPUs, the state 6:10 (shares 1.5 and 1.25) loses a GPU of the first, the shares tie at 1.25
and the older head takes it back: the split stays 10:6, 1.67:1. With the share after
admission, the GPU goes where the share grows least (1.375 against 1.5), which settles on
11:5, the whole-GPU split nearest to 2:1 (with 24 GPUs both settle on 16:8 exactly).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import QueueName
from batchsched.core.queues.structure import FloatArray, IntArray
from batchsched.core.queues.tree import QueueTree

__all__ = ["FairOrder", "Orderable", "Place", "UsageHistory", "queue_rank", "within_order"]

#: where a unit goes within its queue (:func:`within_order`)
Place = tuple[int, int, float, int, str]


def within_order(priority: int, created: float, arrival: int, uid: str, *, aged: bool) -> Place:
    """A unit's place within its queue: a unit that waited past ``max_wait`` (``aged``)
    first, oldest first; then priority, creation time, arrival; the UID keeps it total."""
    if aged:
        return (0, 0, created, arrival, uid)
    return (1, -priority, created, arrival, uid)


# -- history ----------------------------------------------------------------------------


class UsageHistory:
    """Each queue's usage averaged over time with exponential decay (``half_life`` seconds).

    :meth:`record` is called with a queue's usage vector whenever it may have changed
    (once per cycle is enough); the usage is taken to have stayed at the recorded value
    until the next record. :meth:`decayed` is the time-weighted average, in the same
    units as usage: a queue that held 8 GPUs for long reads 8, and half a half-life after
    it released them, about 5.7. Pure: the time is passed in; going back in time counts
    as no time passing.
    """

    def __init__(self, half_life: float, *, weight: float = 1.0) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        self.half_life = half_life
        self.weight = weight
        self._avg: dict[str, FloatArray] = {}
        self._last: dict[str, tuple[FloatArray, float]] = {}

    def _decay(self, since: float, now: float) -> float:
        return float(2.0 ** (-max(0.0, now - since) / self.half_life))

    @staticmethod
    def _pad(a: FloatArray, n: int) -> FloatArray:
        if len(a) >= n:
            return a
        return np.pad(a, (0, n - len(a)))

    def decayed(self, queue: str, now: float) -> FloatArray:
        last = self._last.get(queue)
        if last is None:
            return np.zeros(0, dtype=np.float64)
        vec, when = last
        avg = self._avg[queue]
        n = max(len(vec), len(avg))
        k = self._decay(when, now)
        out: FloatArray = self._pad(avg, n) * k + self._pad(vec, n) * (1.0 - k)
        return out

    def record(self, queue: str, vector: npt.ArrayLike, now: float) -> None:
        vec = np.asarray(vector, dtype=np.float64).copy()
        if queue in self._last:
            self._avg[queue] = self.decayed(queue, now)
            now = max(now, self._last[queue][1])
        else:
            self._avg[queue] = np.zeros(len(vec), dtype=np.float64)
        self._last[queue] = (vec, now)

    def forget(self, queue: str) -> None:
        self._avg.pop(queue, None)
        self._last.pop(queue, None)


# -- fair order -------------------------------------------------------------------------


def queue_rank(tree: QueueTree, queue: QueueName, request: IntArray, *, now: float,
               history: UsageHistory | None = None) -> tuple[bool, float]:
    """Where a unit asking ``request`` of ``queue`` stands in the fair order from
    ``tree``'s usage, lower first: what :class:`FairOrder` keys a queue's head by (whether it
    would borrow, then the share its queue would have with it admitted). The session
    compares ranks to give a queue whose classes back off its turn
    (:mod:`batchsched.core.requeue`)."""
    past, weight = (history.decayed(queue, now), history.weight) if history is not None else (None, 0.0)
    return (tree.would_borrow(queue, request), tree.share(queue, past, weight, adding=request))


class Orderable(Protocol):
    """What :class:`FairOrder` reads of a unit (the cycle's units have these fields)."""

    @property
    def priority(self) -> int: ...

    @property
    def created(self) -> float: ...

    @property
    def arrival(self) -> int: ...

    @property
    def uid(self) -> str: ...


U = TypeVar("U", bound=Orderable)

TOP_PRIORITY = 2**63
"""The priority an aged unit is ordered with, above every real one (int32 in Kubernetes)."""


class FairOrder(Generic[U]):
    """Which unit to try next: a merge of the queues driven by their current shares.

    ``for queue, unit in order:`` yields the head of the queue with the lowest share (ties:
    the head's priority, creation time, arrival: first come, first served; the UID only
    keeps the order total); the caller then calls :meth:`admitted` after
    charging the unit to the tree (:meth:`QueueTree.admit`), or :meth:`skipped`. A unit that
    gets neither counts as skipped. Shares are re-read from the tree whenever its usage
    changed (admissions, releases of preempted work), so the order follows the shares as
    they move during a cycle.

    ``units``: the pending units per queue (``None`` for unqueued work, share 0); every other
    key must be a valid leaf of ``tree``. ``max_wait``: a unit older than this (seconds,
    by ``now - created``) goes ahead of everything else in its queue, oldest first.

    For unqueued work, :meth:`more` hands out the run of units that will come next anyway
    (the cycle places a run of alike single pods with one kernel call).

    ``request``: a unit's quota request (its quorum's summed request vector). When given,
    heads that fit within their queue's nominal go before heads that would borrow (as in
    Kueue), whatever the shares: otherwise a borrower admitted early in a cycle would be
    reclaimed later in the same cycle by a queue that was only asking for its nominal.

    ``limits``: per queue, the last place (:func:`within_order`) up to which its units were
    all handed over (the units after it were not built, see
    :mod:`batchsched.core.queues.heads`). The order ends, with :attr:`cut_short` set, as soon
    as such a queue's next unit would come after its limit (or it has none left): which
    queue goes next then depends on a unit that is not here.
    """

    def __init__(
        self,
        tree: QueueTree,
        units: Mapping[QueueName | None, Iterable[U]],
        *,
        now: float,
        history: UsageHistory | None = None,
        max_wait: float | None = None,
        request: Callable[[U], IntArray] | None = None,
        limits: Mapping[QueueName | None, Place] | None = None,
    ) -> None:
        self.tree = tree
        self.now = now
        self.history = history
        self.max_wait = max_wait
        self.request = request
        self._queues: dict[QueueName | None, list[U]] = {}
        for q, us in units.items():
            if q is not None and tree.leaf_problem(q) is not None:
                raise ValueError(f"FairOrder got units for {q}, which is not a valid leaf queue")
            ordered = sorted(us, key=self._within_key)
            if ordered:
                self._queues[q] = ordered
        self._pos: dict[QueueName | None, int] = dict.fromkeys(self._queues, 0)
        self._stamp: dict[QueueName | None, int] = dict.fromkeys(self._queues, 0)
        self._gen: dict[QueueName | None, int] = {}
        self._heap: list[tuple[int, float, int, float, int, str, int, int]] = []
        self._names: list[QueueName | None] = list(self._queues)
        self._slot = {q: s for s, q in enumerate(self._names)}
        self._mark = 0
        self._current: tuple[QueueName | None, U] | None = None
        #: units handed out by :meth:`more` after the current one, not reported yet
        self._run: list[U] = []
        self.admitted_count: dict[QueueName | None, int] = dict.fromkeys(self._queues, 0)
        self.skipped_count: dict[QueueName | None, int] = dict.fromkeys(self._queues, 0)
        self._limits = dict(limits or {})
        #: the order ended at a queue's limit (see ``limits``)
        self.cut_short = any(q not in self._queues for q in self._limits)
        _, self._mark = tree.changes_since(0)
        for q in self._queues:
            self._push(q)

    def aged(self, unit: U) -> bool:
        return self.max_wait is not None and self.now - unit.created > self.max_wait

    def _within_key(self, unit: U) -> Place:
        return within_order(unit.priority, unit.created, unit.arrival, unit.uid, aged=self.aged(unit))

    def _past_limit(self, queue: QueueName | None, pos: int) -> bool:
        """Whether ``queue``'s unit at ``pos`` is past its limit (or it has none left)."""
        limit = self._limits.get(queue)
        units = self._queues[queue]
        return limit is not None and (pos >= len(units) or self._within_key(units[pos]) > limit)

    def share(self, queue: QueueName | None, unit: U | None = None) -> float:
        """``queue``'s weighted share; with ``unit`` (and a ``request``), the share it would
        have with ``unit`` admitted."""
        if queue is None:
            return 0.0
        past = None
        weight = 0.0
        if self.history is not None:
            past, weight = self.history.decayed(queue, self.now), self.history.weight
        adding = None
        if unit is not None and self.request is not None:
            adding = np.asarray(self.request(unit), dtype=np.int64)
        return self.tree.share(queue, past, weight, adding=adding)

    def borrows(self, queue: QueueName | None, unit: U) -> bool:
        """Whether admitting ``unit`` would take ``queue`` above its nominal."""
        if queue is None or self.request is None:
            return False
        return self.tree.would_borrow(queue, np.asarray(self.request(unit), dtype=np.int64))

    def _push(self, queue: QueueName | None) -> None:
        self._stamp[queue] += 1
        pos = self._pos[queue]
        units = self._queues[queue]
        if queue is not None:
            self._gen[queue] = self.tree.queue_generation(queue)
        if self._past_limit(queue, pos):
            self.cut_short = True
        if pos >= len(units):
            return
        head = units[pos]
        prio = TOP_PRIORITY if self.aged(head) else head.priority
        borrows = self.borrows(queue, head)
        heapq.heappush(
            self._heap,
            (
                int(borrows), self.share(queue, head) if borrows else self.share(queue),
                -prio, head.created, head.arrival, head.uid,
                self._stamp[queue], self._slot[queue],
            ),
        )

    def _refresh(self) -> None:
        """Re-key the queues whose usage changed since their entry was computed."""
        changed, self._mark = self.tree.changes_since(self._mark)
        names: Iterable[QueueName | None] = self._names if changed is None else dict.fromkeys(changed)
        for q in names:
            if (
                q is not None
                and q in self._slot
                and self._pos[q] < len(self._queues[q])
                and self.tree.queue_generation(q) != self._gen.get(q)
            ):
                self._push(q)

    def _advance(self, queue: QueueName | None) -> None:
        self._pos[queue] += 1
        if self._run:
            self._current = (queue, self._run.pop(0))
            return
        self._current = None
        self._push(queue)

    def more(self, same: Callable[[U], bool], limit: int | None = None) -> list[U]:
        """The unqueued units that will be yielded right after the one just yielded, while
        ``same`` holds (at most ``limit``), so the caller can place a run of alike single
        pods in one kernel call.

        Only for unqueued work (the ``None`` bucket): its share is always 0 and admitting it
        changes no queue, so what comes next is known now: the following units of the bucket,
        as long as each sorts before the head of every other queue. Empty otherwise. The
        caller then reports the yielded unit and each of these, in order, with
        :meth:`admitted` or :meth:`skipped`; the iteration resumes after the last.
        """
        if self._current is None or self._current[0] is not None or self._run:
            return []
        self._refresh()
        while self._heap:  # drop used-up entries so the top is the best other queue's head
            stamp, slot = self._heap[0][-2:]
            if stamp == self._stamp[self._names[slot]]:
                break
            heapq.heappop(self._heap)
        other = self._heap[0][:6] if self._heap else None
        units = self._queues[None]
        out: list[U] = []
        pos = self._pos[None] + 1
        while pos < len(units) and (limit is None or len(out) < limit) and not self._past_limit(None, pos):
            unit = units[pos]
            prio = TOP_PRIORITY if self.aged(unit) else unit.priority
            if (other is not None and (0, 0.0, -prio, unit.created, unit.arrival, unit.uid) > other) or not same(unit):
                break
            out.append(unit)
            pos += 1
        self._run = list(out)
        return out

    def __iter__(self) -> Iterator[tuple[QueueName | None, U]]:
        while True:
            if self._current is not None:
                self.skipped(self._current[1])
            if self.cut_short:
                return
            self._refresh()
            while self._heap:
                stamp, slot = self._heap[0][-2:]
                q = self._names[slot]
                if stamp == self._stamp[q]:
                    break
                heapq.heappop(self._heap)
            if not self._heap:
                return
            q = self._names[heapq.heappop(self._heap)[-1]]
            self._stamp[q] += 1  # the popped entry is used up
            unit = self._queues[q][self._pos[q]]
            self._current = (q, unit)
            yield q, unit

    def _done(self, unit: U) -> QueueName | None:
        if self._current is None or self._current[1] is not unit:
            raise ValueError(
                "admitted()/skipped() must be called for the unit just yielded (or handed out by more())"
            )
        return self._current[0]

    def admitted(self, unit: U) -> None:
        q = self._done(unit)
        self.admitted_count[q] += 1
        self._advance(q)

    def skipped(self, unit: U) -> None:
        q = self._done(unit)
        self.skipped_count[q] += 1
        self._advance(q)

    def remaining(self) -> dict[QueueName | None, list[U]]:
        """The units not yielded yet, per queue (for pending counts)."""
        return {q: us[self._pos[q]:] for q, us in self._queues.items() if self._pos[q] < len(us)}
