"""Metrics read off the session: per-queue gauges, GPU allocation, waits of bound pods.

The cheap ones are set after every step by the app; :func:`slow_gauges` walks every queue,
group and node and is called every few seconds at most.
"""

from __future__ import annotations

import numpy as np

from batchsched.core.devices import CARDS_ANY, card_columns_of
from batchsched.core.gangs import GroupKey
from batchsched.core.model import PodUID
from batchsched.core.plan import Binding
from batchsched.core.queues import QueueName, StopPolicy
from batchsched.core.session import Session
from batchsched.insight.views import amount
from batchsched.metrics import Metrics

__all__ = ["observe_bound", "slow_gauges"]

#: the label of work no queue holds
UNQUEUED = "(none)"


def slow_gauges(m: Metrics, session: Session) -> None:
    _queues(m, session)
    _cards(m, session)
    m.reservations.set(session.holding_count)
    m.suspended.set(sum(1 for g in session.groups.groups.values() if g.suspended))


def _queues(m: Metrics, session: Session) -> None:
    structure = session.queues.structure()
    _forget_queues(m, set(structure.names))
    charged = session.charged
    pending: dict[str, int] = {}
    for q in session.queues.waiting.values():
        if isinstance(q, str):
            pending[q] = pending.get(q, 0) + 1
    running = session.queues.last_running.value if session.queues.last_running is not None else None
    admitted: dict[str, int] = {}
    for unit in running or ():
        if unit.queue is not None:
            admitted[unit.queue] = admitted.get(unit.queue, 0) + 1
    for name in structure.names:
        m.queue_pending.labels(name).set(pending.get(name, 0))
        m.queue_admitted.labels(name).set(admitted.get(name, 0))
        m.queue_stopped.labels(name).set(0 if structure.stop_policy(name) is StopPolicy.NONE else 1)
        if charged is None or name not in charged.names:
            continue
        report = charged.report(name)
        for resource, nominal in report.nominal.items():
            m.queue_nominal.labels(name, resource).set(amount(resource, nominal) or 0.0)
            m.queue_used.labels(name, resource).set(amount(resource, report.used.get(resource, 0)) or 0.0)
            m.queue_borrowed.labels(name, resource).set(amount(resource, report.borrowed.get(resource, 0)) or 0.0)


def _forget_queues(m: Metrics, names: set[str]) -> None:
    """Drop the series of queues that are gone: a deleted queue would otherwise keep its
    last values on the dashboard (and in its queue list) for as long as the replica runs."""
    for gauge in (m.queue_pending, m.queue_admitted, m.queue_stopped, m.queue_nominal, m.queue_used,
                  m.queue_borrowed):
        for family in gauge.collect():
            for sample in family.samples:
                if sample.labels["queue"] not in names:
                    gauge.remove(*sample.labels.values())


def _cards(m: Metrics, session: Session) -> None:
    """Of all cards: the part held (all), cards held whole, and shares of cards held in part."""
    state = session.state
    col = {c: i for i, c in enumerate(state.columns)}
    pairs = card_columns_of(col)
    if not pairs:
        for kind in ("all", "whole", "shared"):
            m.gpu_allocation_ratio.labels(kind).set(0)
        return
    rows = np.flatnonzero(state.valid)
    compute = [c for c, _ in pairs]
    alloc = state.alloc[rows][:, compute].astype(np.float64)
    used = state.used[rows][:, compute].astype(np.float64)
    exists = alloc > 0
    cards = int(exists.sum())
    by_count = state.used[rows, col[CARDS_ANY]].sum() if CARDS_ANY in col else 0
    fraction = np.divide(used, alloc, out=np.zeros_like(used), where=exists)
    whole = int((fraction >= 1.0).sum()) + int(by_count)
    shared = float(fraction[(fraction > 0) & (fraction < 1.0)].sum())
    total = max(cards, 1)
    m.gpu_allocation_ratio.labels("whole").set(min(1.0, whole / total))
    m.gpu_allocation_ratio.labels("shared").set(shared / total)
    m.gpu_allocation_ratio.labels("all").set(min(1.0, (whole + shared) / total))


def observe_bound(m: Metrics, session: Session, b: Binding, now: float) -> None:
    """A pod was bound: its wait, by its queue and priority."""
    pod = session.state.pods.get(PodUID(b.uid))
    if pod is None or not pod.created:
        return
    group = session.groups.groups.get(GroupKey(b.unit))
    q = session.queues.queue_of([pod], group, session.queues.structure())
    queue = str(q) if isinstance(q, str) and q in session.queues.structure().names else UNQUEUED
    priority = session.groups.priority(group, [pod]) if group is not None else pod.priority
    m.wait.labels(QueueName(queue), str(priority)).observe(max(0.0, now - pod.created))
