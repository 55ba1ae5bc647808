"""The running work as one cycle sees it, charged to the cycle's statement.

Every running (bound or assumed) unit is charged to its queue on the statement's tree; the
victims of earlier preemptions (named by the nominations in the queue input) are gone for
this cycle's decisions: left out of the units and taken out of the working usage, though
they still terminate (:class:`~batchsched.core.statement.Terminating`). Loaded once, when
first needed: by the cycle's accounting when there are queues or nominations, else only
when preemption looks for victims.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt

from batchsched.core.plan import RunningUnit
from batchsched.core.queues import QueueInput, QueueName
from batchsched.core.queues.running import RunningBook
from batchsched.core.statement import Statement

__all__ = ["RunningWork"]

IntArray = npt.NDArray[np.int64]


class RunningWork:
    """The running units of ``qi`` (victims of earlier preemptions left out), charged to
    ``st`` when first asked for (:meth:`units`)."""

    def __init__(self, qi: QueueInput, st: Statement, width: int) -> None:
        self.qi = qi
        self.st = st
        self.width = width
        #: the uids of the victims of the nominations held
        self.victims: set[str] = set()
        for n in qi.nominations:
            self.victims.update(n.victims)
        self._units: list[RunningUnit] | None = None

    @property
    def loaded(self) -> bool:
        return self._units is not None

    def units(self) -> list[RunningUnit]:
        """The running units, charged to the tree (once)."""
        if self._units is None:
            self._units = self._load()
        return self._units

    def _load(self) -> list[RunningUnit]:
        src = self.qi.running
        given = src() if callable(src) else src
        book = self.qi.running_book
        tree = self.st.tree
        if book is not None and all(tree.leaf_problem(q) is None for q in book.usage):
            return self._from_book(book, list(given))
        # each queue's running work charged at once (the tree's sums do not depend on order)
        charged: dict[QueueName, IntArray] = {}
        out: list[RunningUnit] = []
        gone, victims = self.st.gone, self.victims
        for w in given:
            if victims and any(p.uid in victims for p in w.pods):
                # evicted for a nomination: gone for this cycle's decisions
                for p in w.pods:
                    if p.uid in victims:
                        gone.add(p.uid, p.node, p.req)
                w = replace(w, pods=tuple(p for p in w.pods if p.uid not in victims))
                if not w.pods:
                    continue
            q = w.queue
            if q is not None:
                if tree.leaf_problem(q) is not None:
                    w = replace(w, queue=None)
                else:
                    total = charged.get(q)
                    if total is None:
                        total = charged[q] = np.zeros(self.width, dtype=np.int64)
                    for p in w.pods:
                        total += p.req
            out.append(w)
        for q, total in charged.items():
            tree.admit(q, total)
        return out

    def _from_book(self, book: RunningBook, out: list[RunningUnit]) -> list[RunningUnit]:
        """:meth:`_load` from a book that keeps each queue's running usage and which unit
        each pod is in: only the units of victims are looked at."""
        totals = {q: v.copy() for q, v in book.usage.items()}
        emptied: set[int] = set()
        for uid in self.victims:
            unit = book.unit_of(uid)
            if unit is None:
                continue
            at = book.position(unit.key)
            w = out[at]
            gone = [p for p in w.pods if p.uid == uid]
            if not gone:
                continue
            pod = gone[0]
            # evicted for a nomination: gone for this cycle's decisions
            self.st.gone.add(pod.uid, pod.node, pod.req)
            out[at] = replace(w, pods=tuple(p for p in w.pods if p.uid != uid))
            if w.queue is not None:
                totals[w.queue] -= pod.req
            if not out[at].pods:
                emptied.add(at)
        for queue, summed in totals.items():
            if summed.any():
                self.st.tree.admit(queue, summed)
        return [w for i, w in enumerate(out) if i not in emptied] if emptied else out
