"""How the queue specs become a tree of per-resource quota vectors, built once.

:class:`~batchsched.core.queues.tree.QueueTree` builds its nodes here: it resolves the
parent chains (an unknown or invalid parent, or a parent cycle, makes a queue invalid),
fills each node's nominal, borrowing limit and kept part (``nominal - lendingLimit``)
children before parents, and drops a cohort that cannot honour what its children keep,
with its subtree. The running bookkeeping (admit, release, admissible) stays in the tree.

Which resources are limited: a resource is *managed* in a tree when some queue of that
tree lists it. A queue that does not list a managed resource has nominal 0 for it (it may
still borrow it); a resource that no queue of the tree lists is not limited at all, so a
GPU-only quota never blocks on cpu, memory or pods. Resources that are not columns of the
snapshot are ignored (nothing can request them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import QueueName
from batchsched.core.quantity import format_units
from batchsched.core.queues.spec import Queue, QueueError

__all__ = ["UNLIMITED"]

UNLIMITED = 2**62
"""Stands for "no limit" in the int64 quota vectors; sums with real quotas stay in range."""


@dataclass(slots=True)
class _Node:
    """One queue in the tree. The quota vectors hold plain ints, one per *quota column*
    (a column some queue lists): the hot paths touch a handful of ints, not arrays."""

    queue: Queue
    parent: int
    root: int = -1
    depth: int = 0
    children: list[int] = field(default_factory=list)
    nominal: list[int] = field(default_factory=list)
    borrow: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    usage: list[int] = field(default_factory=list)
    demand: list[int] = field(default_factory=list)
    generation: int = 0


class _TreeStructure:
    """The part of :class:`~batchsched.core.queues.tree.QueueTree` that builds its nodes
    and quota vectors from the valid queues (its ``__init__`` calls
    :meth:`_resolve_structure`, then :meth:`_build`)."""

    columns: tuple[str, ...]
    errors: dict[QueueName, QueueError]
    _col: dict[str, int]
    _nodes: list[_Node]
    _index: dict[QueueName, int]
    _qcols: list[int]
    _qidx: npt.NDArray[np.intp]
    _managed: dict[int, list[bool]]

    def _resolve_structure(self, given: dict[QueueName, Queue]) -> None:
        """Drop queues with an unknown or invalid parent, or on a parent cycle."""
        state: dict[QueueName, bool] = {}  # valid or not

        for name in list(given):
            path: list[QueueName] = []
            cur: QueueName | None = name
            while cur is not None and cur not in state:
                if cur in path:
                    cycle = [*path[path.index(cur):], cur]
                    chain = " -> ".join(cycle)
                    for member in cycle[:-1]:
                        self.errors[member] = QueueError(member, f"parent chain {chain} is a cycle")
                        state[member] = False
                    break
                path.append(cur)
                parent = given[cur].parent
                if parent is not None and parent not in given:
                    why = "is invalid" if parent in self.errors else "does not exist"
                    self.errors[cur] = QueueError(cur, f"parent {parent} {why}")
                    state[cur] = False
                    break
                cur = parent
            # unwind, top first: a queue is valid when its parent is
            for member in reversed(path):
                if member in state:
                    continue
                parent = given[member].parent
                state[member] = parent is None or state[parent]
                if not state[member]:
                    self.errors[member] = QueueError(member, f"parent {parent} is invalid")
        for name, valid in state.items():
            if not valid:
                given.pop(name, None)

    def _build(self, given: dict[QueueName, Queue]) -> None:
        while True:
            names = sorted(given)
            self._nodes = []
            self._index = {n: i for i, n in enumerate(names)}
            for n in names:
                q = given[n]
                self._nodes.append(_Node(queue=q, parent=self._index[q.parent] if q.parent else -1))
            for i, node in enumerate(self._nodes):
                if node.parent >= 0:
                    self._nodes[node.parent].children.append(i)
            # roots and depth; ``order`` lists parents before their children
            order: list[int] = []
            for i, node in enumerate(self._nodes):
                if node.parent < 0:
                    node.root, node.depth = i, 0
                    stack = [i]
                    while stack:
                        j = stack.pop()
                        order.append(j)
                        for c in self._nodes[j].children:
                            self._nodes[c].root = node.root
                            self._nodes[c].depth = self._nodes[j].depth + 1
                            stack.append(c)
            listed: dict[int, set[int]] = {}
            for node in self._nodes:
                cols = listed.setdefault(node.root, set())
                cols.update(self._col[r] for r in node.queue.quotas if r in self._col)
            self._qcols = sorted(set().union(*listed.values()))
            self._qidx = np.array(self._qcols, dtype=np.intp)
            self._managed = {root: [c in cols for c in self._qcols] for root, cols in listed.items()}
            bad = self._quotas(order)
            if not bad:
                break
            # a cohort that cannot honour what its children keep: drop its subtree, retry
            for i in bad:
                for j in self._subtree(i):
                    name = self._nodes[j].queue.name
                    given.pop(name, None)
                    if j != i and name not in self.errors:
                        parent = self._nodes[self._nodes[j].parent].queue.name
                        self.errors[name] = QueueError(name, f"parent {parent} is invalid")

    def _subtree(self, i: int) -> list[int]:
        out, stack = [], [i]
        while stack:
            j = stack.pop()
            out.append(j)
            stack.extend(self._nodes[j].children)
        return out

    def _quotas(self, order: list[int]) -> list[int]:
        """Fill each node's quota vectors (children before parents); the cohorts that
        cannot honour what their children keep."""
        width = len(self._qcols)
        position = {c: k for k, c in enumerate(self._qcols)}
        bad: list[int] = []
        for i in reversed(order):
            node = self._nodes[i]
            nominal = [0] * width
            borrow = [UNLIMITED] * width
            kept = [0] * width
            demand = [0] * width
            for child in node.children:
                c = self._nodes[child]
                for k in range(width):
                    nominal[k] += c.nominal[k]
                    demand[k] += max(c.demand[k], c.kept[k])
            for res, quota in node.queue.quotas.items():
                col = self._col.get(res)
                if col is None:
                    continue
                k = position[col]
                if quota.nominal is not None:
                    nominal[k] = quota.nominal
                if quota.borrowing_limit is not None:
                    borrow[k] = quota.borrowing_limit
                if quota.lending_limit is not None and quota.nominal is not None:
                    kept[k] = quota.nominal - quota.lending_limit
            if node.parent < 0:
                borrow = [0] * width
            node.nominal, node.borrow, node.kept, node.demand = nominal, borrow, kept, demand
            node.usage = [0] * width
            # with no usage, a cohort's demand is what its subtree keeps for itself; an
            # explicit nominal (plus borrowing) below that cannot honour those guarantees
            managed = self._managed[node.root]
            short = [k for k in range(width) if managed[k] and demand[k] > nominal[k] + borrow[k]]
            if short:
                k = short[0]
                res = self.columns[self._qcols[k]]
                self.errors[node.queue.name] = QueueError(
                    node.queue.name,
                    f"nominal {format_units(res, nominal[k])} {res} is less than the "
                    f"{format_units(res, demand[k])} its children keep for themselves "
                    "(nominal - lendingLimit)",
                )
                bad.append(i)
        return bad
