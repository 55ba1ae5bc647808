"""What the cycle needs about queues, built from the mirror: :class:`QueueBook`.

The book mirrors the Queue objects, the namespaces' labels (for the
``batchsched.io/default-queue`` label) and the PodDisruptionBudgets, and keeps what lives
across cycles: the usage history of fair share (the nominations of preemptors waiting for
their victims to terminate are the caller's, passed in). Each cycle it builds the
:class:`~batchsched.core.cycle.QueueInput`:

- the queue tree over the snapshot's columns (uncharged: the cycle charges it);
- the queue of each pending unit (:func:`~batchsched.core.queues.assign_queue`): the pod's
  or PodGroup's label ``batchsched.io/queue``, a Volcano PodGroup's ``spec.queue``, the
  namespace's default-queue label, the configured default;
- the running units, lazily (only our pods: work of other schedulers is neither charged to
  a queue nor preempted): one per PodGroup with members holding resources, one per other
  pod; its queue (a running unit whose queue is gone counts as unqueued), priority, start
  (the earliest ``status.startTime``), which members are elastic extras (beyond
  ``minMember`` and every ``minTaskMember``, the last started first), and whether it is
  protected from eviction (a pod terminating, or a PodDisruptionBudget without room);
- the nominations still worth holding, as the caller's book of them found them
  (:class:`~batchsched.core.books.nominations.NominationBook`).

Pure, like the rest of :mod:`batchsched.core`: the time is passed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.disruption import DisruptionBook, DisruptionBudget
from batchsched.core.gangs import VOLCANO, GroupBook, GroupKey, PodGroup
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import Pod
from batchsched.core.nodehealth import NodeHealthSettings, lost_gpus, sick_rows
from batchsched.core.plan import (
    Nomination,
    Plan,
    QueueName,
    RunningUnit,
    Unit,
    UnitStatus,
)
from batchsched.core.queues.assign import QueueProblem, assign_queue
from batchsched.core.queues.fair import UsageHistory, queue_rank
from batchsched.core.queues.kueue import kueue_managed
from batchsched.core.queues.running import RunningBook
from batchsched.core.queues.spec import QUEUE_LABEL, StopPolicy
from batchsched.core.queues.tree import QueueTree

__all__ = ["QueueBook", "QueueInput", "QueueSettings"]

Running = Sequence[RunningUnit] | Callable[[], Sequence[RunningUnit]]
IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class QueueInput:
    """What the cycle needs to know about queues, running work and earlier preemptions.

    ``tree``: the valid queues over the snapshot's columns, *not* charged yet (the cycle
    charges ``running`` and the nominations to it, and keeps charging what it admits: after
    the cycle it holds the usage the queues' status reports). ``queue_of``: per pending unit
    key, its queue, a :class:`QueueProblem`, or None (unqueued; also for missing keys).
    ``running``: every running or assumed unit (each with its queue: a valid leaf or None),
    or a function giving them, called at most once (only when needed). ``now``: seconds,
    on the clock of the pods' creation and start times.
    """

    tree: QueueTree
    queue_of: Mapping[str, QueueName | QueueProblem | None] = field(default_factory=dict)
    running: Running = ()
    nominations: Sequence[Nomination] = ()
    now: float = 0.0
    history: UsageHistory | None = None
    max_wait: float | None = None
    preemption: bool = True
    #: victim searches per cycle at most; units beyond are retried in the next cycle
    max_searches: int = 64
    #: seconds of victim search per cycle at most; units beyond are retried in the next cycle
    max_search_seconds: float = 0.5
    #: the book ``running`` comes from, once called: each queue's summed running usage and
    #: which unit each pod is in (None: the cycle sums every unit itself)
    running_book: RunningBook | None = None
    #: whether a unit of these pods may evict others (None: every unit may)
    may_preempt: Callable[[Sequence[Pod]], bool] | None = None
    #: units handed over for a fair turn while they back off (:mod:`batchsched.core.requeue`):
    #: they take free capacity only, their victim search waits for their own try
    turns: frozenset[str] = frozenset()



@dataclass(slots=True, frozen=True)
class QueueSettings:
    """The configuration the book applies (see ``queues`` and ``preemption`` in the config)."""

    default_queue: str = ""
    #: aging bound of fair share (seconds); 0: none
    max_wait: float = 0.0
    #: usage history half-life (seconds); 0: no history
    history_half_life: float = 0.0
    history_weight: float = 1.0
    preemption: bool = True
    nomination_timeout: float = 300.0
    max_searches: int = 64
    max_search_seconds: float = 0.5
    #: pods Kueue manages (:mod:`batchsched.core.queues.kueue`) may be evicted by, and evict
    #: others through, batchsched's preemption (as unqueued work); off: Kueue decides
    kueue_preemptible: bool = False


@dataclass(slots=True)
class _Once:
    """The running units, built at most once per cycle, and kept for the queue status."""

    build: Callable[[], list[RunningUnit]]
    value: list[RunningUnit] | None = None

    def __call__(self) -> list[RunningUnit]:
        if self.value is None:
            self.value = self.build()
        return self.value


@dataclass(slots=True)
class _Waiting:
    queue: QueueName | QueueProblem | None
    keys: set[str] = field(default_factory=set)


class QueueBook:
    """Queues, namespace labels and disruption budgets (one writer)."""

    def __init__(self, settings: QueueSettings | None = None, *, node_health: NodeHealthSettings | None = None) -> None:
        self.settings = settings or QueueSettings()
        self.node_health = node_health or NodeHealthSettings()
        self.queue_objects: dict[str, Mapping[str, Any]] = {}
        self.namespaces: dict[str, Mapping[str, str]] = {}
        self.budgets = DisruptionBook()
        s = self.settings
        self.history = (
            UsageHistory(s.history_half_life, weight=s.history_weight) if s.history_half_life > 0 else None
        )
        #: bumps when something that decides a unit's queue changed (queues, namespace labels)
        self.generation = 0
        #: unit key -> its queue (or problem), for units that were not placed when last tried
        self.waiting: dict[str, QueueName | QueueProblem | None] = {}
        #: the running units of the last :meth:`prepare` (after the cycle ran)
        self.last_running: _Once | None = None
        self._running = RunningBook()
        #: the queue tree's structure (no usage), at a generation of the queues
        self._structure: tuple[int, QueueTree] | None = None
        #: the queue each reading of a unit's labels gives (:meth:`queue_of`), in one tree
        #: at one :attr:`generation`
        self._assigned: tuple[QueueTree | None, int, dict[tuple[str, str | None, str], QueueName | QueueProblem | None]] = (
            None, -1, {})
        #: the snapshot rows of nodes that take no GPU work, at a node generation
        self._sick: tuple[int, npt.NDArray[np.intp]] = (-1, np.zeros(0, dtype=np.intp))

    # -- mirror ----------------------------------------------------------------------------

    def queue_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        old = self.queue_objects.get(name)
        if kind == "DELETED":
            self.queue_objects.pop(name, None)
        else:
            self.queue_objects[name] = obj
        if kind == "DELETED" or old is None or old.get("spec") != obj.get("spec"):
            self.generation += 1

    def replace_queues(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.queue_objects = {str((o.get("metadata") or {}).get("name") or ""): o for o in items}
        self.generation += 1

    def namespace_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        if kind == "DELETED":
            if self.namespaces.pop(name, None) is not None:
                self.generation += 1
            return
        if self.namespaces.get(name) != labels:
            self.namespaces[name] = labels
            self.generation += 1

    def replace_namespaces(self, items: Iterable[Mapping[str, Any]]) -> None:
        fresh: dict[str, Mapping[str, str]] = {}
        for o in items:
            meta = o.get("metadata") or {}
            fresh[str(meta.get("name") or "")] = {
                str(k): str(v) for k, v in (meta.get("labels") or {}).items()
            }
        if fresh != self.namespaces:
            self.namespaces = fresh
            self.generation += 1

    def budget_event(self, kind: str, budget: DisruptionBudget) -> None:
        self.budgets.event(kind, budget)

    def replace_budgets(self, budgets: Iterable[DisruptionBudget]) -> None:
        self.budgets.replace(budgets)

    # -- building the cycle's input -----------------------------------------------------------

    def root_of(self, queue: str) -> str:
        """The top of the queue tree ``queue`` is in (the cohort whose quota it shares);
        the queue itself when it has no parent. Follows ``spec.parent`` as written."""
        seen = {queue}
        while True:
            spec = (self.queue_objects.get(queue) or {}).get("spec")
            parent = spec.get("parent") if isinstance(spec, Mapping) else None
            if not isinstance(parent, str) or not parent or parent in seen:
                return queue
            seen.add(parent)
            queue = parent

    def structure(self) -> QueueTree:
        """The valid queues' tree without resource columns (kept until the queues change)."""
        cached = self._structure
        if cached is None or cached[0] != self.generation:
            cached = self._structure = (self.generation, self.tree(()))
        return cached[1]

    def pod_queue_root(self, pod: Pod, group: PodGroup | None) -> str | None:
        """The top of the queue tree a running pod's usage is charged to (None: no queue)."""
        q = self.queue_of([pod], group, self.structure())
        return self.root_of(q) if isinstance(q, str) else None

    def draining(self) -> bool:
        """Whether any valid queue is stopped with ``HoldAndDrain``."""
        tree = self.structure()
        return any(tree.queue(n).stop is StopPolicy.HOLD_AND_DRAIN for n in tree.names)

    def tree(self, columns: Sequence[str]) -> QueueTree:
        return QueueTree.from_objects(self.queue_objects.values(), columns)

    def queue_of(
        self, pods: Sequence[Pod], group: PodGroup | None, tree: QueueTree
    ) -> QueueName | QueueProblem | None:
        if kueue_managed(pods):
            return None  # Kueue owns its quota: charged to none of ours
        if group is not None and group.labels.get(QUEUE_LABEL):
            named = group.labels[QUEUE_LABEL]
        else:
            named = next((name for p in pods if (name := p.labels.get(QUEUE_LABEL))), "")
        namespace = group.namespace if group is not None else (pods[0].namespace if pods else "")
        volcano = group.queue or None if group is not None and group.api == VOLCANO else None
        # what decides the queue is read above; the same reading gives the same queue in
        # one tree (thousands of units share a few): kept for the last tree asked about
        if self._assigned[0] is not tree or self._assigned[1] != self.generation:
            self._assigned = (tree, self.generation, {})
        key = (named, volcano, namespace)
        assigned = self._assigned[2]
        if key not in assigned:
            assigned[key] = assign_queue(
                labels={QUEUE_LABEL: named} if named else {}, podgroup_queue=volcano,
                namespace_labels=self.namespaces.get(namespace), default_queue=self.settings.default_queue or None,
                tree=tree,
            )
        return assigned[key]

    def prepare(
        self,
        *,
        state: ClusterState,
        groups: GroupBook,
        snap: Snapshot,
        units: Sequence[Unit],
        now: float,
        nominations: Sequence[Nomination] = (),
    ) -> QueueInput:
        """The cycle's queue input for ``units`` (``now``: wall-clock seconds), charging the
        ``nominations`` still worth holding."""
        tree = self.tree(snap.columns)
        if self._sick[0] != snap.node_generation:  # which nodes are sick changes with the nodes only
            self._sick = (snap.node_generation, sick_rows(self.node_health, snap.nodes))
        if len(self._sick[1]):  # (with every node healthy, nothing is withheld)
            tree.withhold(*lost_gpus(columns=snap.columns, sick=self._sick[1], alloc=snap.alloc, used=snap.used))
        queue_of: dict[str, QueueName | QueueProblem | None] = {}
        for u in units:
            if u.blocked:
                continue
            # even with no queue at all: work naming one is told it does not exist
            q = self.queue_of(u.pods, groups.groups.get(GroupKey(u.key)), tree)
            if q is not None:
                queue_of[u.key] = q
        running = _Once(lambda: self.running(state=state, groups=groups, snap=snap, tree=tree, now=now))
        self.last_running = running
        s = self.settings
        return QueueInput(
            tree=tree,
            queue_of=queue_of,
            running=running,
            nominations=tuple(nominations),
            now=now,
            history=self.history,
            max_wait=s.max_wait or None,
            preemption=s.preemption,
            max_searches=s.max_searches,
            max_search_seconds=s.max_search_seconds,
            running_book=self._running,
            may_preempt=self.may_preempt,
        )

    def ranks(
        self, asks: Mapping[object, tuple[str, Mapping[str, int]]], *, state: ClusterState, groups: GroupBook,
        snap: Snapshot, now: float,
    ) -> dict[object, tuple[QueueName, tuple[bool, float]]]:
        """For each ask (a unit's queue and request) in a valid leaf: the top of its queue's
        tree (its cohort) and its rank in the fair order
        (:func:`~batchsched.core.queues.fair.queue_rank`) from the running work as it is now
        (the usage the next cycle starts from, before nominations)."""
        tree = self.tree(snap.columns)
        self.running(state=state, groups=groups, snap=snap, tree=tree, now=now)  # the usage sums, up to date
        for q, summed in self._running.usage.items():
            if tree.leaf_problem(q) is None and summed.any():
                tree.admit(q, summed)
        columns = {c: i for i, c in enumerate(snap.columns)}
        out: dict[object, tuple[QueueName, tuple[bool, float]]] = {}
        for key, (leaf, need) in asks.items():
            if tree.leaf_problem(leaf) is None:
                req = np.zeros(len(snap.columns), dtype=np.int64)
                for name, value in need.items():
                    if name in columns:
                        req[columns[name]] = value
                queue = QueueName(leaf)
                out[key] = (tree.root(queue), queue_rank(tree, queue, req, now=now, history=self.history))
        return out

    def running(
        self,
        *,
        state: ClusterState,
        groups: GroupBook,
        snap: Snapshot,
        tree: QueueTree,
        now: float,
    ) -> list[RunningUnit]:
        """Every running or assumed unit of ours, as the cycle and preemption see it
        (kept up to date as pods are charged: :class:`~batchsched.core.queues.running.RunningBook`)."""
        basis = (
            snap.node_generation, len(snap.nodes), len(snap.columns), groups.version, self.generation,
            self.budgets.version, id(groups),
        )
        return self._running.get(
            state=state, groups=groups, snap=snap, tree=tree, now=now, basis=basis,
            queue_of=self.queue_of, protecting=self._protecting,
        )

    def _protecting(self, pods: Sequence[Pod]) -> str:
        """Why running ``pods`` may not be evicted at all ("" when they may)."""
        if not self.settings.kueue_preemptible and kueue_managed(pods):
            return explain.KUEUE_DECIDES
        return self.budgets.protecting(pods)

    def may_preempt(self, pods: Sequence[Pod]) -> bool:
        """Whether a unit of these pods may evict others to fit."""
        return self.settings.kueue_preemptible or not kueue_managed(pods)

    def settle(self, plan: Plan, queue_of: Mapping[str, QueueName | QueueProblem | None]) -> None:
        """After a cycle: which units wait in which queue."""
        results = plan.results
        for key in plan.tried:
            result = results.get(key)
            if result is not None and result.status is UnitStatus.SCHEDULED:
                self.waiting.pop(key, None)
            else:
                self.waiting[key] = queue_of.get(key)
        for key, result in results.items():
            if result.failed and key in queue_of:
                self.waiting[key] = queue_of[key]

    # -- status ----------------------------------------------------------------------------

    def statuses(self, tree: QueueTree, pending: Callable[[str], bool]) -> dict[str, dict[str, Any]]:
        """Each Queue's ``status`` from a charged tree (see :meth:`QueueTree.status`).

        ``pending(unit key)``: whether the unit still has pods waiting (forgotten if not).
        """
        for key in [k for k in self.waiting if not pending(k)]:
            del self.waiting[key]
        waiting: Counter[str] = Counter()
        misplaced: Counter[str] = Counter()
        for q in self.waiting.values():
            if isinstance(q, QueueProblem):
                if q.reason == "QueueNotLeaf":
                    misplaced[q.queue] += 1
            elif q is not None:
                waiting[q] += 1
        admitted: Counter[str] = Counter()
        running = self.last_running.value if self.last_running is not None else None
        for w in running or ():
            if w.queue is not None:
                admitted[w.queue] += 1
        return {
            name: tree.status(name, pending=waiting[name], admitted=admitted[name], misplaced=misplaced[name])
            for name in sorted(self.queue_objects)
            if name
        }
