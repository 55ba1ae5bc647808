"""What a queue may still take: borrowing within its cohort, lending, and why not.

Per resource, with ``N`` nominal, ``B`` borrowing limit and ``g = N - lendingLimit`` the
part of a queue's nominal only it may use (0 without a lending limit), every queue must
keep ``D <= N + B`` and a root must keep ``D <= N`` (see :mod:`batchsched.core.queues.tree`).
A unit is *admissible* in a leaf when adding its request keeps every rule on the leaf's
path to the root: :meth:`_Limits.admissible` says why not in one line, naming the limit
that stops it (its borrowing limit, its nominal lent to the cohort, or the cohort lending
none). :meth:`_Limits.borrowed` and :meth:`_Limits.lent` are what a Queue's status shows of
the same arithmetic.

This layer of :class:`~batchsched.core.queues.tree.QueueTree` owns no state: it reads the
shape and quotas (:mod:`~batchsched.core.queues.structure`) and the usage
(:mod:`~batchsched.core.queues.usage`); a check that leaves victims out charges them back
before it returns.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from batchsched.core import explain
from batchsched.core.plan import QueueName
from batchsched.core.quantity import format_units
from batchsched.core.queues.spec import ReclaimPolicy
from batchsched.core.queues.structure import UNLIMITED, IntArray
from batchsched.core.queues.usage import _Usage


class _Limits(_Usage):
    """Admission against the quota rules, borrowing and lending."""

    def would_borrow(self, queue: str, req: IntArray) -> bool:
        """Whether charging ``req`` would take leaf ``queue`` above its nominal in a managed
        resource ``req`` asks for."""
        node = self._nodes[self._leaf(queue)]
        managed = self._managed[node.root]
        return any(
            managed[k] and v > 0 and node.usage[k] + v > node.nominal[k]
            for k, v in enumerate(self._quota_values(req))
        )

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
