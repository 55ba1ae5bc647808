"""A unit placed by a cycle, recorded on its statement.

Whether a unit was placed by the fair-order walk, as a nominee on the room it held, or
after a victim search found it fits with no victim, the same rule records it: the queue is
charged, each placed member becomes a :class:`~batchsched.core.plan.Binding` (with the GPU
cards it got), members that landed on room preempted pods still hold make the unit wait
with a nomination instead, and the extras left out are told why.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from batchsched.core import explain
from batchsched.core.devices import annotations_for
from batchsched.core.dra.book import DeviceCycle
from batchsched.core.mirror import Snapshot
from batchsched.core.model import Pod
from batchsched.core.placement.cards import assigned, held_cards
from batchsched.core.placement.layout import Layout, narrow
from batchsched.core.placement.topology import CLUSTER
from batchsched.core.placer import IntArray, Placer
from batchsched.core.plan import (
    Binding,
    ClaimWrite,
    Nomination,
    Unit,
    UnitResult,
    UnitStatus,
    Unschedulable,
)
from batchsched.core.queues import QueueName
from batchsched.core.statement import Statement

__all__ = ["Admission"]


class Admission:
    """Places units with ``placer`` and records those placed on ``st`` at ``now``."""

    def __init__(self, snap: Snapshot, now: float, st: Statement, placer: Placer,
                 devices: DeviceCycle | None = None) -> None:
        self.snap = snap
        self.now = now
        self.st = st
        self.placer = placer
        #: the cycle's use of DRA devices (None: no pod of the cycle has ResourceClaims)
        self.devices = devices
        #: why the last unit :meth:`admitted` refused was refused (its devices), and the
        #: member and node row where they could not be allocated
        self.refused = ""
        self.refused_at: tuple[int, int] | None = None

    def avoiding(self, lay: Layout) -> Layout | None:
        """``lay`` without the node where the last refused unit's devices could not be
        allocated (None when nothing was refused for its devices): placing it again there
        would fail the same way, while another node with free devices may not."""
        if self.refused_at is None:
            return None
        m, row = self.refused_at
        self.refused_at = None
        return lay.without(m, row)

    def place_on_free_room(self, q: QueueName | None, unit: Unit) -> bool:
        """Place ``unit`` (bound now) where no victim still terminates; nothing on failure.
        A preemptor whose victims only held quota (or whose room freed meanwhile) need not
        wait for them to go."""
        with self.st.victims_room_closed():
            return self.try_place(q, unit)

    def try_place(self, q: QueueName | None, unit: Unit) -> bool:
        """Place ``unit`` if quota and nodes allow, recording bindings; nothing on failure."""
        pods = unit.pods
        lay = self.placer.unit_layout(unit)
        if lay.reqs is None or any(p.invalid for p in pods[: max(1, unit.min_count)]):
            return False
        mc = 1 if unit.single else unit.min_count
        k = len(pods) if q is None else self.st.tree.admissible_prefix(q, lay.reqs, mc)
        if k == 0:
            return False
        out = np.full(k, -1, dtype=np.int64)
        placed, where = self.placer.place(unit, lay, k, mc, out)
        if placed == 0:
            return False
        return self.admitted(q, unit, lay, out, k, where)

    def admitted(
        self, q: QueueName | None, unit: Unit, lay: Layout, out: IntArray, k: int, where: str = ""
    ) -> bool:
        """Record the placed members of ``unit`` (``out``: node per member of the first
        ``k``; ``where``: the topology domain they are in, if any); extras that did not
        fit, or that quota refused, are told why.

        Members placed on capacity that preempted pods still hold (they are terminating)
        are not bound yet: the unit gets a nomination on those nodes instead. False (and
        nothing recorded, the kernel's usage taken back) when the members' ResourceClaims
        cannot all be allocated on their nodes: :attr:`refused` says why."""
        assert lay.reqs is not None
        st, placer = self.st, self.placer
        members = [m for m in range(k) if out[m] >= 0]
        rows = [int(out[m]) for m in members]
        claims = self._claims(unit, members, rows)
        if claims is None:
            st.unplace(rows, lay.reqs[members])
            return False
        st.spare(unit.key)
        st.start(rows, lay.reqs[members], [unit.pods[m] for m in members])
        if q is not None:
            st.admit(q, lay.reqs[members].sum(axis=0))
        waiting = st.gone.blocked_by(rows)
        if waiting:
            names = tuple(self.snap.nodes[r].name for r in rows)
            st.nominate(Nomination(
                unit=unit.key, queue=q, pods=tuple(unit.pods[m].uid for m in members), nodes=names,
                requests=tuple({**unit.pods[m].requests, **held_cards(lay.reqs[m], placer.arrays.device, self.snap.columns)}
                               for m in members),
                victims=frozenset(waiting), since=self.now, priority=unit.priority,
            ))
            st.record(unit.key, UnitResult(
                UnitStatus.WAITING, "WaitingForPreemption", explain.waiting_for_victims(len(waiting), names),
            ))
            return True
        st.record(unit.key, UnitResult(UnitStatus.SCHEDULED, "Scheduled", placed=len(members), where=where))
        domain = "" if where == CLUSTER else where
        level = unit.topology_level
        told = lay
        if domain and unit.topology_required and level is not None and not lay.domain and rows:
            # the extras left out were held to the gang's domain: explain them there
            told = narrow(lay, placer.domains(), level, rows[0]) or lay
        # read the cards now: explaining the others below runs the kernel on these rows
        cards = {m: assigned(unit.pods[m].card_asks, lay.reqs[m], placer.arrays.device)
                 for m in members if unit.pods[m].card_asks}
        for m, pod in enumerate(unit.pods):
            if m < k and out[m] >= 0:
                self._bind(unit, pod, int(out[m]), domain, cards.get(m), claims.get(m, ()))
                continue
            if pod.invalid:
                message = explain.invalid_pod(pod.key, pod.invalid)
            elif m >= k and q is not None:
                message = self.st.tree.admissible(q, lay.reqs[m]) or explain.QUEUE_FULL_ANY
            else:
                message = placer.explain_member(pod, told, m)
            st.tell(Unschedulable(pod, explain.elastic_member(message), unit.key))
        return True

    def _claims(self, unit: Unit, members: list[int], rows: list[int]) -> dict[int, tuple[ClaimWrite, ...]] | None:
        """The ResourceClaims of the placed members, allocated on their nodes in the cycle's
        device use (a discard of the statement gives them back); None, with
        :attr:`refused` set and nothing allocated, when one member's cannot be."""
        devices = self.devices
        if devices is None or not any(unit.pods[m].may_claim_devices for m in members):
            return {}
        got: dict[int, tuple[ClaimWrite, ...]] = {}
        for m, row in zip(members, rows, strict=True):
            pod = unit.pods[m]
            if not pod.may_claim_devices:
                continue
            node = self.snap.nodes[row].name
            writes = devices.allocate(pod, node)
            if isinstance(writes, str):
                for done in got.values():
                    devices.release(done)
                self.refused = explain.devices_refused(pod.key, node, writes)
                self.refused_at = (m, row)
                return None
            got[m] = writes
        for done in got.values():
            self.st.undoable(partial(devices.release, done))
        return got

    def _bind(self, unit: Unit, pod: Pod, row: int, where: str = "",
              cards: tuple[tuple[int, ...], ...] | None = None, claims: tuple[ClaimWrite, ...] = ()) -> None:
        self.placer.topo.add(pod, row)
        notes: tuple[tuple[str, str], ...] = ()
        labels: tuple[tuple[str, str], ...] = ()
        if cards is not None:
            a, lb = annotations_for(pod.card_asks, cards)
            notes, labels = tuple(sorted(a.items())), tuple(sorted(lb.items()))
        self.st.bind(Binding(
            pod.uid, pod.namespace, pod.name, self.snap.nodes[row].name, unit.key, where,
            cards=cards, annotations=notes, labels=labels, claims=claims,
        ))

    def place_quorum(self, q: QueueName | None, unit: Unit, lay: Layout) -> bool:
        """Place ``unit``'s quorum alone (a victim search found that it fits with no
        victim); nothing on failure."""
        mc = 1 if unit.single else unit.min_count
        out = np.full(len(unit.pods), -1, dtype=np.int64)
        placed, where = self.placer.place(unit, lay, mc, mc, out)
        if not placed:
            return False
        return self.admitted(q, unit, lay, out, mc, where)
