"""The shape of the quota tree: which queue is whose parent, and each queue's quota vectors.

:class:`~batchsched.core.queues.tree.QueueTree` builds its nodes here, once: it resolves the
parent chains (an unknown or invalid parent, or a parent cycle, makes a queue invalid),
fills each node's nominal, borrowing limit and kept part (``nominal - lendingLimit``)
children before parents, and drops a cohort that cannot honour what its children keep,
with its subtree. After that the shape only answers questions (parent, children, root,
leaf or not, the stop policy that applies); the one change a nominal takes is
:meth:`_TreeStructure.withhold`, once, before anything is charged. What the queues use is
kept by :mod:`batchsched.core.queues.usage`; what they may still take, borrowing and
lending, by :mod:`batchsched.core.queues.limits`.

Which resources are limited: a resource is *managed* in a tree when some queue of that
tree lists it. A queue that does not list a managed resource has nominal 0 for it (it may
still borrow it); a resource that no queue of the tree lists is not limited at all, so a
GPU-only quota never blocks on cpu, memory or pods. Resources that are not columns of the
snapshot are ignored (nothing can request them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import QueueName
from batchsched.core.quantity import format_units
from batchsched.core.queues.spec import Queue, QueueError, StopPolicy

__all__ = ["UNLIMITED"]

UNLIMITED = 2**62
"""Stands for "no limit" in the int64 quota vectors; sums with real quotas stay in range."""

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


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
    :meth:`_resolve_structure`, then :meth:`_build`), and answers what the tree is.

    It owns the nodes' place in the tree and their ``nominal``, ``borrow`` and ``kept``
    vectors, the managed columns, and what :meth:`withhold` took from a root's nominal.
    """

    columns: tuple[str, ...]
    errors: dict[QueueName, QueueError]
    _col: dict[str, int]
    _nodes: list[_Node]
    _index: dict[QueueName, int]
    _qcols: list[int]
    _qidx: npt.NDArray[np.intp]
    _managed: dict[int, list[bool]]
    #: root index -> per quota column, the nominal withheld (see :meth:`withhold`)
    _withheld: dict[int, list[int]]

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
        self._withheld = {}
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

    # -- lookups

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def names(self) -> tuple[QueueName, ...]:
        return tuple(n.queue.name for n in self._nodes)

    def _node(self, name: str) -> _Node:
        return self._nodes[self._index[QueueName(name)]]

    def queue(self, name: str) -> Queue:
        return self._node(name).queue

    def parent(self, name: str) -> QueueName | None:
        p = self._node(name).parent
        return None if p < 0 else self._nodes[p].queue.name

    def children(self, name: str) -> tuple[QueueName, ...]:
        return tuple(self._nodes[c].queue.name for c in self._node(name).children)

    def root(self, name: str) -> QueueName:
        return self._nodes[self._node(name).root].queue.name

    def stop_policy(self, name: str) -> StopPolicy:
        """The queue's own ``stopPolicy`` or, when it has none, the nearest cohort's above it."""
        i = self._index.get(QueueName(name))
        while i is not None and i >= 0:
            node = self._nodes[i]
            if node.queue.stop is not StopPolicy.NONE:
                return node.queue.stop
            i = node.parent
        return StopPolicy.NONE

    def is_leaf(self, name: str) -> bool:
        i = self._index.get(QueueName(name))
        return i is not None and not self._nodes[i].children

    def leaf_problem(self, name: str) -> tuple[str, str] | None:
        """``(condition reason, message)`` when work may not name ``name``, else None."""
        err = self.errors.get(QueueName(name))
        if err is not None:
            return "QueueInvalid", f"{err}"
        i = self._index.get(QueueName(name))
        if i is None:
            return "QueueNotFound", f"queue {name} does not exist"
        if self._nodes[i].children:
            kids = ", ".join(self.children(name))
            return "QueueNotLeaf", f"queue {name} is the parent of {kids}; only leaf queues hold work"
        return None

    def check_leaf(self, name: str) -> QueueError | None:
        """The :class:`QueueError` for work naming ``name``, or None when it is a valid leaf."""
        problem = self.leaf_problem(name)
        if problem is None:
            return None
        err = self.errors.get(QueueName(name))
        if err is not None:
            return err
        if problem[0] == "QueueNotFound":
            return QueueError(name, "does not exist")
        kids = ", ".join(self.children(name))
        return QueueError(name, f"is the parent of {kids} and cannot hold work (only leaf queues can)")

    def _full(self, values: Sequence[int], fill: int = 0) -> IntArray:
        out = np.full(len(self.columns), fill, dtype=np.int64)
        if self._qcols:
            out[self._qidx] = values
        return out

    def managed(self, name: str) -> BoolArray:
        """The columns quota-limited in ``name``'s tree (a new array)."""
        out = np.zeros(len(self.columns), dtype=np.bool_)
        if self._qcols:
            out[self._qidx] = self._managed[self._node(name).root]
        return out

    def nominal_vector(self, name: str) -> IntArray:
        return self._full(self._node(name).nominal)

    def _dict(self, root: int, values: Sequence[int]) -> dict[str, int]:
        managed = self._managed[root]
        return {self.columns[c]: int(values[k]) for k, c in enumerate(self._qcols) if managed[k]}

    def _path(self, i: int) -> list[int]:
        path = [i]
        while self._nodes[path[-1]].parent >= 0:
            path.append(self._nodes[path[-1]].parent)
        return path

    # -- capacity the cluster cannot back

    def withhold(self, capacity: IntArray, lost: IntArray) -> None:
        """The cluster has ``capacity`` per column, of which ``lost`` sits on nodes that take
        no work of that kind now (GPUs that failed their health checks). Where the roots'
        nominal quotas, summed, promise more than the rest, each root's nominal shrinks by
        its share of the difference (in proportion to its nominal; remainders by name
        order), so no cohort lends, and no queue is admitted into, capacity that is not
        there. Once per tree, before anything is charged; the report shows the nominal as
        given and what was withheld.
        """
        for k, c in enumerate(self._qcols):
            if c >= len(lost) or lost[c] <= 0:
                continue
            roots = [i for i, n in enumerate(self._nodes)
                     if n.parent < 0 and self._managed[i][k] and 0 < n.nominal[k] < UNLIMITED]
            promised = sum(self._nodes[i].nominal[k] for i in roots)
            over = min(promised - int(capacity[c] - lost[c]), promised)
            if over <= 0:
                continue
            shares = {i: over * self._nodes[i].nominal[k] // promised for i in roots}
            left = over - sum(shares.values())
            for i in sorted(roots, key=lambda i: self._nodes[i].queue.name)[:left]:
                shares[i] += 1
            for i, share in shares.items():
                self._nodes[i].nominal[k] -= share
                self._withheld.setdefault(i, [0] * len(self._qcols))[k] = share

    def _given(self, i: int) -> list[int]:
        """Queue ``i``'s nominal as its spec gives it (before :meth:`withhold`)."""
        node, held = self._nodes[i], self._withheld.get(i)
        return node.nominal if held is None else [n + h for n, h in zip(node.nominal, held, strict=True)]
