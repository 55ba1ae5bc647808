"""The running units, kept as pods are charged and uncharged: :class:`RunningBook`.

Every cycle that may preempt or charge queues needs every running (or assumed) unit of
ours: one per PodGroup with members holding resources, one per other pod, with its queue,
priority, start, elastic members and protection (see :mod:`batchsched.core.queues.book`).
A busy cluster changes a few of them per step, so the book reads the mirror's charge feed
(:meth:`~batchsched.core.mirror.ClusterState.watch_charges`) and rebuilds only the units
whose members changed. Anything else a unit is built from (the nodes, the PodGroups and
priority classes, the queues and namespace labels, the disruption budgets) changes seldom;
then every unit is built anew. The queues' running usage is kept the same way, as a sum
per queue, and so is what each unit holds as preemption weighs it (:class:`Held`: all of
it, or its elastic extras alone, with their summed requests), asked for by the victim
search of every cycle and the same until the unit's members change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedDict

from batchsched.core.devices import GPU_SHARES, MILLI
from batchsched.core.gangs import ANNOTATION_TASK, GroupBook, PodGroup
from batchsched.core.gangs.status import natural
from batchsched.core.mirror import ChargeReader, ClusterState, Snapshot, to_width
from batchsched.core.model import GPU, Pod, PodUID
from batchsched.core.plan import QueueName, RunningPod, RunningUnit
from batchsched.core.queues.assign import QueueProblem
from batchsched.core.queues.tree import QueueTree

__all__ = ["Held", "RunningBook", "held", "natural"]

IntArray = npt.NDArray[np.int64]
Member = tuple[Pod, int, IntArray]
QueueOf = Callable[[Sequence[Pod], PodGroup | None, QueueTree], QueueName | QueueProblem | None]
Protecting = Callable[[Sequence[Pod]], str]

@dataclass(slots=True, frozen=True)
class Held:
    """Pods of one running unit that may be evicted together (all of them, or its elastic
    extras alone), with what they hold: what a victim search weighs of them, whoever asks."""

    pods: tuple[RunningPod, ...]
    whole: bool
    vec: IntArray
    """Their summed requests (read only)."""
    gpus: float
    """The GPU cards they hold."""
    positive: frozenset[int]
    """The columns ``vec`` asks for (more than zero)."""


def held(w: RunningUnit, width: int) -> tuple[Held, ...]:
    """``w`` whole, then its elastic extras alone when it has some and other pods."""
    options: list[tuple[tuple[RunningPod, ...], bool]] = [(w.pods, True)]
    extras = tuple(pod for pod in w.pods if pod.elastic)
    if extras and len(extras) < len(w.pods):
        options.append((extras, False))
    out: list[Held] = []
    for pods, whole in options:
        if len(pods) == 1:
            vec = pods[0].req  # read only
        else:
            vec = np.zeros(width, dtype=np.int64)
            for pod in pods:
                vec += pod.req
        gpus = sum(pod.gpus for pod in pods)
        out.append(Held(pods, whole, vec, gpus, frozenset(np.flatnonzero(vec > 0).tolist())))
    return tuple(out)


class RunningBook:
    """The running units of one mirror, by unit key, each queue's running usage, and what
    each unit holds (:meth:`held`)."""

    def __init__(self) -> None:
        #: the mirror's charge feed, read anew when what every unit is built from besides
        #: its members changes (the nodes, the PodGroups and priority classes, the queues
        #: and namespace labels, the disruption budgets): then every unit is built anew
        self._charges = ChargeReader()
        self.units: SortedDict = SortedDict()
        self._members: dict[str, dict[PodUID, Member]] = {}
        self._unit_of: dict[PodUID, str] = {}
        #: queue -> the summed requests of its running units
        self.usage: dict[QueueName, IntArray] = {}
        #: unit key -> the unit and what it holds (:meth:`held`)
        self._held: dict[str, tuple[RunningUnit, tuple[Held, ...]]] = {}

    def get(
        self, *, state: ClusterState, groups: GroupBook, snap: Snapshot, tree: QueueTree, now: float,
        basis: tuple[Any, ...], queue_of: QueueOf, protecting: Protecting,
    ) -> list[RunningUnit]:
        """Every running unit, in key order, up to date with the mirror."""
        rows: dict[str, int] = {n.name: i for i, n in enumerate(snap.nodes)}
        width = len(snap.columns)
        changed = self._charges.read(state, basis)
        dirty: set[str] = set()
        if changed is None:
            self.units.clear()
            self._members.clear()
            self._unit_of.clear()
            self.usage.clear()
            self._held.clear()
            for uid in state.charges:
                self._place(uid, state, groups, rows, width)
        else:
            for uid in changed:
                old = self._unit_of.pop(uid, None)
                if old is not None:
                    self._members[old].pop(uid, None)
                    dirty.add(old)
                key = self._place(uid, state, groups, rows, width)
                if key is not None:
                    dirty.add(key)
        build = _Builder(snap, groups, tree, now, queue_of, protecting)
        if changed is None:  # every unit anew: sorted once, not inserted one by one
            built = {key: build(key, list(members.values()), self._group_of(groups, members))
                     for key, members in self._members.items()}
            self.units.update(built)  # (cleared above)
            for unit in built.values():
                self._count(unit, 1)
            return list(self.units.values())
        for key in dirty:
            self._held.pop(key, None)
            old_unit = self.units.pop(key, None)
            if old_unit is not None:
                self._count(old_unit, -1)
            members = self._members.get(key)
            if not members:
                self._members.pop(key, None)
                continue
            unit = build(key, list(members.values()), self._group_of(groups, members))
            self.units[key] = unit
            self._count(unit, 1)
        return list(self.units.values())

    def _place(self, uid: PodUID, state: ClusterState, groups: GroupBook, rows: dict[str, int],
               width: int) -> str | None:
        """File a charged pod of ours under its unit; None when it is not one."""
        charged = state.charges.get(uid)
        pod = state.pods.get(uid)
        if charged is None or pod is None or not state.ours(pod):
            return None
        node, vec = charged
        row = rows.get(node)
        if row is None:
            return None
        group = groups.group_of(uid)
        key = group.key if group is not None else pod.key
        vec = to_width(vec, width)
        self._members.setdefault(key, {})[uid] = (pod, row, vec)
        self._unit_of[uid] = key
        return key

    def held(self, w: RunningUnit, width: int) -> tuple[Held, ...] | None:
        """What ``w`` holds (:func:`held`), kept while the book keeps ``w`` (the victim
        searches of every step ask for it, and a unit changes only when its members do);
        None when ``w`` is not the book's (a unit of a cycle's own making)."""
        if self.units.get(w.key) is not w:
            return None
        hit = self._held.get(w.key)
        if hit is not None and hit[0] is w:
            return hit[1]
        out = held(w, width)
        self._held[w.key] = (w, out)
        return out

    def unit_of(self, uid: str) -> RunningUnit | None:
        """The running unit a pod is a member of."""
        key = self._unit_of.get(PodUID(uid))
        return None if key is None else self.units.get(key)

    def position(self, key: str) -> int:
        """Where the unit ``key`` is in :meth:`get`'s list."""
        return int(self.units.index(key))

    @staticmethod
    def _group_of(groups: GroupBook, members: dict[PodUID, Member]) -> PodGroup | None:
        return groups.group_of(next(iter(members)))

    def _count(self, unit: RunningUnit, sign: int) -> None:
        if unit.queue is None or not unit.pods:
            return
        total = self.usage.get(unit.queue)
        if total is None:
            total = self.usage[unit.queue] = np.zeros(len(unit.pods[0].req), dtype=np.int64)
        for p in unit.pods:
            total += sign * p.req


class _Builder:
    """Builds one running unit from its members (see the module docstring)."""

    def __init__(self, snap: Snapshot, groups: GroupBook, tree: QueueTree, now: float,
                 queue_of: QueueOf, protecting: Protecting) -> None:
        self.groups = groups
        self.tree = tree
        self.now = now
        self.queue_of = queue_of
        self.protecting = protecting
        self.gpu = snap.columns.index(GPU) if GPU in snap.columns else -1
        self.shares = snap.columns.index(GPU_SHARES) if GPU_SHARES in snap.columns else -1

    def __call__(self, key: str, members: list[Member], group: PodGroup | None) -> RunningUnit:
        pods = [m[0] for m in members]
        q = self.queue_of(pods, group, self.tree)
        queue = q if isinstance(q, str) else None
        elastic = _elastic(pods, group)
        protected = "terminating" if any([p.deleting for p in pods]) else self.protecting(pods)
        start = min([p.started for p in pods if p.started], default=self.now)
        ordered = members if len(members) == 1 else sorted(members, key=lambda m: (m[0].created, natural(m[0].name)))
        running_pods = tuple([
            RunningPod(uid=pod.uid, node=row, req=vec, gpus=_cards(vec, self.gpu, self.shares),
                       elastic=pod.uid in elastic)
            for pod, row, vec in ordered
        ])
        if group is not None:
            priority = self.groups.priority(group, pods)
            created, unit_uid, arrival = group.created, group.uid or key, group.arrival
        else:
            priority, created, unit_uid = pods[0].priority, pods[0].created, str(pods[0].uid)
            arrival = pods[0].arrival
        return RunningUnit(
            key=key, queue=queue, priority=priority, created=created, uid=unit_uid, start=start,
            pods=running_pods, protected=protected, arrival=arrival,
        )


def _elastic(pods: Sequence[Pod], group: PodGroup | None) -> set[str]:
    """The members beyond the group's quorum (``minMember`` and each task's minimum),
    the last started first."""
    if group is None or group.invalid or len(pods) <= group.min_member:
        return set()
    tasks = Counter(p.annotations.get(ANNOTATION_TASK, "") for p in pods)
    out: set[str] = set()
    taken: Counter[str] = Counter()
    newest_first = sorted(pods, key=lambda p: (p.started, p.created, natural(p.name)), reverse=True)
    for pod in newest_first:
        if len(pods) - len(out) <= group.min_member:
            break
        task = pod.annotations.get(ANNOTATION_TASK, "")
        if tasks[task] - taken[task] <= group.min_task_member.get(task, 0):
            continue
        out.add(pod.uid)
        taken[task] += 1
    return out


def _cards(vec: Any, gpu: int, shares: int) -> float:
    """The GPU cards a pod holds: its card compute (shares count their fraction), or its
    ``nvidia.com/gpu`` count for a pod the device model does not know."""
    if shares >= 0 and vec[shares] > 0:
        return float(vec[shares]) / MILLI
    return float(vec[gpu]) if gpu >= 0 else 0.0
