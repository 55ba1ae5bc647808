"""The running work of the model over classes (:mod:`batchsched.insight.ahead`), by unit,
and which of it a waiting job may evict.

The scheduler's victim search (:mod:`batchsched.core.preemption`) weighs every candidate
set against budgets, nominations and the cheapest disruption; the estimate needs only
*whether* a job gets in by evicting and *whom* it evicts, so it takes the policy's rules
and a simple order:

- **who may be evicted** (the rule of
  :func:`~batchsched.core.preemption.candidates.eviction_kind`): unqueued units of a lower
  priority, by anyone; units of the job's own queue below its priority (the queue's
  ``withinQueue``: ``Never``, ``LowerPriority``; ``LowerOrNewerEqualPriority`` also takes
  equal priority started later); and, when the job fits within its queue's nominal, units
  of the other queues of its cohort that use more than their nominal of what it asks for
  (``reclaimWithinCohort``: ``Never``, ``LowerPriority``, ``Any``). Unqueued work never
  evicts queued work; a job whose pods say ``preemptionPolicy: Never`` evicts nothing;
  protected units (a PodDisruptionBudget allowing no disruption, pods terminating) and
  units of other schedulers are never victims;
- **whom first**: the lowest priority, then the latest started, whole units at a time,
  as few as let the job's quorum fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import QueueName
from batchsched.core.queues.spec import ReclaimPolicy, WithinQueuePolicy
from batchsched.core.queues.tree import QueueTree

__all__ = ["RunningWork"]

IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class _Unit:
    queue: QueueName | None
    priority: int
    start: float
    #: its pods still running: sequence -> (node, what it frees there, its quota charge)
    pods: dict[int, tuple[int, IntArray, IntArray]] = field(default_factory=dict)


#: the running units of one queue (None: unqueued) at one priority
Group = tuple[QueueName | None, int]


class RunningWork:
    """The running units that may be evicted, with their pods, by the sequence number the
    model gave each pod; and, per queue and priority, what they hold on each node (so a
    search that cannot succeed is known at the cost of a few array sums)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.units: dict[str, _Unit] = {}
        self._unit_of: dict[int, str] = {}
        self._groups: dict[Group, set[str]] = {}
        self._held: dict[Group, IntArray] = {}
        #: (queue, columns asked) -> (the tree's usage mark, the queues of its cohort over nominal)
        self._over: dict[tuple[QueueName, bytes], tuple[int, set[QueueName]]] = {}

    def add(self, seq: int, unit: str, queue: QueueName | None, priority: int, start: float, node: int,
            frees: IntArray, charge: IntArray) -> None:
        u = self.units.get(unit)
        if u is None:
            u = self.units[unit] = _Unit(queue, priority, start)
            self._groups.setdefault((queue, priority), set()).add(unit)
        u.pods[seq] = (node, frees, charge)
        self._unit_of[seq] = unit
        held = self._held.get((queue, priority))
        if held is None:
            held = self._held[(queue, priority)] = np.zeros(self.shape, dtype=np.int64)
        held[node] += frees

    def ended(self, seq: int) -> None:
        """A pod ended on its own."""
        key = self._unit_of.pop(seq, None)
        if key is None:
            return
        u = self.units[key]
        node, frees, _ = u.pods.pop(seq)
        self._held[(u.queue, u.priority)][node] -= frees
        if not u.pods:
            self._drop(key)

    def _drop(self, key: str) -> None:
        u = self.units.pop(key)
        group = self._groups[(u.queue, u.priority)]
        group.discard(key)
        if not group:
            del self._groups[(u.queue, u.priority)]

    def lowest(self, queue: QueueName | None) -> int | None:
        """The lowest priority of a running unit of ``queue`` (None when none runs)."""
        return min((p for q, p in self._groups if q == queue), default=None)

    def groups(self, tree: QueueTree, queue: QueueName | None, priority: int, *, reclaim: bool,
               asks: npt.NDArray[np.bool_], usage: int) -> list[Group]:
        """The groups of units a job of ``queue`` at ``priority`` may evict; ``reclaim``:
        the job fits within its queue's nominal; ``asks``: the quota columns it asks for;
        ``usage``: the tree's mark of its usage (the same mark, the same usage)."""
        within = WithinQueuePolicy.LOWER_PRIORITY if queue is None else tree.queue(queue).within_queue
        lender = ReclaimPolicy.NEVER if queue is None or not reclaim else tree.queue(queue).reclaim
        over: set[QueueName] = set()
        if queue is not None and lender is not ReclaimPolicy.NEVER:
            kept = self._over.get((queue, asks.tobytes()))
            if kept is None or kept[0] != usage:
                kept = self._over[(queue, asks.tobytes())] = (usage, self._over_nominal(tree, queue, asks))
            over = kept[1]
        out: list[Group] = []
        for q, p in self._groups:
            if q is None:  # unqueued work has no guarantee: a higher priority evicts it
                ok = p < priority
            elif queue is None:  # unqueued work never evicts queued work
                ok = False
            elif q == queue:
                ok = (within is not WithinQueuePolicy.NEVER and p < priority) or (
                    within is WithinQueuePolicy.LOWER_OR_NEWER_EQUAL_PRIORITY and p == priority)
            else:
                ok = q in over and (lender is ReclaimPolicy.ANY or p < priority)
            if ok:
                out.append((q, p))
        return out

    def held(self, groups: list[Group]) -> IntArray:
        """What the units of ``groups`` hold on each node."""
        out = np.zeros(self.shape, dtype=np.int64)
        for g in groups:
            out += self._held[g]
        return out

    def candidates(self, groups: list[Group], priority: int) -> list[str]:
        """The units of ``groups``, whom first (a newer unit of the preemptor's own priority
        only after every lower one)."""
        found = [(self.units[key].priority, -self.units[key].start, key) for g in groups for key in self._groups[g]]
        found.sort()
        return [key for _, _, key in found]

    @staticmethod
    def _over_nominal(tree: QueueTree, queue: QueueName | None, asks: npt.NDArray[np.bool_]) -> set[QueueName]:
        """The other leaf queues of ``queue``'s cohort using more than their nominal of a
        column in ``asks``."""
        if queue is None:
            return set()
        root = tree.root(queue)
        out: set[QueueName] = set()
        for name in tree.names:
            if name == queue or not tree.is_leaf(name) or tree.root(name) != root:
                continue
            if bool(np.any((tree.usage_vector(name) > tree.nominal_vector(name)) & asks)):
                out.add(name)
        return out

    def freed(self, keys: list[str]) -> IntArray:
        """What evicting the units ``keys`` frees on each node."""
        out = np.zeros(self.shape, dtype=np.int64)
        for key in keys:
            for node, frees, _ in self.units[key].pods.values():
                out[node] += frees
        return out

    def evict(self, key: str) -> list[tuple[int, int, IntArray, IntArray, QueueName | None]]:
        """Unit ``key`` evicted: its pods' ``(sequence, node, frees, charge, queue)``."""
        u = self.units[key]
        out = [(seq, node, frees, charge, u.queue) for seq, (node, frees, charge) in u.pods.items()]
        held = self._held[(u.queue, u.priority)]
        for seq, node, frees, _, _ in out:
            self._unit_of.pop(seq, None)
            held[node] -= frees
        self._drop(key)
        return out
