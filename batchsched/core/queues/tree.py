"""Queues: quotas in a tree, borrowing and lending, queue assignment and fair-share order.

A :class:`Queue` is parsed from our cluster-scoped CRD ``batchsched.io/v1alpha1`` Queue.
Queues form a tree by ``spec.parent``: a queue with children is a *cohort*; only the leaves
hold work. Per resource a queue has a ``nominal`` quota (what it is guaranteed), an
optional ``borrowingLimit`` (how far above nominal it may go; absent = unlimited) and an
optional ``lendingLimit`` (how much of its nominal its cohort may lend to others; absent =
all of it).

Quota semantics (Kueue-like), per resource, with ``N`` nominal, ``B`` borrowing limit and
``g = N - lendingLimit`` the part of a queue's nominal only it may use (0 without a
lending limit):

- a leaf's *demand* ``D`` is its usage ``U``; a cohort's demand is
  ``sum over its children s of max(D_s, g_s)`` (a child's kept part counts as taken even
  while it is idle);
- every queue must keep ``D <= N + B``; a root (a cohort without parent, or a leaf without
  parent) must keep ``D <= N``: a queue without a parent cannot borrow, and a root's
  ``borrowingLimit`` has no effect;
- a cohort without a ``nominal`` has the sum of its children's; a cohort's own nominal, if
  given, caps its subtree (it must be at least what its children keep for themselves).

For a two-level tree the cohort rule reads: the children's use beyond what they keep,
``sum max(0, U_s - g_s)``, fits in the pool they lend, ``sum (N_s - g_s)``. A unit is
*admissible* in a leaf when adding its request keeps every rule above on the leaf's path
to the root; :meth:`QueueTree.admissible` says why not in one line.

Which resources are limited: a resource is *managed* in a tree when some queue of that
tree lists it. A queue that does not list a managed resource has nominal 0 for it (it may
still borrow it); a resource that no queue of the tree lists is not limited at all, so a
GPU-only quota never blocks on cpu, memory or pods. Resources that are not columns of the
snapshot are ignored (nothing can request them).

Queue assignment (:func:`assign_queue`): the label ``batchsched.io/queue``, else the Volcano
PodGroup's ``spec.queue``, else the namespace label ``batchsched.io/default-queue``, else the
configured default queue; none at all means *unqueued* work, which no quota limits. A name
that is not a valid leaf is a :class:`QueueProblem`, never a silent default.

Fair share (:class:`FairOrder`): among queues with work waiting, heads that fit within
their queue's nominal go first; then the next unit comes from the queue with the lowest
weighted dominant-resource share, ``max over managed resources of
(U + w_h * past) / max(N, 1)``, divided by the queue's weight, where ``past`` is the
time-decayed usage kept by :class:`UsageHistory` (optional). Unqueued work has share 0.
Within a queue: priority, then age, then UID; a unit that waited longer than ``max_wait``
goes first. Ties between queues: share, priority, creation time, UID.

Everything here is synchronous and deterministic: the time is always passed in.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import QueueName
from batchsched.core.quantity import QuantityError, format_units, to_units

__all__ = [
    "API_VERSION",
    "DEFAULT_QUEUE_LABEL",
    "KIND",
    "QUEUE_LABEL",
    "FairOrder",
    "Queue",
    "QueueError",
    "QueueName",
    "QueueProblem",
    "QueueReport",
    "QueueTree",
    "Quota",
    "QuotaBookkeepingError",
    "ReclaimPolicy",
    "UsageHistory",
    "WithinQueuePolicy",
    "assign_queue",
    "parse_queue",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


API_VERSION = "batchsched.io/v1alpha1"
KIND = "Queue"
QUEUE_LABEL = "batchsched.io/queue"
DEFAULT_QUEUE_LABEL = "batchsched.io/default-queue"
VOLCANO_DEFAULT_QUEUE = "default"

_LOG_LIMIT = 1 << 16

UNLIMITED = 2**62
"""Stands for "no limit" in the int64 quota vectors; sums with real quotas stay in range."""


class WithinQueuePolicy(StrEnum):
    """Which running units of its own queue a pending unit may preempt."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"


class ReclaimPolicy(StrEnum):
    """Which units of borrowing queues of its cohort a queue may evict to get its nominal back."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class QueueError(ValueError):
    """A queue that cannot be used: the one-line message names the queue.

    Reported as a condition on the Queue (and on work naming it); the queue's work is not
    admitted. Never raised into the cycle by :class:`QueueTree`, which collects them.
    """

    def __init__(self, queue: str, problem: str) -> None:
        super().__init__(f"queue {queue}: {problem}")
        self.queue = queue
        self.problem = problem


class QuotaBookkeepingError(RuntimeError):
    """Usage released that was never admitted, or admitted to a queue that cannot hold
    work: a bug in the caller, never a user error."""


@dataclass(slots=True, frozen=True)
class Quota:
    """One entry of ``spec.resources``, in the scheduler's integer units."""

    nominal: int | None = None
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(slots=True, frozen=True)
class Queue:
    name: QueueName
    parent: QueueName | None = None
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    weight: float = 1.0
    within_queue: WithinQueuePolicy = WithinQueuePolicy.LOWER_PRIORITY
    reclaim: ReclaimPolicy = ReclaimPolicy.ANY


# -- parsing ------------------------------------------------------------------------------


def _quantity(queue: str, where: str, resource: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise QueueError(queue, f"{where} is not a quantity: {value!r}")
    try:
        units = to_units(resource, value)
    except QuantityError as exc:
        raise QueueError(queue, f"{where}: {exc}") from None
    if units < 0:
        raise QueueError(queue, f"{where} must not be negative, got {value}")
    return units


def _quotas(queue: str, resources: Any) -> dict[str, Quota]:
    if resources is None:
        return {}
    if not isinstance(resources, list):
        raise QueueError(queue, "spec.resources must be a list")
    out: dict[str, Quota] = {}
    for i, entry in enumerate(resources):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise QueueError(queue, f"spec.resources[{i}] needs a name")
        name: str = entry["name"]
        if name in out:
            raise QueueError(queue, f"resource {name} is listed twice")
        values: dict[str, int | None] = {}
        for key in ("nominal", "borrowingLimit", "lendingLimit"):
            raw = entry.get(key)
            values[key] = None if raw is None else _quantity(queue, f"{name} {key}", name, raw)
        nominal = values["nominal"]
        for key in ("borrowingLimit", "lendingLimit"):
            if values[key] is not None and nominal is None:
                raise QueueError(queue, f"{name} {key} needs a nominal")
        lending = values["lendingLimit"]
        if lending is not None and nominal is not None and lending > nominal:
            raise QueueError(queue, f"{name} lendingLimit {entry['lendingLimit']} exceeds nominal {entry['nominal']}")
        out[name] = Quota(nominal=nominal, borrowing_limit=values["borrowingLimit"], lending_limit=lending)
    return out


def parse_queue(obj: Mapping[str, Any]) -> Queue:
    """A Queue object as the API returns it; raises :class:`QueueError` for a bad spec."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        raise QueueError("<unnamed>", "metadata.name is missing")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise QueueError(name, "spec must be an object")
    parent = spec.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise QueueError(name, f"spec.parent must be a queue name, got {parent!r}")
    if parent == name:
        raise QueueError(name, "is its own parent")
    weight_raw = spec.get("weight", 1)
    if isinstance(weight_raw, bool) or not isinstance(weight_raw, int | float | str):
        raise QueueError(name, f"spec.weight must be a number, got {weight_raw!r}")
    try:
        weight = float(weight_raw)
    except ValueError:
        raise QueueError(name, f"spec.weight must be a number, got {weight_raw!r}") from None
    if not math.isfinite(weight) or weight <= 0:
        raise QueueError(name, f"spec.weight must be greater than 0, got {weight_raw}")
    preemption = spec.get("preemption") or {}
    if not isinstance(preemption, Mapping):
        raise QueueError(name, "spec.preemption must be an object")
    within_raw = preemption.get("withinQueue", WithinQueuePolicy.LOWER_PRIORITY.value)
    reclaim_raw = preemption.get("reclaimWithinCohort", ReclaimPolicy.ANY.value)
    try:
        within = WithinQueuePolicy(within_raw)
    except ValueError:
        known = ", ".join(p.value for p in WithinQueuePolicy)
        raise QueueError(name, f"spec.preemption.withinQueue {within_raw!r} is not one of {known}") from None
    try:
        reclaim = ReclaimPolicy(reclaim_raw)
    except ValueError:
        known = ", ".join(p.value for p in ReclaimPolicy)
        raise QueueError(name, f"spec.preemption.reclaimWithinCohort {reclaim_raw!r} is not one of {known}") from None
    return Queue(
        name=QueueName(name),
        parent=QueueName(parent) if parent else None,
        quotas=_quotas(name, spec.get("resources")),
        weight=weight,
        within_queue=within,
        reclaim=reclaim,
    )


# -- assignment ---------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class QueueProblem:
    """Work names a queue it cannot use: an Event and a condition on the pod or group.

    ``reason`` is a condition reason: ``QueueNotFound``, ``QueueInvalid`` or ``QueueNotLeaf``.
    """

    queue: str
    source: str
    reason: str
    message: str


def assign_queue(
    *,
    labels: Mapping[str, str],
    podgroup_queue: str | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    default_queue: str | None = None,
    tree: QueueTree,
) -> QueueName | QueueProblem | None:
    """The queue of a pod or group: its label, its Volcano PodGroup's ``spec.queue``, its
    namespace's default-queue label, the configured default, in that order.

    None means unqueued work (nothing names a queue). A name that the tree does not hold
    as a valid leaf is a :class:`QueueProblem`, whichever source gave it. Volcano defaults
    a PodGroup's ``spec.queue`` to ``default``: that value counts as unset unless a Queue
    named ``default`` exists (or failed to parse).
    """
    if podgroup_queue == VOLCANO_DEFAULT_QUEUE and tree.leaf_problem(podgroup_queue) == (
        "QueueNotFound", f"queue {VOLCANO_DEFAULT_QUEUE} does not exist",
    ):
        podgroup_queue = None
    candidates = (
        (labels.get(QUEUE_LABEL), f"label {QUEUE_LABEL}"),
        (podgroup_queue, "PodGroup spec.queue"),
        ((namespace_labels or {}).get(DEFAULT_QUEUE_LABEL), f"namespace label {DEFAULT_QUEUE_LABEL}"),
        (default_queue, "the configured default queue"),
    )
    for name, source in candidates:
        if not name:
            continue
        problem = tree.leaf_problem(name)
        if problem is None:
            return QueueName(name)
        reason, text = problem
        return QueueProblem(queue=name, source=source, reason=reason, message=f"{text} (named by {source})")
    return None


# -- the tree -------------------------------------------------------------------------------


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


@dataclass(slots=True, frozen=True)
class QueueReport:
    """What a Queue's status shows, per managed resource, in the scheduler's units."""

    nominal: Mapping[str, int]
    used: Mapping[str, int]
    borrowed: Mapping[str, int]
    lent: Mapping[str, int]


class QueueTree:
    """The valid queues as a tree over one resource column order, with their current usage.

    Build it from parsed queues (and the errors of those that did not parse), then
    :meth:`admit` the usage of running work. Invalid queues are kept in :attr:`errors`:
    a bad spec, an unknown parent, a parent cycle, a cohort whose nominal is below what
    its children keep, or a queue under an invalid one. Their work is not admitted.

    Vectors passed in and out are int64 arrays over :attr:`columns` (the snapshot's
    order); only managed columns are tracked (others read as 0, or UNLIMITED where they
    are an availability).
    """

    def __init__(
        self,
        queues: Iterable[Queue],
        columns: Sequence[str],
        *,
        errors: Iterable[QueueError] = (),
    ) -> None:
        self.columns = tuple(columns)
        self._col = {c: i for i, c in enumerate(self.columns)}
        self.errors: dict[QueueName, QueueError] = {}
        for err in errors:
            self.errors.setdefault(QueueName(err.queue), err)
        given: dict[QueueName, Queue] = {}
        for q in sorted(queues, key=lambda q: q.name):
            if q.name in given or q.name in self.errors:
                self.errors[q.name] = QueueError(q.name, "is defined twice")
                given.pop(q.name, None)
                continue
            given[q.name] = q
        self._resolve_structure(given)
        self._nodes: list[_Node] = []
        self._index: dict[QueueName, int] = {}
        self._qcols: list[int] = []
        self._qidx: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        self._managed: dict[int, list[bool]] = {}
        self._build(given)
        #: bumps on every admit or release; per-queue counters are in the nodes
        self.generation = 0
        # the leaves charged or released, in order (see changes_since); trimmed when long
        self._log: list[int] = []
        self._log_base = 0

    # -- construction

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> QueueTree:
        queues: list[Queue] = []
        errors: list[QueueError] = []
        for obj in objects:
            try:
                queues.append(parse_queue(obj))
            except QueueError as exc:
                errors.append(exc)
        return cls(queues, columns, errors=errors)

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

    def usage_vector(self, name: str) -> IntArray:
        return self._full(self._node(name).usage)

    def queue_generation(self, name: str) -> int:
        return self._node(name).generation

    # -- usage

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

    def would_borrow(self, queue: str, req: IntArray) -> bool:
        """Whether charging ``req`` would take leaf ``queue`` above its nominal in a managed
        resource ``req`` asks for."""
        node = self._nodes[self._leaf(queue)]
        managed = self._managed[node.root]
        return any(
            managed[k] and v > 0 and node.usage[k] + v > node.nominal[k]
            for k, v in enumerate(self._quota_values(req))
        )

    def _path(self, i: int) -> list[int]:
        path = [i]
        while self._nodes[path[-1]].parent >= 0:
            path.append(self._nodes[path[-1]].parent)
        return path

    def _available(self, path: list[int], k: int) -> int:
        """How much more the first queue of ``path`` (leaf to root) could take in column k."""
        root = self._nodes[path[-1]]
        avail = root.nominal[k] - root.demand[k]
        for j in reversed(path[:-1]):
            node = self._nodes[j]
            local = node.kept[k] - node.demand[k]
            cap = node.nominal[k] + node.borrow[k] - node.demand[k]
            avail = min((local if local > 0 else 0) + avail, cap)
        return avail

    def available(self, queue: str) -> IntArray:
        """Per column, how much more leaf ``queue`` could be charged now (UNLIMITED where
        the column is not managed in its tree)."""
        i = self._leaf(queue)
        path = self._path(i)
        managed = self._managed[self._nodes[i].root]
        values = [self._available(path, k) if managed[k] else UNLIMITED for k in range(len(self._qcols))]
        return self._full(values, UNLIMITED)

    def admissible(
        self,
        queue: str,
        req: IntArray,
        *,
        without: Iterable[tuple[str, IntArray]] = (),
    ) -> str | None:
        """None when ``req`` may be charged to leaf ``queue`` now, else a one-line reason.

        ``without``: ``(queue, vector)`` charges to leave out of the check, as if released
        (the victims of a preemption being considered). The tree is unchanged afterwards.
        """
        problem = self.leaf_problem(queue)
        if problem is not None:
            return problem[1]
        values = self._quota_values(req)
        removed: list[tuple[int, list[int]]] = []
        try:
            for name, v in without:
                j, vals = self._leaf(name), self._quota_values(v)
                self._add(j, vals, -1)
                removed.append((j, vals))
            i = self._index[QueueName(queue)]
            path = self._path(i)
            managed = self._managed[self._nodes[i].root]
            for k, need in enumerate(values):
                if need > 0 and managed[k]:
                    avail = self._available(path, k)
                    if need > avail:
                        return self._reason(i, k, need, avail)
            return None
        finally:
            for j, vals in reversed(removed):
                self._add(j, vals, 1)

    def admissible_prefix(self, queue: str, reqs: IntArray, min_count: int) -> int:
        """How many members (a prefix of ``reqs``, at least ``min_count``) quota allows,
        0 when the first ``min_count`` together are not admissible. For elastic gangs:
        charge the quorum, then as many extras as quota leaves room for."""
        if self.leaf_problem(queue) is not None:
            return 0
        i = self._index[QueueName(queue)]
        path = self._path(i)
        managed = self._managed[self._nodes[i].root]
        cols = [k for k in range(len(self._qcols)) if managed[k]]
        avail = {k: self._available(path, k) for k in cols}
        rows: list[list[int]] = np.asarray(reqs, dtype=np.int64)[:, self._qidx].tolist()
        total = dict.fromkeys(cols, 0)
        for m, row in enumerate(rows):
            if any(row[k] > 0 and total[k] + row[k] > avail[k] for k in cols):
                return 0 if m < min_count else m
            for k in cols:
                total[k] += row[k]
        return len(rows) if len(rows) >= min_count else 0

    def _reason(self, i: int, k: int, need: int, avail: int) -> str:
        node = self._nodes[i]
        res = self.columns[self._qcols[k]]
        name = node.queue.name

        def f(v: int) -> str:
            return format_units(res, v)

        nominal, used = node.nominal[k], node.usage[k]
        head = f"queue {name}: needs {f(need)} {res}; nominal {f(nominal)}, in use {f(used)}"
        a = max(0, avail)
        may_borrow = max(0, a - max(0, nominal - used))  # beyond what it uses or its nominal
        if node.parent < 0:
            return f"{head}, may borrow 0 (no cohort)"
        cohort = self._nodes[node.parent].queue.name
        own_cap = node.nominal[k] + node.borrow[k] - node.demand[k]
        if node.borrow[k] < UNLIMITED and own_cap <= a:
            return f"{head}, may borrow {f(may_borrow)} (borrowing limit {f(node.borrow[k])})"
        if used + need <= nominal:
            return (
                f"{head}, {f(a)} available: the rest of its nominal is lent to other queues "
                f"of cohort {cohort} (reclaim may return it)"
            )
        lends = "lends none" if may_borrow == 0 else f"has {f(may_borrow)} to lend"
        return f"{head}, may borrow {f(may_borrow)} (cohort {cohort} {lends})"

    # -- reports

    def _dict(self, root: int, values: Sequence[int]) -> dict[str, int]:
        managed = self._managed[root]
        return {self.columns[c]: int(values[k]) for k, c in enumerate(self._qcols) if managed[k]}

    def usage(self, name: str) -> dict[str, int]:
        node = self._node(name)
        return self._dict(node.root, node.usage)

    def borrowed(self, name: str) -> dict[str, int]:
        """How far ``name`` is above its nominal, per managed resource."""
        node = self._node(name)
        return self._dict(node.root, [max(0, d - n) for d, n in zip(node.demand, node.nominal, strict=True)])

    def lent(self, name: str) -> dict[str, int]:
        """The part of ``name``'s idle, lendable nominal that other queues of its cohort use.

        What the cohort's children borrow is attributed to its lenders in proportion to
        what each has idle and lendable (integer shares, remainders by name order). For
        status only: admission never reads it.
        """
        i = self._index[QueueName(name)]
        node = self._nodes[i]
        width = len(self._qcols)
        out = [0] * width
        if node.parent >= 0:
            siblings = sorted(self._nodes[node.parent].children, key=lambda j: self._nodes[j].queue.name)
            for k in range(width):
                idle = {
                    j: max(0, self._nodes[j].nominal[k] - max(self._nodes[j].demand[k], self._nodes[j].kept[k]))
                    for j in siblings
                }
                borrowed = sum(max(0, self._nodes[j].demand[k] - self._nodes[j].nominal[k]) for j in siblings)
                total_idle = sum(idle.values())
                lent_total = min(borrowed, total_idle)
                if lent_total == 0:
                    continue
                shares = {j: idle[j] * lent_total // total_idle for j in siblings}
                rest = lent_total - sum(shares.values())
                for j in siblings:
                    if rest == 0:
                        break
                    if shares[j] < idle[j]:
                        shares[j] += 1
                        rest -= 1
                out[k] = shares[i]
        return self._dict(node.root, out)

    def report(self, name: str) -> QueueReport:
        node = self._node(name)
        return QueueReport(
            nominal=self._dict(node.root, node.nominal),
            used=self.usage(name),
            borrowed=self.borrowed(name),
            lent=self.lent(name),
        )

    def status(self, name: str, *, pending: int, admitted: int, misplaced: int = 0) -> dict[str, Any]:
        """The Queue's ``status`` (without condition timestamps: the writer adds them).

        ``misplaced``: how many units name this queue although it is a cohort.
        """
        err = self.errors.get(QueueName(name))
        conditions: list[dict[str, str]] = []
        if err is not None or name not in self._index:
            conditions.append({
                "type": "Active", "status": "False", "reason": "InvalidSpec",
                "message": str(err) if err is not None else f"queue {name}: unknown",
            })
            return {"pending": pending, "admitted": admitted, "conditions": conditions}
        conditions.append({"type": "Active", "status": "True", "reason": "Ready", "message": "quota is enforced"})
        if misplaced:
            kids = ", ".join(self.children(name))
            conditions.append({
                "type": "WorkRejected", "status": "True", "reason": "QueueNotLeaf",
                "message": f"queue {name}: {misplaced} units name it, but it is the parent of "
                f"{kids}; only leaf queues hold work",
            })
        r = self.report(name)
        return {
            "nominal": _quantities(r.nominal),
            "used": _quantities(r.used),
            "borrowed": _quantities(r.borrowed),
            "lent": _quantities(r.lent),
            "pending": pending,
            "admitted": admitted,
            "conditions": conditions,
        }

    def check(self) -> None:
        """Raise :class:`QuotaBookkeepingError` unless every queue keeps its limits and the
        bookkeeping matches a recomputation from the leaves' usage."""
        width = len(self._qcols)
        for node in sorted(self._nodes, key=lambda n: -n.depth):
            if node.children:
                kids = [self._nodes[c] for c in node.children]
                demand = [sum(max(c.demand[k], c.kept[k]) for c in kids) for k in range(width)]
                usage = [sum(c.usage[k] for c in kids) for k in range(width)]
                if demand != node.demand or usage != node.usage:
                    raise QuotaBookkeepingError(f"queue {node.queue.name}: usage bookkeeping is off")
            elif node.demand != node.usage:
                raise QuotaBookkeepingError(f"queue {node.queue.name}: usage bookkeeping is off")
            managed = self._managed[node.root]
            for k in range(width):
                if managed[k] and node.demand[k] > node.nominal[k] + node.borrow[k]:
                    raise QuotaBookkeepingError(f"queue {node.queue.name}: above nominal + borrowing limit")

    # -- fair share

    def share(self, name: str, past: FloatArray | None = None, past_weight: float = 1.0) -> float:
        """Weighted dominant-resource share: ``max over managed r of
        (U_r + past_weight * past_r) / max(N_r, 1)``, divided by the queue's weight."""
        node = self._node(name)
        managed = self._managed[node.root]
        best = 0.0
        for k, c in enumerate(self._qcols):
            if not managed[k]:
                continue
            used = float(node.usage[k])
            if past is not None and past_weight and c < len(past):
                used += past_weight * float(past[c])
            best = max(best, used / max(node.nominal[k], 1))
        return best / node.queue.weight


def _quantities(values: Mapping[str, int]) -> dict[str, str]:
    """Exact Kubernetes quantity strings for the scheduler's units."""
    out: dict[str, str] = {}
    for res, units in values.items():
        if res == "cpu":
            out[res] = f"{units // 1000}" if units % 1000 == 0 else f"{units}m"
            continue
        text = str(units)
        for suffix, div in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if units and units % div == 0:
                text = f"{units // div}{suffix}"
                break
        out[res] = text
    return out


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


class Orderable(Protocol):
    """What :class:`FairOrder` reads of a unit (the cycle's units have these fields)."""

    @property
    def priority(self) -> int: ...

    @property
    def created(self) -> float: ...

    @property
    def uid(self) -> str: ...


U = TypeVar("U", bound=Orderable)

TOP_PRIORITY = 2**63
"""The priority an aged unit is ordered with, above every real one (int32 in Kubernetes)."""


class FairOrder(Generic[U]):
    """Which unit to try next: a merge of the queues driven by their current shares.

    ``for queue, unit in order:`` yields the head of the queue with the lowest share (ties:
    the head's priority, creation time, UID); the caller then calls :meth:`admitted` after
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
        self._heap: list[tuple[int, float, int, float, str, int, int]] = []
        self._names: list[QueueName | None] = list(self._queues)
        self._slot = {q: s for s, q in enumerate(self._names)}
        self._mark = 0
        self._current: tuple[QueueName | None, U] | None = None
        #: units handed out by :meth:`more` after the current one, not reported yet
        self._run: list[U] = []
        self.admitted_count: dict[QueueName | None, int] = dict.fromkeys(self._queues, 0)
        self.skipped_count: dict[QueueName | None, int] = dict.fromkeys(self._queues, 0)
        _, self._mark = tree.changes_since(0)
        for q in self._queues:
            self._push(q)

    def aged(self, unit: U) -> bool:
        return self.max_wait is not None and self.now - unit.created > self.max_wait

    def _within_key(self, unit: U) -> tuple[int, int, float, str]:
        if self.aged(unit):
            return (0, 0, unit.created, unit.uid)
        return (1, -unit.priority, unit.created, unit.uid)

    def share(self, queue: QueueName | None) -> float:
        if queue is None:
            return 0.0
        past = None
        weight = 0.0
        if self.history is not None:
            past, weight = self.history.decayed(queue, self.now), self.history.weight
        return self.tree.share(queue, past, weight)

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
        if pos >= len(units):
            return
        head = units[pos]
        prio = TOP_PRIORITY if self.aged(head) else head.priority
        heapq.heappush(
            self._heap,
            (
                int(self.borrows(queue, head)), self.share(queue), -prio, head.created, head.uid,
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
        other = self._heap[0][:5] if self._heap else None
        units = self._queues[None]
        out: list[U] = []
        pos = self._pos[None] + 1
        while pos < len(units) and (limit is None or len(out) < limit):
            unit = units[pos]
            prio = TOP_PRIORITY if self.aged(unit) else unit.priority
            if (other is not None and (0, 0.0, -prio, unit.created, unit.uid) > other) or not same(unit):
                break
            out.append(unit)
            pos += 1
        self._run = list(out)
        return out

    def __iter__(self) -> Iterator[tuple[QueueName | None, U]]:
        while True:
            if self._current is not None:
                self.skipped(self._current[1])
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
