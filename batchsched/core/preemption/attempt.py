"""Preemption inside a cycle: when a unit's quorum does not fit, try to make room for it.

The cycle's walk (:mod:`batchsched.core.cycle`) hands a unit whose quorum does not fit (by
quota or on the nodes) to :meth:`CyclePreemption.preempt`. The running units it may evict
(lower priority in its queue, borrowers of its cohort, lower-priority unqueued work; never
protected units, never units admitted in this cycle: :class:`Candidates`) go to
:func:`~batchsched.core.preemption.select_victims`, which checks room with the gang's
topology, so the room freed is room it can use. A preemption removes the victims from the
cycle's view, charges the quorum to the nodes the search named and records a
:class:`~batchsched.core.plan.Nomination`; the unit is bound in a later cycle, once its
victims are gone. A unit whose ``preemptionPolicy`` is ``Never`` (:attr:`Unit.never_preempts`)
is searched for like any other, but never evicts: it is told whom it would evict and waits.

Per cycle, failed searches are remembered by what decides them (cleared whenever capacity
is freed), and at most ``QueueInput.max_searches`` searches run, for at most
``QueueInput.max_search_seconds`` in all; units beyond are deferred
to the next cycle. The walk is reached through the :class:`Walk` protocol: this module
does not import the cycle.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.mirror import Snapshot
from batchsched.core.placement.cards import held_cards
from batchsched.core.placement.layout import Layout
from batchsched.core.placement.scoring import ScoringArrays
from batchsched.core.placement.topology import PlaceMembers
from batchsched.core.plan import (
    Nomination,
    Plan,
    PreemptionRecord,
    RunningUnit,
    Unit,
    UnitResult,
    UnitStatus,
    Victim,
    VictimKind,
)
from batchsched.core.preemption.candidates import Candidates
from batchsched.core.preemption.nominations import Terminating
from batchsched.core.preemption.victims import NoPreemption, Preemptor, select_victims
from batchsched.core.queues import QueueInput, QueueName, QueueTree, WithinQueuePolicy

__all__ = ["CyclePreemption", "Walk"]

IntArray = npt.NDArray[np.int64]


class Walk(Protocol):
    """What preemption uses of the cycle's walk: its view (the snapshot, the working usage,
    the charged queue tree, the plan being written) and the steps it shares with it."""

    @property
    def snap(self) -> Snapshot: ...
    @property
    def qi(self) -> QueueInput: ...
    @property
    def tree(self) -> QueueTree: ...
    @property
    def plan(self) -> Plan: ...
    @property
    def used(self) -> IntArray: ...
    @property
    def arrays(self) -> ScoringArrays: ...
    @property
    def gone(self) -> Terminating:
        """The victims still terminating (in this cycle's preemptions too)."""

    def load_running(self) -> list[RunningUnit]:
        """The running units (victims of earlier preemptions left out), charged to the tree."""
        ...

    def place(self, unit: Unit, lay: Layout, k: int, mc: int, out: IntArray) -> tuple[int, str]:
        """Place the first ``k`` members, the first ``mc`` all or none: (placed, where)."""
        ...

    def admitted(
        self, q: QueueName | None, unit: Unit, lay: Layout, out: IntArray, k: int, where: str = ""
    ) -> None:
        """Record the placed members of ``unit``."""
        ...


    def charge(self, queue: QueueName | None, rows: Sequence[int], reqs: IntArray, sign: int) -> None:
        """Charge (``sign`` 1) or release (-1) ``reqs`` on ``rows`` and to ``queue``."""
        ...

    def placer(self, unit: Unit) -> PlaceMembers:
        """The placement the victim search checks room with for ``unit``."""
        ...


class CyclePreemption:
    """The preemption state of one cycle: the candidates (built when first needed), the
    failed searches, the number of searches and the time spent."""

    def __init__(self, walk: Walk) -> None:
        self.walk = walk
        self.candidates: Candidates | None = None
        self.searches = 0
        self.time = 0.0
        #: failed victim searches of this cycle, by what decides them
        self.memo: dict[tuple[Any, ...], str] = {}

    def preempt(self, q: QueueName | None, unit: Unit, lay: Layout) -> tuple[bool, str]:
        """Try to make room for ``unit``'s quorum by evicting others. ``(True, "")`` when a
        preemption was decided; else ``(False, why)``, where ``why`` (for the unit's
        message) is empty when no search was made (nobody it may preempt)."""
        walk = self.walk
        if not walk.qi.preemption or lay.reqs is None:
            return False, ""
        if walk.qi.may_preempt is not None and not walk.qi.may_preempt(unit.pods):
            return False, ""  # its admission is another's to decide (Kueue)
        if unit.key in walk.qi.turns:
            return False, ""  # a fair turn takes free capacity; it searches at its own try
        if self.candidates is None:
            self.candidates = Candidates(walk.load_running(), walk.tree)
        if not self.candidates.by_queue:
            return False, ""  # nothing runs that anyone may evict
        mc = 1 if unit.single else unit.min_count
        sigs = np.unique(lay.sig[:mc])
        if not bool(lay.masks[sigs].any(axis=1).all()):
            return False, ""  # some member of the quorum may go on no node at all
        t0 = time.perf_counter()
        try:
            return self._search(q, unit, lay, mc)
        finally:
            self.time += time.perf_counter() - t0

    def _search(self, q: QueueName | None, unit: Unit, lay: Layout, mc: int) -> tuple[bool, str]:
        assert lay.reqs is not None and self.candidates is not None
        walk = self.walk
        qi = walk.qi
        policy = walk.tree.queue(q).within_queue if q is not None else None
        memo_key: tuple[Any, ...] = (
            q, unit.priority, mc, lay.reqs[:mc].tobytes(), lay.sig[:mc].tobytes(),
            tuple(p.constraint_key() for p in unit.pods[:mc]),
            (unit.created, unit.arrival, unit.uid) if policy is WithinQueuePolicy.LOWER_OR_NEWER_EQUAL_PRIORITY else None,
            unit.topology_level, unit.topology_required, lay.domain, unit.never_preempts,
        )
        seen = self.memo.get(memo_key)
        if seen is not None:
            return False, seen
        x = lay.reqs[:mc].sum(axis=0)
        cands = self.candidates.for_unit(q, unit.priority, x)
        if not cands:
            return False, ""
        if self.searches >= qi.max_searches or self.time >= qi.max_search_seconds:
            walk.plan.deferred.add(unit.key)
            return False, ""
        self.searches += 1
        preemptor = Preemptor(
            key=unit.key, queue=q, priority=unit.priority, created=unit.created, uid=unit.uid,
            reqs=np.ascontiguousarray(lay.reqs), sig=lay.sig, masks=lay.masks,
            static_score=lay.static, min_count=mc, name=unit.display, arrival=unit.arrival,
        )
        result = select_victims(
            preemptor, cands, alloc=walk.snap.alloc, used=walk.used, tree=walk.tree,
            scoring=walk.arrays, now=qi.now, place=walk.placer(unit),
        )
        if isinstance(result, NoPreemption):
            why = result.reason
            self.memo[memo_key] = why
            return False, why
        if result.victims and unit.never_preempts:
            why = _never(result.victims)
            self.memo[memo_key] = why
            return False, why
        self.memo.clear()  # capacity was freed: earlier failures may not hold any more
        if not result.victims:  # it fits after all (room freed by an earlier preemption)
            out = np.full(len(unit.pods), -1, dtype=np.int64)
            placed, where = walk.place(unit, lay, mc, mc, out)
            if placed:
                walk.admitted(q, unit, lay, out, mc, where)
                return True, ""
            return False, ""
        self._apply(q, unit, lay, mc, result.victims, result.nodes, result.placed)
        return True, ""

    def _apply(
        self, q: QueueName | None, unit: Unit, lay: Layout, mc: int,
        victims: Sequence[Victim], nodes: Sequence[int], placed: IntArray | None = None,
    ) -> None:
        """Evict ``victims`` for the quorum, held on ``nodes`` (``placed``: its rows as the
        search placed them there, GPU cards included)."""
        assert lay.reqs is not None and self.candidates is not None
        walk = self.walk
        plan = walk.plan
        width = len(walk.snap.columns)
        for v in victims:
            total = np.zeros(width, dtype=np.int64)
            for pod in v.pods:
                walk.gone.add(pod.uid, pod.node, pod.req)
                total += pod.req
            if v.unit.queue is not None:
                walk.tree.release(v.unit.queue, total)
            self.candidates.remove(v)
        core = lay.reqs[:mc] if placed is None else placed
        walk.charge(q, list(nodes), core, 1)
        names = tuple(walk.snap.nodes[n].name for n in nodes)
        messages = tuple(_victim_message(unit, q, names, v) for v in victims)
        npods = sum(len(v.pods) for v in victims)
        summary = explain.preempting(npods, (v.unit.key.rsplit(":", 1)[-1] for v in victims), mc, names)
        plan.preemptions.append(PreemptionRecord(unit, q, names, tuple(victims), messages, summary))
        plan.nominations.append(Nomination(
            unit=unit.key, queue=q, pods=tuple(p.uid for p in unit.pods[:mc]), nodes=names,
            requests=tuple({**p.requests, **held_cards(core[m], walk.arrays.device, walk.snap.columns)}
                           for m, p in enumerate(unit.pods[:mc])),
            victims=frozenset(p.uid for v in victims for p in v.pods), since=walk.qi.now,
            priority=unit.priority,
        ))
        plan.record(unit.key, UnitResult(UnitStatus.PREEMPTING, "Preempting", summary))


def _never(victims: Sequence[Victim]) -> str:
    """What a unit with ``preemptionPolicy: Never`` is told when the search found victims:
    it evicts none of them (kube-scheduler's rule: such a pod never evicts anyone, so it
    reclaims no quota either) and waits, ahead of lower priorities in its queue."""
    return explain.never_preempts(
        sum(len(v.pods) for v in victims), (v.unit.key.rsplit(":", 1)[-1] for v in victims),
        reclaim=any(v.kind is VictimKind.RECLAIM for v in victims),
    )


def _victim_message(unit: Unit, q: QueueName | None, nodes: Sequence[str], v: Victim) -> str:
    """What a victim's pods and group are told (Event and DisruptionTarget condition)."""
    return explain.preempted(
        preemptor=unit.display, priority=unit.priority, nodes=nodes,
        reclaim_for=q if v.kind is VictimKind.RECLAIM else None, borrowed=v.borrowed,
        victim_priority=v.unit.priority, victim_queue=v.unit.queue,
        extras=None if v.whole else len(v.pods),
    )
