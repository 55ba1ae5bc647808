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

:class:`QueueTree` is built in layers, one module each, each layer on the one before:

- :mod:`~batchsched.core.queues.structure`: the shape (parents, children, roots, leaves),
  each queue's nominal, borrowing limit and kept part, the managed columns, and the
  nominal withheld for capacity the cluster cannot back;
- :mod:`~batchsched.core.queues.usage`: what each queue uses (admit, release, the demand
  carried up to the root, the log of changes, the bookkeeping check, the fair share);
- :mod:`~batchsched.core.queues.limits`: what a leaf may still take and why not
  (admission, borrowing, lending);
- this module: building the tree from the Queue objects, and each Queue's status.

The Queue CRD is parsed in :mod:`batchsched.core.queues.spec`.

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
from batchsched.core.quantity import MILLI_RESOURCES
from batchsched.core.queues.limits import _Limits
from batchsched.core.queues.spec import Queue, QueueError, parse_queue
from batchsched.core.queues.structure import UNLIMITED, _Node
from batchsched.core.queues.usage import QuotaBookkeepingError

__all__ = [
    "UNLIMITED",
    "QueueName",
    "QueueReport",
    "QueueTree",
    "QuotaBookkeepingError",
]


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


class QueueTree(_Limits):
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
        self._start_usage()

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

    # -- reports

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

