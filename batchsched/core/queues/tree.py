"""The quota tree: queues' usage, borrowing and lending, admission, and the Queue status.

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

The tree's structure and quota vectors are built by
:mod:`batchsched.core.queues.structure`; the Queue CRD is parsed in
:mod:`batchsched.core.queues.spec`.

Everything here is synchronous and deterministic: the time is always passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.plan import QueueName
from batchsched.core.quantity import MILLI_RESOURCES, format_units
from batchsched.core.queues.spec import Queue, QueueError, ReclaimPolicy, StopPolicy, parse_queue
from batchsched.core.queues.structure import UNLIMITED, _Node, _TreeStructure

__all__ = [
    "UNLIMITED",
    "QueueName",
    "QueueReport",
    "QueueTree",
    "QuotaBookkeepingError",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_LOG_LIMIT = 1 << 16


class QuotaBookkeepingError(RuntimeError):
    """Usage released that was never admitted, or admitted to a queue that cannot hold
    work: a bug in the caller, never a user error."""


@dataclass(slots=True, frozen=True)
class QueueReport:
    """What a Queue's status shows, per managed resource, in the scheduler's units."""

    nominal: Mapping[str, int]
    used: Mapping[str, int]
    borrowed: Mapping[str, int]
    lent: Mapping[str, int]
    #: of a root's nominal, what the cluster's healthy capacity cannot back now
    #: (:meth:`QueueTree.withhold`); empty elsewhere
    unavailable: Mapping[str, int] = field(default_factory=dict)


class QueueTree(_TreeStructure):
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
        #: root index -> per quota column, the nominal withheld (see :meth:`withhold`)
        self._withheld: dict[int, list[int]] = {}

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

    def usage_vector(self, name: str) -> IntArray:
        return self._full(self._node(name).usage)

    def queue_generation(self, name: str) -> int:
        return self._node(name).generation

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
        reason = self._quota_reason(i, k, need, avail)
        root = self._nodes[i].root
        held = self._withheld.get(root)
        if held is not None and held[k] > 0:
            res = self.columns[self._qcols[k]]
            return f"{reason}; {explain.withheld_note(self._nodes[root].queue.name, held[k], res)}"
        return reason

    def _quota_reason(self, i: int, k: int, need: int, avail: int) -> str:
        node = self._nodes[i]
        res = self.columns[self._qcols[k]]
        name = node.queue.name

        def f(v: int) -> str:
            return format_units(res, v)

        nominal, used = self._given(i)[k], node.usage[k]
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
            back = ("its reclaimWithinCohort is Never: it waits for them to end"
                    if node.queue.reclaim is ReclaimPolicy.NEVER else "reclaim may return it")
            return (
                f"{head}, {f(a)} available: the rest of its nominal is lent to other queues "
                f"of cohort {cohort} ({back})"
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
        i = self._index[QueueName(name)]
        node = self._nodes[i]
        return self._dict(node.root, [max(0, d - n) for d, n in zip(node.demand, self._given(i), strict=True)])

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
        i = self._index[QueueName(name)]
        node = self._nodes[i]
        held = self._withheld.get(i)
        return QueueReport(
            nominal=self._dict(node.root, self._given(i)),
            used=self.usage(name),
            borrowed=self.borrowed(name),
            lent=self.lent(name),
            unavailable={r: v for r, v in self._dict(node.root, held).items() if v} if held else {},
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
        if r.unavailable:
            conditions.append({
                "type": "CapacityReduced", "status": "True", "reason": "UnhealthyNodes",
                "message": explain.capacity_withheld(r.unavailable),
            })
        status: dict[str, Any] = {
            "nominal": _quantities(r.nominal),
            "used": _quantities(r.used),
            "borrowed": _quantities(r.borrowed),
            "lent": _quantities(r.lent),
            "pending": pending,
            "admitted": admitted,
            "conditions": conditions,
        }
        if r.unavailable:
            status["unavailable"] = _quantities(r.unavailable)
        return status

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

    # -- fair share

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


def _quantities(values: Mapping[str, int]) -> dict[str, str]:
    """Exact Kubernetes quantity strings for the scheduler's units."""
    out: dict[str, str] = {}
    for res, units in values.items():
        if res in MILLI_RESOURCES:
            out[res] = f"{units // 1000}" if units % 1000 == 0 else f"{units}m"
            continue
        text = str(units)
        for suffix, div in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if units and units % div == 0:
                text = f"{units // div}{suffix}"
                break
        out[res] = text
    return out

