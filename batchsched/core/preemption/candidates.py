"""Who may be evicted for a pending unit: the one rule, and an index of running work by it.

The rule (:func:`~batchsched.core.preemption.victims.select_victims` documents it in full
and applies it to each candidate): within the preemptor's queue, by its ``withinQueue``
policy; from the other queues of its tree, only work running on borrowed capacity, by its
``reclaimWithinCohort`` policy; unqueued work by anyone of a higher priority; never
protected work. :class:`Candidates` indexes the running units by queue and priority so
that a preemptor hands the search only the units this rule could allow: it narrows, the
search decides.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import QueueName, RunningUnit, Victim, VictimKind
from batchsched.core.queues import QueueTree, ReclaimPolicy, WithinQueuePolicy

__all__ = ["Candidates", "Claim", "Claimant", "entitled", "eviction_kind", "eviction_rule"]

IntArray = npt.NDArray[np.int64]


class Claimant(Protocol):
    """Who asks to evict others: a preemptor, or a gang whose ``minResources`` is weighed."""

    @property
    def key(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def queue(self) -> QueueName | None: ...
    @property
    def priority(self) -> int: ...
    @property
    def created(self) -> float: ...
    @property
    def name(self) -> str: ...
    @property
    def arrival(self) -> int: ...


@dataclass(slots=True, frozen=True)
class Claim:
    """A :class:`Claimant` as plain values (a gang weighed before it has a layout)."""

    key: str
    uid: str
    queue: QueueName | None
    priority: int
    created: float
    name: str
    arrival: int = 0


def eviction_kind(w: RunningUnit, p: Claimant, tree: QueueTree | None) -> tuple[VictimKind, str] | None:
    """Whether ``p`` may evict running unit ``w``, as what kind of victim and why (the
    victim's message); None when it may not (:func:`eviction_rule`)."""
    kind = eviction_rule(w, p, tree)
    if kind is None:
        return None
    who = p.name or p.key
    if kind is VictimKind.RECLAIM:
        return kind, f"reclaimed by queue {p.queue} for {who}"
    if w.queue is None:
        return kind, f"preempted by {who} (priority {p.priority} > {w.priority})"
    if w.priority < p.priority:
        return kind, f"preempted by {who} in queue {p.queue} (priority {p.priority} > {w.priority})"
    return kind, f"preempted by {who} in queue {p.queue} (same priority {p.priority}, older)"


def eviction_rule(w: RunningUnit, p: Claimant, tree: QueueTree | None) -> VictimKind | None:
    """Whether ``p`` may evict running unit ``w``, and as what kind of victim; None when it
    may not. The rule of this module, in one place (:func:`eviction_kind` adds the words).
    Reclaim also needs ``w``'s queue to be borrowing what ``p`` asks for: the search
    checks that against the resources."""
    if w.key == p.key or w.uid == p.uid or w.protected:
        return None
    if w.queue is None:
        # unqueued work has no guarantee: anyone of a higher priority may evict it
        return VictimKind.PRIORITY if w.priority < p.priority else None
    if p.queue is None:
        return None  # unqueued work never evicts queued work
    if tree is None or tree.leaf_problem(w.queue) is not None or tree.leaf_problem(p.queue) is not None:
        return None
    own = tree.queue(p.queue)
    if w.queue == p.queue:
        policy = own.within_queue
        if w.priority < p.priority and policy is not WithinQueuePolicy.NEVER:
            return VictimKind.PRIORITY
        if (
            policy is WithinQueuePolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
            and w.priority == p.priority
            and (w.created, w.arrival, w.uid) > (p.created, p.arrival, p.uid)
        ):
            return VictimKind.PRIORITY
        return None
    if tree.root(w.queue) != tree.root(p.queue):
        return None
    reclaim = own.reclaim
    if reclaim is ReclaimPolicy.NEVER:
        return None
    if reclaim is ReclaimPolicy.LOWER_PRIORITY and not w.priority < p.priority:
        return None
    return VictimKind.RECLAIM


def entitled(p: Claimant, running: Sequence[RunningUnit], tree: QueueTree | None, width: int) -> IntArray:
    """What ``p`` could have on top of the free capacity, per resource column: the requests
    of the running work it may evict by :func:`eviction_kind`, counting from each other
    queue only what that queue uses beyond its nominal (reclaim gives back a nominal, it
    never takes one away). An upper bound: the victim search decides what is evicted."""
    total = np.zeros(width, dtype=np.int64)
    reclaimable: dict[QueueName, IntArray] = {}
    usage: dict[QueueName, IntArray] = {}
    for w in running:
        vec = np.zeros(width, dtype=np.int64)
        for pod in w.pods:
            vec += pod.req[:width]
        if w.queue is not None:
            usage[w.queue] = usage.get(w.queue, np.zeros(width, dtype=np.int64)) + vec
        kind = eviction_rule(w, p, tree)
        if kind is None:
            continue
        if kind is VictimKind.RECLAIM and w.queue is not None:
            reclaimable[w.queue] = reclaimable.get(w.queue, np.zeros(width, dtype=np.int64)) + vec
        else:
            total += vec
    for q, vec in reclaimable.items():
        assert tree is not None
        above = np.clip(usage[q] - tree.nominal_vector(q)[:width], 0, None)
        total += np.minimum(vec, above)
    return total


class Candidates:
    """Running units that may be preemption victims, indexed so that a preemptor only
    hands :func:`select_victims` the units its rules could allow (it filters them again).

    ``spared``: the keys of units that placed members or hold room in this cycle (a gang's
    new members beside its running ones): never victims in it, see :meth:`spare`."""

    def __init__(self, running: Sequence[RunningUnit], tree: QueueTree, spared: Collection[str] = ()) -> None:
        self.tree = tree
        self.by_queue: dict[QueueName | None, list[RunningUnit]] = {}
        #: unit key -> its queue, for :meth:`spare`
        self._queue_of: dict[str, QueueName | None] = {}
        self._prio: dict[QueueName | None, list[int]] = {}
        self.leaves: dict[QueueName, list[QueueName]] = {}
        #: leaf -> (its usage generation, the columns in which it uses more than its nominal)
        self._over: dict[QueueName, tuple[int, npt.NDArray[np.bool_]]] = {}
        for w in running:
            if not w.protected and w.pods and w.key not in spared:
                self.by_queue.setdefault(w.queue, []).append(w)
                self._queue_of[w.key] = w.queue
        for q in list(self.by_queue):
            self._index(q)
            if q is not None:
                self.leaves.setdefault(tree.root(q), []).append(q)
        for leaves in self.leaves.values():
            leaves.sort()

    def _index(self, q: QueueName | None) -> None:
        units = self.by_queue[q]
        units.sort(key=lambda w: (w.priority, w.created, w.arrival, w.uid))
        self._prio[q] = [w.priority for w in units]

    def _below(self, q: QueueName | None, priority: int, *, equal: bool = False) -> list[RunningUnit]:
        """The units of ``q`` with a lower priority (or equal, with ``equal``): a new list."""
        units = self.by_queue.get(q)
        if not units:
            return []
        prio = self._prio[q]
        end = bisect.bisect_right(prio, priority) if equal else bisect.bisect_left(prio, priority)
        return units[:end]

    def _borrowing(self, v: QueueName) -> npt.NDArray[np.bool_]:
        gen = self.tree.queue_generation(v)
        seen = self._over.get(v)
        if seen is None or seen[0] != gen:
            seen = (gen, self.tree.usage_vector(v) > self.tree.nominal_vector(v))
            self._over[v] = seen
        return seen[1]

    def for_unit(self, queue: QueueName | None, priority: int, x: IntArray) -> list[RunningUnit]:
        out = self._below(None, priority)
        if queue is None:
            return out
        q = self.tree.queue(queue)
        if q.within_queue is WithinQueuePolicy.LOWER_PRIORITY:
            out.extend(self._below(queue, priority))
        elif q.within_queue is WithinQueuePolicy.LOWER_OR_NEWER_EQUAL_PRIORITY:
            out.extend(self._below(queue, priority, equal=True))
        if q.reclaim is ReclaimPolicy.NEVER:
            return out
        asks: npt.NDArray[np.bool_] | None = None
        for v in self.leaves.get(self.tree.root(queue), ()):
            if v == queue:
                continue
            over = self._borrowing(v)
            if not over.any():
                continue
            if asks is None:
                asks = self.tree.managed(queue) & (x > 0)
            if not bool((asks & over).any()):
                continue  # only queues borrowing something the preemptor asks for
            if q.reclaim is ReclaimPolicy.LOWER_PRIORITY:
                out.extend(self._below(v, priority))
            else:
                out.extend(self.by_queue[v])
        return out

    def spare(self, key: str) -> None:
        """The unit ``key`` placed members (or holds room) in this cycle: its running members
        are no victims in it. Evicting them would leave the new ones running as a partial
        gang (or bind them only to evict their gang): the gang is weighed whole next cycle."""
        if key not in self._queue_of:
            return  # nothing of it runs (or it is a victim already)
        q = self._queue_of.pop(key)
        self.by_queue[q] = [w for w in self.by_queue.get(q, ()) if w.key != key]
        self._index(q)

    def remove(self, victim: Victim) -> None:
        """A victim was chosen: it is gone, or only its evicted pods are."""
        q = victim.unit.queue
        units = self.by_queue.get(q, [])
        rest = [w for w in units if w is not victim.unit]
        if not victim.whole:
            gone = {id(p) for p in victim.pods}
            rest.append(replace(victim.unit, pods=tuple(p for p in victim.unit.pods if id(p) not in gone)))
        self.by_queue[q] = rest
        self._index(q)
