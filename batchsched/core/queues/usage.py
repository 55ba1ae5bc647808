"""What the queues of the quota tree use: charging and releasing, and the log of changes.

A leaf's *usage* ``U`` is what was charged to it and not yet released; its *demand* ``D``
is its usage, and a cohort's demand is ``sum over its children s of max(D_s, g_s)`` (with
``g = N - lendingLimit`` the part of a child's nominal only it may use: a child's kept
part counts as taken even while it is idle). :meth:`_Usage._add` carries a charge up the
leaf's path to the root, so every queue's demand stays current at the cost of its depth.

This layer of :class:`~batchsched.core.queues.tree.QueueTree` owns the nodes' ``usage``,
``demand`` and ``generation``, the tree's :attr:`~_Usage.generation` and the log of the
leaves charged (:meth:`_Usage.changes_since`). It never checks a limit: whether a charge
is allowed is :mod:`batchsched.core.queues.limits`'s question, asked first.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import QueueName
from batchsched.core.queues.structure import FloatArray, IntArray, _TreeStructure

__all__ = ["QuotaBookkeepingError"]

_LOG_LIMIT = 1 << 16


class QuotaBookkeepingError(RuntimeError):
    """Usage released that was never admitted, or admitted to a queue that cannot hold
    work: a bug in the caller, never a user error."""


class _Usage(_TreeStructure):
    """The tree's usage: charges, releases, the bookkeeping check and the fair share."""

    #: bumps on every admit or release; per-queue counters are in the nodes
    generation: int
    # the leaves charged or released, in order (see changes_since); trimmed when long
    _log: list[int]
    _log_base: int

    def _start_usage(self) -> None:
        """Nothing used yet (the nodes' usage and demand start at what :meth:`_build` set)."""
        self.generation = 0
        self._log = []
        self._log_base = 0

    def _leaf(self, name: str) -> int:
        i = self._index.get(QueueName(name))
        if i is None or self._nodes[i].children:
            raise QuotaBookkeepingError(f"queue {name} is not a valid leaf queue; check_leaf() first")
        return i

    def _quota_values(self, req: npt.ArrayLike) -> list[int]:
        vec = np.asarray(req, dtype=np.int64)
        if vec.shape != (len(self.columns),):
            raise ValueError(f"request vector has shape {vec.shape}, want ({len(self.columns)},)")
        values: list[int] = vec[self._qidx].tolist()
        return values

    def changes_since(self, mark: int) -> tuple[list[QueueName] | None, int]:
        """The leaves charged or released since ``mark`` (0, or a mark this returned), and
        the mark to pass next time. None instead of the list when the log no longer reaches
        back that far: treat every queue as changed."""
        end = self._log_base + len(self._log)
        if mark < self._log_base:
            return None, end
        return [self._nodes[i].queue.name for i in self._log[mark - self._log_base:]], end

    def _add(self, i: int, values: list[int], sign: int) -> None:
        self._log.append(i)
        if len(self._log) > _LOG_LIMIT:
            half = len(self._log) // 2
            del self._log[:half]
            self._log_base += half
        width = len(values)
        delta = [sign * v for v in values]
        while True:
            node = self._nodes[i]
            demand, kept, usage = node.demand, node.kept, node.usage
            has_parent = node.parent >= 0
            before = [max(demand[k], kept[k]) for k in range(width)] if has_parent else []
            for k in range(width):
                demand[k] += delta[k]
                usage[k] += sign * values[k]
            node.generation += 1
            if not has_parent:
                break
            delta = [max(demand[k], kept[k]) - before[k] for k in range(width)]
            i = node.parent
        self.generation += 1

    def admit(self, queue: str, req: IntArray) -> None:
        """Charge ``req`` to leaf ``queue`` (no check: call :meth:`admissible` first)."""
        self._add(self._leaf(queue), self._quota_values(req), 1)

    def release(self, queue: str, req: IntArray) -> None:
        """Give back what :meth:`admit` charged; raises when usage would go negative."""
        i = self._leaf(queue)
        values = self._quota_values(req)
        if any(u < v for u, v in zip(self._nodes[i].usage, values, strict=True)):
            raise QuotaBookkeepingError(f"queue {queue}: releasing more than it uses")
        self._add(i, values, -1)

    def usage_vector(self, name: str) -> IntArray:
        return self._full(self._node(name).usage)

    def queue_generation(self, name: str) -> int:
        return self._node(name).generation

    def usage(self, name: str) -> dict[str, int]:
        node = self._node(name)
        return self._dict(node.root, node.usage)

    def check(self) -> None:
        """Raise :class:`QuotaBookkeepingError` unless every queue keeps its limits and the
        bookkeeping matches a recomputation from the leaves' usage."""
        width = len(self._qcols)
        for i, node in sorted(enumerate(self._nodes), key=lambda e: -e[1].depth):
            if node.children:
                kids = [self._nodes[c] for c in node.children]
                demand = [sum(max(c.demand[k], c.kept[k]) for c in kids) for k in range(width)]
                usage = [sum(c.usage[k] for c in kids) for k in range(width)]
                if demand != node.demand or usage != node.usage:
                    raise QuotaBookkeepingError(f"queue {node.queue.name}: usage bookkeeping is off")
            elif node.demand != node.usage:
                raise QuotaBookkeepingError(f"queue {node.queue.name}: usage bookkeeping is off")
            managed, given = self._managed[node.root], self._given(i)
            for k in range(width):
                if managed[k] and node.demand[k] > given[k] + node.borrow[k]:
                    raise QuotaBookkeepingError(f"queue {node.queue.name}: above nominal + borrowing limit")

    def share(self, name: str, past: FloatArray | None = None, past_weight: float = 1.0,
              adding: IntArray | None = None) -> float:
        """Weighted dominant-resource share: ``max over managed r of
        (U_r + past_weight * past_r) / max(N_r, 1)``, divided by the queue's weight;
        with ``adding`` (a request vector) charged to ``U`` (the share it would have)."""
        node = self._node(name)
        managed = self._managed[node.root]
        extra = self._quota_values(adding) if adding is not None else [0] * len(self._qcols)
        best = 0.0
        for k, c in enumerate(self._qcols):
            if not managed[k]:
                continue
            used = float(node.usage[k] + extra[k])
            if past is not None and past_weight and c < len(past):
                used += past_weight * float(past[c])
            best = max(best, used / max(node.nominal[k], 1))
        return best / node.queue.weight
