"""A cycle's tentative writes, on one object: the :class:`Statement`.

The snapshot is immutable during a cycle; everything the cycle decides is written here
instead (as KAI Scheduler's Statement, over an overlay rather than the cluster):

- the working **usage** of each node (the snapshot's, plus what the cycle placed, held or
  charged, less what its victims free), and which rows of it changed since the kernel's
  views of the nodes were taken (:class:`~batchsched.core.placement.views.NodeViews`);
- the **queue charges** on the cycle's queue tree;
- the **evictions**: victims still terminating (:class:`Terminating`), the pods each unit
  lost to victim searches, and the units spared from them;
- the **reservation holds** on the nodes, and the members placed so far (what a
  reservation counts as work that starts now);
- the **plan** being written: bindings, nominations, preemptions, results, and the pods
  told why they wait.

Placement, preemption and reservation each act on the statement (and read the snapshot,
the layouts and the queue input); none of them calls another back. A tentative attempt
opens a :meth:`Statement.checkpoint`; :meth:`Statement.discard` takes back every write
made through the statement since (in reverse order), :meth:`Statement.commit` keeps them.
The placement kernels write the usage array in place: :meth:`Statement.placed` records
what they added, so a discard takes that back too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core.model import Pod
from batchsched.core.placement.cards import cards_over
from batchsched.core.placement.views import NodeViews
from batchsched.core.plan import (
    Binding,
    Nomination,
    Plan,
    PreemptionRecord,
    Unit,
    UnitResult,
    UnitStatus,
    Unschedulable,
)
from batchsched.core.queues import QueueName, QueueTree

__all__ = ["Statement", "Terminating"]

IntArray = npt.NDArray[np.int64]


class Terminating:
    """Victims still charged by the mirror (terminating): taken out of ``used`` (the
    statement's working usage, updated in place), but their nodes are not free to bind on
    until they are gone."""

    def __init__(self, used: IntArray, alloc: IntArray, touch: Callable[[list[int]], None] | None = None,
                 device: IntArray | None = None) -> None:
        self.used = used
        #: the device descriptor: cards are counted card by card (:func:`cards_over`)
        self.device = device
        #: told of every row whose usage changes here
        self.touch = touch
        self.alloc = alloc
        self.term = np.zeros_like(used)
        self.pods: dict[int, set[str]] = {}
        #: the uids of the victims
        self.live: set[str] = set()

    def add(self, uid: str, row: int, req: IntArray) -> None:
        self.used[row] -= req
        if self.touch is not None:
            self.touch([row])
        self.term[row] += req
        self.pods.setdefault(row, set()).add(uid)
        self.live.add(uid)

    def blocked_by(self, rows: Sequence[int]) -> set[str]:
        """Victims still terminating on those of ``rows`` that would be over-committed if
        the pods just charged there were bound now (empty: they may be bound), resource by
        resource and card by card."""
        out: set[str] = set()
        for row in set(rows):
            if row not in self.pods:
                continue
            full = self.used[row] + self.term[row]
            if bool((full > self.alloc[row]).any()) or (
                self.device is not None and cards_over(self.alloc[row], full, self.device)
            ):
                out |= self.pods[row]
        return out

    def remaining(self) -> bool:
        """Whether a victim still holds room on some node."""
        return any(bool(self.term[r].any()) for r in self.pods)


class Statement:
    """The tentative writes of one cycle over ``alloc`` and a copy of ``used`` (the
    snapshot's), charging ``tree`` and writing ``plan`` (see the module docstring).
    ``device``: the device descriptor, for the victims' cards."""

    def __init__(self, alloc: IntArray, used: IntArray, tree: QueueTree, plan: Plan,
                 device: IntArray | None = None) -> None:
        self.used = used.copy()
        self.views = NodeViews(used.shape[0])
        self.tree = tree
        self.plan = plan
        self.gone = Terminating(self.used, alloc, touch=self.touch, device=device)
        #: units that placed members or hold room in this cycle: no victims in it
        self.spared: set[str] = set()
        self._spared_order: list[str] = []
        #: unit key -> its pods chosen as victims in this cycle
        self.evicted: dict[str, int] = {}
        #: the members placed (bound or nominated) in this cycle: node row, request, pod
        self.starting: list[tuple[int, IntArray, Pod]] = []
        self._undo: list[Callable[[], None]] = []
        self._marks: list[int] = []
        self._undoing = False

    # -- checkpoint, commit, discard ----------------------------------------------------------

    def checkpoint(self) -> int:
        """Open a tentative attempt; returns its mark for :meth:`commit` or :meth:`discard`.
        Attempts nest: the inner one is discarded or committed first."""
        self._marks.append(len(self._undo))
        return len(self._marks) - 1

    def commit(self, mark: int) -> None:
        """Keep the writes made since ``mark``; an enclosing attempt may still discard them."""
        self._close(mark)
        if not self._marks:
            self._undo.clear()

    def discard(self, mark: int) -> None:
        """Take back every write made through the statement since ``mark``, last first."""
        start = self._close(mark)
        undo = self._undo
        self._undoing = True  # an undo writes through the statement too: not to be logged
        try:
            while len(undo) > start:
                undo.pop()()
        finally:
            self._undoing = False

    @property
    def trying(self) -> bool:
        """Whether an attempt is open (its writes may yet be discarded)."""
        return bool(self._marks)

    def _close(self, mark: int) -> int:
        assert mark == len(self._marks) - 1, "attempts close innermost first"
        return self._marks.pop()

    def _log(self, undo: Callable[[], None]) -> None:
        if self._marks and not self._undoing:
            self._undo.append(undo)

    # -- usage ------------------------------------------------------------------------------

    def touch(self, rows: Any) -> None:
        """The usage changed on these rows outside the cached kernel."""
        self.views.touch(rows)

    def touch_all(self) -> None:
        self.views.touch_all()

    def placed(self, rows: Sequence[int] | IntArray, reqs: IntArray) -> None:
        """A kernel added ``reqs[m]`` on ``rows[m]`` (members it placed): recorded, so that
        a discard takes them off."""
        if self._marks:
            kept = [int(r) for r in rows], reqs.copy()
            self._log(lambda: self._add(kept[0], kept[1], -1))

    def unplace(self, rows: Sequence[int], reqs: IntArray) -> None:
        """Take back what a kernel added (``reqs[m]`` on ``rows[m]``) for members that are not
        placed after all (their devices could not be allocated); a discard puts it back, so
        that the kernel's own record of it is undone exactly."""
        self._add(rows, reqs, -1)
        kept = list(rows), reqs.copy()
        self._log(lambda: self._add(kept[0], kept[1], 1))

    def undoable(self, undo: Callable[[], None]) -> None:
        """A write made outside the statement (a device allocated in the cycle's
        :class:`~batchsched.core.dra.DeviceCycle`): ``undo`` takes it back on a discard."""
        self._log(undo)

    def _add(self, rows: Sequence[int], reqs: IntArray, sign: int) -> None:
        for m, row in enumerate(rows):
            self.used[row] += sign * reqs[m]
        self.touch(list(rows))

    def charge(self, queue: QueueName | None, rows: Sequence[int], reqs: IntArray, sign: int) -> None:
        """Charge (``sign`` 1) or release (-1) ``reqs`` on ``rows`` and to ``queue``."""
        self._add(rows, reqs, sign)
        if queue is not None:
            (self.tree.admit if sign > 0 else self.tree.release)(queue, reqs.sum(axis=0))
        self._log(lambda: self.charge(queue, rows, reqs, -sign))

    def admit(self, queue: QueueName, amount: IntArray) -> None:
        """Charge ``amount`` to ``queue`` alone (the nodes were charged by the kernel)."""
        self.tree.admit(queue, amount)
        self._log(lambda: self.tree.release(queue, amount))

    def hold(self, rows: npt.NDArray[np.intp], amount: IntArray, sign: int = 1) -> None:
        """A reservation holds (``sign`` 1) or lifts (-1) ``amount`` on ``rows``."""
        self.used[rows] += sign * amount
        self.touch(rows)
        self._log(lambda: self.hold(rows, amount, -sign))

    def assume(self, usage: IntArray) -> None:
        """The usage is ``usage`` everywhere (a what-if, inside an attempt to discard)."""
        saved = self.used.copy()
        self.used[:] = usage
        self.touch_all()

        def restore() -> None:
            self.used[:] = saved
            self.touch_all()

        self._log(restore)

    @contextmanager
    def victims_room_closed(self) -> Iterator[None]:
        """Within: the room victims still hold (they terminate) is not free to place on.
        What is placed meanwhile stays charged. A view, not a write: nothing to discard."""
        gone = self.gone
        rows = [r for r in gone.pods if bool(gone.term[r].any())]
        saved = {r: gone.term[r].copy() for r in rows}
        for r in rows:
            self.used[r] += saved[r]
            gone.term[r] = 0
        self.touch(rows)
        try:
            yield
        finally:
            for r in rows:
                gone.term[r] = saved[r]
                self.used[r] -= saved[r]
            self.touch(rows)

    # -- evictions --------------------------------------------------------------------------

    def spare(self, key: str) -> None:
        """Unit ``key`` placed members or holds room in this cycle: its running members (a
        gang's, beside the new ones) are not victims in it, or the new ones would be left
        as a partial gang. One cycle never both places a gang and evicts it. A spare
        stands, discard or not: it is made only with a placement or a hold that is kept."""
        if key not in self.spared:
            self.spared.add(key)
            self._spared_order.append(key)

    def spared_since(self, n: int) -> list[str]:
        """The units spared after the first ``n``, in the order they were."""
        return self._spared_order[n:]

    def evict(self, unit: str, queue: QueueName | None, pods: Sequence[tuple[str, int, IntArray]]) -> None:
        """``pods`` (uid, node row, request) of running unit ``unit`` are victims: gone for
        this cycle's decisions, though they still terminate, and released from ``queue``."""
        assert not self._marks, "evictions are decided, never tried"
        total = np.zeros(self.used.shape[1], dtype=np.int64)
        for uid, row, req in pods:
            self.gone.add(uid, row, req)
            total += req
        if queue is not None:
            self.tree.release(queue, total)
        self.evicted[unit] = self.evicted.get(unit, 0) + len(pods)

    # -- the plan ---------------------------------------------------------------------------

    def record(self, key: str, result: UnitResult, *, keep_first: bool = False) -> None:
        """The plan's result for unit ``key`` (:meth:`Plan.record`)."""
        results = self.plan.results
        before = results.get(key)
        self.plan.record(key, result, keep_first=keep_first)
        if self._marks:

            def undo() -> None:
                if before is None:
                    del results[key]
                else:
                    results[key] = before

            self._log(undo)

    def _append(self, items: list[Any], item: Any) -> None:
        items.append(item)
        self._log(items.pop)

    def start(self, rows: Sequence[int], reqs: IntArray, pods: Sequence[Pod]) -> None:
        """Members placed on ``rows`` (``reqs[m]``, ``pods[m]``): bound now or nominated."""
        for m, (row, pod) in enumerate(zip(rows, pods, strict=True)):
            self._append(self.starting, (int(row), reqs[m], pod))

    def bind(self, binding: Binding) -> None:
        self._append(self.plan.bindings, binding)

    def nominate(self, nomination: Nomination) -> None:
        """A nomination alive after this cycle (new, or carried over)."""
        self._append(self.plan.nominations, nomination)

    def preempting(self, record: PreemptionRecord) -> None:
        self._append(self.plan.preemptions, record)

    def tell(self, pod: Unschedulable) -> None:
        """A pod that was not placed, and why."""
        self._append(self.plan.unschedulable, pod)

    def fail(
        self, unit: Unit, message: str, *, reason: str = "",
        status: UnitStatus = UnitStatus.UNSCHEDULABLE,
    ) -> None:
        """Record ``unit``'s result and tell its pods."""
        reason = reason or "Unschedulable"
        self.record(unit.key, UnitResult(status, reason, message))
        for pod in unit.pods:
            self.tell(Unschedulable(pod, message, unit.key, reason))
