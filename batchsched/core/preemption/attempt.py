"""Preemption inside a cycle: when a unit's quorum does not fit, try to make room for it.

The cycle hands a unit whose quorum does not fit (by quota or on the nodes) to
:meth:`CyclePreemption.preempt`. The running units it may evict (lower priority in its
queue, borrowers of its cohort, lower-priority unqueued work; never protected units, never
units that placed members or hold room in this cycle, such as a gang's new members beside
its running ones: :meth:`~batchsched.core.statement.Statement.spare`) go to
:func:`~batchsched.core.preemption.select_victims`, which checks room with the gang's
topology, so the room freed is room it can use. A preemption is recorded on the cycle's
:class:`~batchsched.core.statement.Statement`: the victims are evicted (gone from the
cycle's view), the quorum is charged to the nodes the search named, and a
:class:`~batchsched.core.plan.Nomination` is written; the unit is bound in a later cycle,
once its victims are gone. When the search finds that the quorum fits with no victim (room
an earlier preemption freed), the answer is :attr:`Verdict.FITS` and the cycle places it
as usual. A unit whose ``preemptionPolicy`` is ``Never`` (:attr:`Unit.never_preempts`) is
searched for like any other, but never evicts: it is told whom it would evict and waits.

Per cycle, failed searches are remembered by what decides them (cleared whenever capacity
is freed), and at most ``QueueInput.max_searches`` searches run, for at most
``QueueInput.max_search_seconds`` in all; units beyond are deferred to the next cycle.
This module acts on the statement and reads the snapshot, the layouts and the queue input;
it never calls the cycle.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.accounting import RunningWork
from batchsched.core.mirror import Snapshot
from batchsched.core.placement.cards import held_cards
from batchsched.core.placement.layout import Layout
from batchsched.core.placer import Placer
from batchsched.core.plan import (
    Nomination,
    PreemptionRecord,
    Unit,
    UnitResult,
    UnitStatus,
    Victim,
    VictimKind,
)
from batchsched.core.preemption.candidates import Candidates
from batchsched.core.preemption.victims import (
    NoPreemption,
    Offers,
    PieceCache,
    Preemptor,
    select_victims,
)
from batchsched.core.queues import QueueInput, QueueName, WithinQueuePolicy
from batchsched.core.statement import Statement

__all__ = ["CyclePreemption", "Verdict"]

IntArray = npt.NDArray[np.int64]


class Verdict(enum.Enum):
    """What :meth:`CyclePreemption.preempt` decided."""

    #: victims were chosen: the unit holds a nomination (or, never preempting, waits)
    PREEMPTED = "preempted"
    #: the quorum fits with no victim: the caller places it as usual
    FITS = "fits"
    #: no preemption: the unit is told why (the accompanying text; empty when no search ran)
    NONE = "none"


class CyclePreemption:
    """The preemption state of one cycle: the candidates (built when first needed) and
    their pieces (:class:`~batchsched.core.preemption.victims.PieceCache`), the failed searches, the number of searches and the time spent. ``placer`` lays out and
    places (read here only for the victim search's room check); ``running``: the running
    work, loaded when first needed."""

    def __init__(
        self, qi: QueueInput, snap: Snapshot, st: Statement, placer: Placer, running: RunningWork,
        offers: Offers | None = None,
    ) -> None:
        self.qi = qi
        self.snap = snap
        self.st = st
        self.placer = placer
        self.running = running
        self.candidates: Candidates | None = None
        #: the candidates' pieces, shared by the cycle's searches
        self.pieces = PieceCache(qi.running_book, offers)
        self.searches = 0
        self.time = 0.0
        #: failed victim searches of this cycle, by what decides them
        self.memo: dict[tuple[Any, ...], str] = {}
        #: how many of the statement's spared units :attr:`candidates` left out so far
        self._spared = 0

    def _candidates(self) -> Candidates:
        """The candidates, without the units the statement spared so far."""
        st = self.st
        if self.candidates is None:
            self.candidates = Candidates(self.running.units(), st.tree, st.spared)
            self._spared = len(st.spared)
        for key in st.spared_since(self._spared):
            self.candidates.spare(key)
            self._spared += 1
        return self.candidates

    def preempt(self, q: QueueName | None, unit: Unit, lay: Layout) -> tuple[Verdict, str]:
        """Try to make room for ``unit``'s quorum by evicting others: ``(verdict, why)``,
        where ``why`` (for the unit's message, with :attr:`Verdict.NONE`) is empty when no
        search was made (nobody it may preempt)."""
        qi = self.qi
        if not qi.preemption or lay.reqs is None:
            return Verdict.NONE, ""
        if qi.may_preempt is not None and not qi.may_preempt(unit.pods):
            return Verdict.NONE, ""  # its admission is another's to decide (Kueue)
        if unit.key in qi.turns:
            return Verdict.NONE, ""  # a fair turn takes free capacity; it searches at its own try
        if not self._candidates().by_queue:
            return Verdict.NONE, ""  # nothing runs that anyone may evict
        mc = 1 if unit.single else unit.min_count
        sigs = np.unique(lay.sig[:mc])
        if not bool(lay.masks[sigs].any(axis=1).all()):
            return Verdict.NONE, ""  # some member of the quorum may go on no node at all
        t0 = time.perf_counter()
        try:
            return self._search(q, unit, lay, mc)
        finally:
            self.time += time.perf_counter() - t0

    def _search(self, q: QueueName | None, unit: Unit, lay: Layout, mc: int) -> tuple[Verdict, str]:
        assert lay.reqs is not None and self.candidates is not None
        qi, st = self.qi, self.st
        policy = st.tree.queue(q).within_queue if q is not None else None
        memo_key: tuple[Any, ...] = (
            q, unit.priority, mc, lay.reqs[:mc].tobytes(), lay.sig[:mc].tobytes(),
            tuple(p.constraint_key() for p in unit.pods[:mc]),
            (unit.created, unit.arrival, unit.uid) if policy is WithinQueuePolicy.LOWER_OR_NEWER_EQUAL_PRIORITY else None,
            unit.topology_level, unit.topology_required, lay.domain, unit.never_preempts,
        )
        seen = self.memo.get(memo_key)
        if seen is not None:
            return Verdict.NONE, seen
        x = lay.reqs[:mc].sum(axis=0)
        cands = self.candidates.for_unit(q, unit.priority, x)
        if not cands:
            return Verdict.NONE, ""
        if self.searches >= qi.max_searches or self.time >= qi.max_search_seconds:
            st.plan.deferred.add(unit.key)
            return Verdict.NONE, ""
        self.searches += 1
        preemptor = Preemptor(
            key=unit.key, queue=q, priority=unit.priority, created=unit.created, uid=unit.uid,
            reqs=np.ascontiguousarray(lay.reqs), sig=lay.sig, masks=lay.masks,
            static_score=lay.static, min_count=mc, name=unit.display, arrival=unit.arrival,
        )
        result = select_victims(
            preemptor, cands, alloc=self.snap.alloc, used=st.used, tree=st.tree,
            scoring=self.placer.arrays, now=qi.now, place=self.placer.placer(unit), cache=self.pieces,
        )
        if isinstance(result, NoPreemption):
            why = result.reason
            self.memo[memo_key] = why
            return Verdict.NONE, why
        if result.victims and unit.never_preempts:
            why = _never(result.victims)
            self.memo[memo_key] = why
            return Verdict.NONE, why
        self.memo.clear()  # capacity was freed: earlier failures may not hold any more
        if not result.victims:  # it fits after all (room freed by an earlier preemption)
            return Verdict.FITS, ""
        self._apply(q, unit, lay, mc, result.victims, result.nodes, result.placed)
        return Verdict.PREEMPTED, ""

    def _apply(
        self, q: QueueName | None, unit: Unit, lay: Layout, mc: int,
        victims: Sequence[Victim], nodes: Sequence[int], placed: IntArray | None = None,
    ) -> None:
        """Evict ``victims`` for the quorum, held on ``nodes`` (``placed``: its rows as the
        search placed them there, GPU cards included)."""
        assert lay.reqs is not None and self.candidates is not None
        st, snap = self.st, self.snap
        for v in victims:
            st.evict(v.unit.key, v.unit.queue, [(pod.uid, pod.node, pod.req) for pod in v.pods])
            self.candidates.remove(v)
            self.pieces.forget(v.unit)
        st.spare(unit.key)
        self._candidates()
        core = lay.reqs[:mc] if placed is None else placed
        st.charge(q, list(nodes), core, 1)
        names = tuple(snap.nodes[n].name for n in nodes)
        messages = tuple(_victim_message(unit, q, names, v) for v in victims)
        npods = sum(len(v.pods) for v in victims)
        summary = explain.preempting(npods, (v.unit.key.rsplit(":", 1)[-1] for v in victims), mc, names)
        st.preempting(PreemptionRecord(unit, q, names, tuple(victims), messages, summary))
        st.nominate(Nomination(
            unit=unit.key, queue=q, pods=tuple(p.uid for p in unit.pods[:mc]), nodes=names,
            requests=tuple({**p.requests, **held_cards(core[m], self.placer.arrays.device, snap.columns)}
                           for m, p in enumerate(unit.pods[:mc])),
            victims=frozenset(p.uid for v in victims for p in v.pods), since=self.qi.now,
            priority=unit.priority,
        ))
        st.record(unit.key, UnitResult(UnitStatus.PREEMPTING, "Preempting", summary))


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
