"""The gangs a scheduler's first walk is handed: the heads of each queue.

After a start over a large backlog, building the unit of every waiting gang (its members
counted, ordered and classed) costs more than the first walk, which stops at its first
placement (:attr:`~batchsched.core.settings.SessionSettings.first_walk_budget`). So the
first step builds, of each queue, only the gangs its order puts first (``per_queue`` of
them); the place of the last one built is the queue's *limit*, and the fair order ends as
soon as a queue's next unit would come after its limit (:class:`~batchsched.core.queues.FairOrder`,
``limits``): which queue goes next then depends on a gang that was not built. Every unit
the walk tries before that comes, in its queue, before every gang left out, so the walk is
the beginning of the walk over everything; the next step, at once, builds every gang and
takes the walk up.

Classes of single pods are handed over the same way, their first ``per_queue`` members
each (:func:`single_place` gives the limit where a class is cut).

A gang's place is read without building its unit: its priority, creation, arrival and UID
as its unit has them (:func:`~batchsched.core.queues.fair.within_order`), its queue from its
PodGroup and members' labels. Left out of the first step, and told at the next: gangs held
back (suspended, backing off, short of members: not placed whatever their place) and gangs
whose queue is unknown or unusable. Gangs whose members name different queues are always
built (their queue depends on their members' order, known only once built).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from batchsched.core.gangs import GroupBook, PodGroup
from batchsched.core.gangs.units import blocked_reason
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Pod
from batchsched.core.plan import QueueName
from batchsched.core.queues.assign import QueueProblem
from batchsched.core.queues.book import QueueBook
from batchsched.core.queues.fair import Place, within_order
from batchsched.core.queues.spec import QUEUE_LABEL
from batchsched.core.queues.tree import QueueTree

__all__ = ["Heads", "first_heads", "narrowed", "single_place"]


@dataclass(frozen=True, slots=True)
class Heads:
    """The gangs to build (their keys) and each queue's limit (None: unqueued work)."""

    keys: frozenset[str] = frozenset()
    limits: Mapping[QueueName | None, Place] = field(default_factory=dict)


def first_heads(
    groups: GroupBook, state: ClusterState, queues: QueueBook, tree: QueueTree, *, now: float, per_queue: int,
    want: Callable[[str], bool],
) -> Heads:
    """Of the waiting gangs ``want(key)`` says, the first ``per_queue`` of each queue (and
    those always built), with the limits of the queues that have more."""
    lines: dict[QueueName | None, list[tuple[Place, str]]] = {}
    keys: set[str] = set()
    for group in groups.waiting(state, want):
        t = groups.tally(group, state)
        pods = t.schedulable
        if not pods or blocked_reason(group, t, now, groups.timers)[0]:
            continue
        if _queues_differ(group, pods):
            keys.add(group.key)
            continue
        q = queues.queue_of(pods, group, tree)
        if isinstance(q, QueueProblem):
            continue
        place = _place(queues, now, groups.priority(group, pods), group.created, group.arrival, group.uid or group.key)
        lines.setdefault(q, []).append((place, group.key))
    limits: dict[QueueName | None, Place] = {}
    for q, line in lines.items():
        if len(line) > per_queue:
            line = heapq.nsmallest(per_queue, line)
            limits[q] = line[-1][0]
        keys.update(key for _, key in line)
    return Heads(frozenset(keys), limits)


def _queues_differ(group: PodGroup, pods: Sequence[Pod]) -> bool:
    """Whether the members name different queues (and their PodGroup none)."""
    if group.labels.get(QUEUE_LABEL):
        return False
    named = {p.labels.get(QUEUE_LABEL) for p in pods}
    named.discard(None)
    named.discard("")
    return len(named) > 1


def single_place(pod: Pod, queues: QueueBook, tree: QueueTree, now: float) -> tuple[QueueName | None, Place] | None:
    """The queue and place of a single pod; None when its queue is unknown or unusable
    (refused whatever its place)."""
    q = queues.queue_of((pod,), None, tree)
    if isinstance(q, QueueProblem):
        return None
    return q, _place(queues, now, pod.priority, pod.created, pod.arrival, pod.uid)


def _place(queues: QueueBook, now: float, priority: int, created: float, arrival: int, uid: str) -> Place:
    """A unit's place in its queue at ``now``, aged as the queues' ``maxWait`` says."""
    max_wait = queues.settings.max_wait or None
    return within_order(priority, created, arrival, uid, aged=max_wait is not None and now - created > max_wait)


def narrowed(limits: Mapping[QueueName | None, Place], queue: QueueName | None,
             place: Place) -> dict[QueueName | None, Place]:
    """``limits`` with ``queue``'s the earlier of its own and ``place``."""
    out = dict(limits)
    if queue not in out or place < out[queue]:
        out[queue] = place
    return out
