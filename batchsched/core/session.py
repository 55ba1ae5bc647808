"""The scheduling session: everything batchsched decides, pure and synchronous.

A :class:`Session` owns the mirror of the cluster (:class:`~batchsched.core.mirror.ClusterState`),
the gang and queue books, the cycle, and what lives between cycles: when each unit last
failed (so it is not retried before something changed), when a blocked gang was first
seen (its pods are told after a delay), the capacity held for preemptors and who to tell
about it. Its whole interface:

- **event intake**: ``on_pod``, ``on_node``, ``on_podgroup``, ``on_queue``,
  ``on_namespace``, ``on_budget``, ``on_priority_class`` (and ``*_listed`` for a full
  list), with the object already parsed;
- **a step**: :meth:`Session.step` ``(now) ->`` :class:`Decisions` (binds, evictions,
  pod conditions, Events, PodGroup and Queue statuses, pods to read again);
- **result intake**: :meth:`Session.on_bind_result`, :meth:`Session.on_evict_result`,
  each returning the Decisions it leads to at once (Events, resyncs).

Time comes in as an argument (seconds on the clock of the objects' timestamps); nothing
here reads a clock, a socket or a global, so the running scheduler, the tests and a
replay on a virtual clock drive the same policy. :attr:`Session.wants_step` says whether
an event gave a reason to run a step now (the shell sleeps until it does, or until the
slow retry timer).

A step, in order: pods assumed bound but never confirmed are read again -> gang timers
(evict gangs stuck below quorum) -> nominations that expired -> the units worth trying
(each unit that failed is skipped until capacity changes or the retry interval passes)
-> the cycle -> assume each binding -> Events and evictions of the preemptions ->
conditions of the pods that were not placed -> PodGroup statuses of the groups that
changed -> Queue statuses (at most every few seconds). After each step the mirror's
invariants are checked (:meth:`Session.check`); a broken one raises, and the process
stops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

from batchsched.core import explain
from batchsched.core.cycle import Cycle
from batchsched.core.decisions import (
    Decisions,
    EventNote,
    PodCondition,
    PodScheduledNote,
    group_ref,
    pod_ref,
)
from batchsched.core.devices import stale_keys
from batchsched.core.disruption import DisruptionBudget
from batchsched.core.equivalence import (
    ClassKey,
    SingleIndex,
    arrival_order,
    fit_count,
    gang_like,
    own_class,
    pod_class,
    unit_class,
)
from batchsched.core.gangs import (
    GroupBook,
    GroupKey,
    PodGroup,
)
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import Arrivals, Node, Pod, PodUID, Term
from batchsched.core.nodehealth import tolerating_health, with_health
from batchsched.core.placement.topology import (
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
)
from batchsched.core.plan import (
    Binding,
    Eviction,
    ObjectRef,
    Plan,
    Unit,
    UnitResult,
    UnitStatus,
    VictimKind,
    single_unit,
)
from batchsched.core.preemption import Room, restored_nominations
from batchsched.core.queues import (
    QUEUE_LABEL,
    QueueBook,
    QueueInput,
    QueueTree,
    StopPolicy,
)
from batchsched.core.reporting import GroupReports
from batchsched.core.requeue import WaitBook
from batchsched.core.reservation import RESERVED
from batchsched.core.runtimes import RunTimes, like_key
from batchsched.core.settings import SessionSettings
from batchsched.core.volumes import VolumeBook, VolumeClaim

__all__ = ["Session", "SessionSettings"]

#: how often the gang timers are looked at
GANG_CHECK_SECONDS = 0.5
#: (preemptor, victim group) pairs told are kept up to this many (the rest, of preemptions
#: no longer held, are dropped when it is passed)
TOLD_GROUPS_KEPT = 4096
#: how often the mirror's usage is recomputed from every charge to check it
FULL_CHECK_SECONDS = 60.0
#: pods that share another unit's outcome (the rest of a class) are told a new message
#: for the same reason at most this often (a new reason at once)
SHARED_REFRESH_SECONDS = 60.0


def _spec(group: PodGroup) -> tuple[Any, ...]:
    """What of a group decides its placement (its status, which we write, does not)."""
    return (
        group.min_member, dict(group.min_resources), dict(group.min_task_member),
        group.priority_class, group.invalid, group.uid, group.queue, group.labels.get(QUEUE_LABEL),
        group.annotations.get(TOPOLOGY_ANNOTATION), group.annotations.get(TOPOLOGY_PREFERRED_ANNOTATION),
    )


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _closing(namespace: Mapping[str, Any]) -> bool:
    """Whether a Namespace is being deleted (it takes no new content, Bindings included)."""
    status = namespace.get("status") or {}
    return bool((namespace.get("metadata") or {}).get("deletionTimestamp")) or status.get("phase") == "Terminating"


def _smallest(unit: Unit) -> dict[str, int]:
    """What one node must have free for the gang's smallest member (each resource)."""
    need: dict[str, int] = {}
    for i, pod in enumerate(unit.pods):
        for name, value in pod.requests.items():
            need[name] = value if i == 0 else min(need.get(name, 0), value)
        if i:
            for name in [n for n in need if n not in pod.requests]:
                need[name] = 0
    return need


def _quorum(unit: Unit) -> dict[str, int]:
    """What a unit's quorum asks for in all (a single pod's request)."""
    total: dict[str, int] = {}
    for pod in unit.pods[: max(unit.min_count, 1)]:
        for name, value in pod.requests.items():
            total[name] = total.get(name, 0) + value
    return total


def _once(make: Callable[[], Snapshot]) -> Callable[[], Snapshot]:
    """``make()`` on the first call, the same value after."""
    held: list[Snapshot] = []

    def get() -> Snapshot:
        if not held:
            held.append(make())
        return held[0]

    return get


def _failed_with(plan: Plan, key: str, message: str) -> bool:
    """Whether ``key`` failed in ``plan`` with ``message`` (the gang's own message, not an
    elastic extra's)."""
    result = plan.results.get(key)
    return result is not None and result.failed and result.message == message


class Session:
    """One scheduler's decisions. Single writer: call it from one thread (the event loop)."""

    def __init__(self, settings: SessionSettings | None = None, *, use_jit: bool = True) -> None:
        s = self.settings = settings or SessionSettings()
        self.state = ClusterState(s.scheduler_names)
        self.cycle = Cycle(s.scoring, levels=s.levels, use_jit=use_jit, reservation=s.reservation, cards=s.cards)
        self.groups = GroupBook(
            default_timeout=s.gang_default_timeout, initial_backoff=s.gang_initial_backoff,
            max_backoff=s.gang_max_backoff, levels=s.levels, whole_job_restart=s.gang_whole_job_restart,
        )
        self.queues = QueueBook(s.queues, node_health=s.node_health)
        self.volumes = VolumeBook()
        self.reports = GroupReports(self.groups, s.levels)
        #: pending pods with claims, as parsed (their claims are applied again on a change)
        self._claiming: dict[PodUID, Pod] = {}
        self.cycles = 0
        self.wants_step = False
        #: the pending single pods by equivalence class
        self.singles = SingleIndex()
        #: the last arrival number given to a pod whose resourceVersion is not an integer
        #: each pod's place in line among those created in the same second
        self._arrivals = Arrivals()
        #: classes of single pods (``("class", key)``) and gangs (by unit key) that failed,
        #: asleep until an event could make them fit (:mod:`batchsched.core.requeue`)
        self.waits = WaitBook()
        self._node_generation = -1
        #: the queue trees whose usage fell since the last step (a charged pod went)
        self._freed_roots: set[str] = set()
        #: units that held a reservation or a nomination after the last cycle
        self._holders: set[str] = set()
        #: classes of single pods whose first member held a reservation after the last cycle
        self._holder_classes: set[Any] = set()
        #: class key -> the (reason, message, when) its members not handed over were told
        self._class_told: dict[Any, tuple[str, str, float]] = {}
        #: gang members' classes, by UID, with the version of the pod they were computed for
        self._member_classes: dict[PodUID, tuple[Pod, Any]] = {}
        self._member_keys: dict[Any, Any] = {}
        #: gang key -> its class across gangs, order, smallest member's request, quorum
        #: (kept while it sleeps: of a class woken together only the first few are built)
        self._gang_class: dict[str, tuple[Any, tuple[int, float, int, str], Mapping[str, int], int]] = {}
        #: class -> the gangs of it left out of this step's cycle
        self._gang_cut: dict[Any, list[str]] = {}
        #: this step's class of each gang handed over
        self._step_classes: dict[str, Any] = {}
        #: units handed over for a fair turn in this step, and their classes of single pods
        #: (:mod:`batchsched.core.requeue`): they take free capacity only, and failing they
        #: are told nothing new (their regular try, with its victim search, tells them)
        self._turned: set[str] = set()
        self._turned_classes: set[Any] = set()
        #: classes of single pods cut short in this step: how many members were handed over
        self._cut: dict[Any, tuple[float, int, str]] = {}
        #: pending pod -> the (reason, message) of the PodScheduled condition it was last
        #: told, and when it was last told a shared one
        self._told: dict[PodUID, tuple[str, str, float]] = {}
        #: pods that joined a sleeping class after it was told why: told at the next step
        self._joined: set[PodUID] = set()
        self._assumed_at: dict[PodUID, float] = {}
        #: assumed pods whose Binding's outcome is in doubt, held until read again
        self._in_doubt: set[PodUID] = set()
        #: stale card assignments whose removal was asked for, and when
        self._cleanup_at: dict[PodUID, float] = {}
        #: preemptor unit key -> the objects its Events go to
        self._preemptor_refs: dict[str, list[ObjectRef]] = {}
        #: (preemptor, victim unit) pairs already told on the victim's group
        self._told_groups: set[tuple[str, str]] = set()
        #: group unit key -> when it was first found blocked (its pods are told after a delay)
        self._blocked_since: dict[str, float] = {}
        self._last_gang_check = -1e18
        self._last_hold_check = -1e18
        self._last_queue_status = -1e18
        self._last_full_check = -1e18
        #: nominations were rebuilt from the pods' nominatedNodeName (first step after a start)
        self._restored = False
        #: Events decided on intake, written with the next step's decisions
        self._notes: list[EventNote] = []
        #: node -> its unreadable allocatable last told
        self._unreadable_told: dict[str, dict[str, str]] = {}
        #: the queue tree as last charged (by a cycle, or for the Queue statuses): what the
        #: queue views read; None before the first
        self.charged: QueueTree | None = None
        #: how long pods like a given one ran (start-time estimates read it)
        self.runtimes = RunTimes()
        #: pods seen to succeed since the last step: (like key, start), timed at the step
        self._succeeded: list[tuple[str, float]] = []
        #: pods evicted because their gang is suspended, their queue drained or their node's
        #: GPU health says evict
        self._held_evicting: set[PodUID] = set()
        #: nodes whose GPU health label says: evict what runs there
        self._health_evict: set[str] = set()

    # -- event intake ------------------------------------------------------------------------

    def on_nodes_listed(self, nodes: Iterable[Node]) -> None:
        health = self.settings.node_health
        nodes = [with_health(n, health) for n in nodes]
        self._health_evict = {n.name for n in nodes if health.evicts(n)}
        self.state.replace_nodes(nodes)
        for node in nodes:
            self._tell_unreadable(node)
        self.wants_step = True

    def _tell_unreadable(self, node: Node) -> None:
        """A node whose allocatable cannot be read is told once per change: those
        resources are treated as absent (unusable), the rest of the node is used."""
        told = self._unreadable_told.get(node.name)
        if not node.unreadable:
            self._unreadable_told.pop(node.name, None)
            return
        if told == node.unreadable:
            return
        self._unreadable_told[node.name] = dict(node.unreadable)
        ref = ObjectRef(kind="Node", api_version="v1", namespace="", name=node.name, uid=node.uid)
        self._notes.append(EventNote(ref, "Warning", "UnreadableAllocatable", explain.unreadable_allocatable(
            node.name, node.unreadable,
        )))

    def on_node(self, kind: str, node: Node) -> None:
        node = with_health(node, self.settings.node_health)
        if kind != "DELETED" and self.settings.node_health.evicts(node):
            self._health_evict.add(node.name)
        else:
            self._health_evict.discard(node.name)
        if kind == "DELETED":
            self._unreadable_told.pop(node.name, None)
        else:
            self._tell_unreadable(node)
        before = self.state.capacity_generation
        self.state.node_event(kind, node)
        if self.state.capacity_generation != before:
            self.wants_step = True

    def on_pods_listed(self, pods: list[Pod]) -> None:
        self._claiming.clear()
        health = self.settings.node_health
        pods = [self._with_volumes("ADDED", tolerating_health(self._arrived(p), health)) for p in pods]
        self.state.replace_pods(pods)
        self.groups.replace_pods(pods)
        read = self.singles.read
        self.singles.clear()
        for pod in pods:
            self.singles.reads(pod)
        if self.singles.read != read:
            self._classes_keyed_anew()
        self._told.clear()
        for uid in self.state.pending:
            self._sync(uid)
        self.reports.dirty.update(self.groups.groups)
        self.wants_step = True

    def _sync(self, uid: PodUID) -> None:
        """Keep the pod's place in the class index: pending, not gated, not in a gang."""
        pod = self.state.pending.get(uid)
        alone = pod is not None and not pod.gated and not self.groups.in_group(uid)
        before = self.singles.class_of(uid)
        self.singles.put(uid, pod if alone else None)
        if pod is None:
            self._told.pop(uid, None)
        after = self.singles.class_of(uid)
        if after is not None and after != before and after in self._class_told:
            self._joined.add(uid)

    def _with_volumes(self, kind: str, pod: Pod) -> Pod:
        """A pending pod with volume or resource claims, as its claims let it be placed
        (:mod:`batchsched.core.volumes`); the pod as parsed is kept to look at again."""
        if kind == "DELETED" or pod.node_name or not (pod.claims or pod.resource_claims):
            self._claiming.pop(pod.uid, None)
            return pod
        self._claiming[pod.uid] = pod
        return self.volumes.apply(pod)

    def _claims_changed(self, keys: set[tuple[str, str]]) -> None:
        """Claims, volumes or classes changed: the pending pods using them, again."""
        for pod in list(self._claiming.values()):
            if any((pod.namespace, name) in keys for name in pod.claims):
                self.on_pod("MODIFIED", pod)

    def on_claims_listed(self, claims: list[VolumeClaim]) -> None:
        self._claims_changed(self.volumes.replace_claims(claims))

    def on_claim(self, kind: str, claim: VolumeClaim) -> None:
        self._claims_changed(self.volumes.claim_event(kind, claim))

    def on_volumes_listed(self, volumes: list[tuple[str, tuple[Term, ...] | None]]) -> None:
        self._claims_changed(self.volumes.replace_volumes(volumes))

    def on_volume(self, kind: str, volume: tuple[str, tuple[Term, ...] | None]) -> None:
        self._claims_changed(self.volumes.volume_event(kind, *volume))

    def on_storage_classes_listed(self, classes: list[tuple[str, str]]) -> None:
        self._claims_changed(self.volumes.replace_classes(classes))

    def on_storage_class(self, kind: str, storage_class: tuple[str, str]) -> None:
        self._claims_changed(self.volumes.class_event(kind, *storage_class))

    def _arrived(self, pod: Pod) -> Pod:
        """``pod`` with its place in line (:class:`~batchsched.core.model.Arrivals`)."""
        return self._arrivals.first_seen(pod, self.state.pods.get(pod.uid))

    def _classes_keyed_anew(self) -> None:
        """The label keys other pods' anti-affinity reads grew (or were listed afresh): the
        classes of gang members and of gangs are found anew, every class is awake."""
        self._member_classes.clear()
        self._member_keys.clear()
        for key in list(self._gang_class):
            self._forget_gang(key)
        self.wants_step = True

    def on_pod(self, kind: str, pod: Pod) -> None:
        pod = self._with_volumes(kind, tolerating_health(self._arrived(pod), self.settings.node_health))
        if kind != "DELETED" and self.singles.reads(pod):
            self._classes_keyed_anew()
        state = self.state
        before = state.capacity_generation
        was_pending = state.pending.get(pod.uid)
        charged = pod.uid in state.charges
        group = self.groups.group_of(pod.uid)
        state.pod_event(kind, pod)
        if charged and pod.uid not in state.charges:
            old = state.pods.get(pod.uid, pod)
            root = self.queues.pod_queue_root(old, group)
            if root is not None:
                self._freed_roots.add(root)
            if pod.phase == "Succeeded" and pod.started:
                self._succeeded.append((like_key(pod, group.key if group is not None else None), pod.started))
        if kind == "DELETED" or not pod.holds_resources:
            self._held_evicting.discard(pod.uid)
        self.groups.pod_event(kind, pod)
        if kind != "DELETED" and pod.holds_resources:
            self.groups.confirmed(pod, state)
        if group is not None and group.from_pods and group.key not in self.groups.groups:
            self.reports.changed(group, spec=True, deleted=True)  # its last member left
        self._sync(pod.uid)
        pending = pod.uid in state.pending
        now_group = self.groups.group_of(pod.uid)
        # a member arrived, left, or changed what placement reads: the gang is tried again
        # (not for a change of its status, such as the condition we wrote)
        changed = (
            kind == "DELETED" or was_pending is None or not pending or group is not now_group
            or pod_class(was_pending, self.singles.read) != pod_class(state.pending[pod.uid], self.singles.read)
        )
        for g in (group, now_group):
            if g is not None:
                self.reports.dirty.add(g.key)
                if pending and changed:
                    self._forget_gang(g.key)
                    self.wants_step = True
        if kind == "DELETED" or pod.holds_resources or pod.terminal:
            self._assumed_at.pop(pod.uid, None)
            self._in_doubt.discard(pod.uid)
            self._member_classes.pop(pod.uid, None)
            if was_pending is not None and (pod.key in self._holders or (group is not None and group.key in self._holders)):
                self.waits.wake_all()  # what it held for itself is free to take
                self.wants_step = True
        if state.capacity_generation != before or (pod.uid in state.stale and pod.uid not in self._cleanup_at):
            self.wants_step = True
        elif (pending and was_pending is None) or (was_pending is not None and pending and was_pending is not state.pending[pod.uid]):
            # new or changed: worth a step unless its class sleeps (it would fail alike)
            ckey = self.singles.class_of(pod.uid)
            if own_class(ckey):
                self.waits.forget(("class", ckey))  # a class of its own: any change may matter
            if ckey is not None and ("class", ckey) not in self.waits:
                self.wants_step = True  # (a gang's member was handled above; a gated pod waits)

    def on_groups_listed(self, api: str, groups: list[PodGroup]) -> set[GroupKey]:
        """A full list of one API's PodGroups; returns the keys of those that are gone."""
        gone = {k for k, g in self.groups.groups.items() if g.api == api} - {g.key for g in groups}
        self.groups.replace_groups(api, groups)
        self.reports.dirty.update(g.key for g in groups)
        for g in groups:
            self._forget_gang(g.key)
        self.wants_step = True
        return gone

    def on_podgroup(self, kind: str, group: PodGroup) -> None:
        old = self.groups.groups.get(group.key)
        self.groups.group_event(kind, group)
        spec = old is None or _spec(old) != _spec(group)
        if kind == "DELETED" and group.key in self._holders:
            self.waits.wake_all()
        if kind == "DELETED" or spec:
            self._forget_gang(group.key)
            self.wants_step = True
        self.reports.changed(group, spec=spec, deleted=kind == "DELETED")

    def _queues_changed(self, before: int) -> None:
        """Which queue a unit goes to, or whether it fits its quota, may have changed."""
        if self.queues.generation != before:
            self.waits.forget_all()
            self._last_queue_status = -1e18
            self.wants_step = True

    def on_queues_listed(self, items: Sequence[Mapping[str, Any]]) -> set[str]:
        """A full list of the Queues; returns the names of those that are gone."""
        before = self.queues.generation
        gone = set(self.queues.queue_objects) - {str(o["metadata"]["name"]) for o in items}
        self.queues.replace_queues(items)
        self._queues_changed(before)
        return gone

    def on_queue(self, kind: str, obj: Mapping[str, Any]) -> None:
        before = self.queues.generation
        self.queues.queue_event(kind, obj)
        self._queues_changed(before)

    def on_namespaces_listed(self, items: Sequence[Mapping[str, Any]]) -> None:
        before = self.queues.generation
        self.queues.replace_namespaces(items)
        self._queues_changed(before)
        self._close_namespaces({_name(o) for o in items if _closing(o)})

    def on_namespace(self, kind: str, obj: Mapping[str, Any]) -> None:
        before = self.queues.generation
        self.queues.namespace_event(kind, obj)
        self._queues_changed(before)
        name = _name(obj)
        closed = self.state.closed_namespaces - {name}
        self._close_namespaces(closed | {name} if kind != "DELETED" and _closing(obj) else closed)

    def _close_namespaces(self, closed: Set[str]) -> None:
        """The namespaces being deleted are ``closed``: the pods of those newly closed are no
        longer pending (the apiserver would refuse their Bindings), and any reopened (a
        namespace recreated under its name) are looked at again."""
        changed = closed ^ self.state.closed_namespaces
        if not changed:
            return
        self.state.closed_namespaces = frozenset(closed)
        for uid, pod in list(self.state.pods.items()):
            if pod.namespace in changed and not pod.node_name:
                self.on_pod("MODIFIED", self._claiming.get(uid, pod))

    def on_budgets_listed(self, budgets: Iterable[DisruptionBudget]) -> None:
        self.queues.replace_budgets(budgets)

    def on_budget(self, kind: str, budget: DisruptionBudget) -> None:
        old = self.queues.budgets.get(budget.namespace, budget.name)
        self.queues.budget_event(kind, budget)
        if old is not None and old.allowed == 0 and (kind == "DELETED" or budget.allowed > 0):
            # work it protected may be preempted now: look at waiting units again
            self.waits.forget_all()
            self.wants_step = True

    def on_priority_classes_listed(self, classes: Mapping[str, int], never: Iterable[str] = ()) -> None:
        """``never``: the classes whose ``preemptionPolicy`` is ``Never``."""
        before, before_never = self.groups.priority_classes, self.groups.never_classes
        self.groups.replace_priority_classes(classes, never)
        changed = {n for n in before.keys() | classes.keys() if before.get(n) != classes.get(n)}
        self._priorities_changed(changed | (before_never ^ self.groups.never_classes))

    def on_priority_class(self, kind: str, name: str, value: int, never: bool = False) -> None:
        self.groups.priority_class_event(kind, name, value, never)
        self._priorities_changed({name})

    def _priorities_changed(self, names: Set[str]) -> None:
        """The gangs whose PodGroup names one of these PriorityClasses have a new priority
        or preemption policy (a pod's are fixed at its admission): tried again at once, they
        may now preempt or go first."""
        for group in self.groups.groups.values():
            if group.priority_class in names:
                self._forget_gang(group.key)
                self.wants_step = True

    # -- result intake -------------------------------------------------------------------------

    def on_bind_result(self, b: Binding, outcome: str, *, now: float, error: str = "") -> Decisions:
        """``outcome``: bound; conflict (the pod changed under us: read it again); unknown
        (no answer: the Binding may have landed); gone (the pod is no more); failed
        (refused, ``error`` says why: the pod is told); fenced (not sent).

        After a conflict or an unknown outcome the pod stays charged to the node it was
        given until it has been read again (:meth:`on_pod_read`): a Binding whose answer
        was lost with its connection (an apiserver killed mid-request) may have landed, and
        a pod bound where we cannot see it must not have its room handed to another.
        """
        out = Decisions()
        uid = PodUID(b.uid)
        if outcome == "bound":
            if self.settings.scheduled_events:
                out.scheduled.append(PodScheduledNote(pod_ref(b), b.node, b.where))
            return out
        if outcome in ("conflict", "unknown") and uid in self.state.assumed:
            self._in_doubt.add(uid)
            self._assumed_at[uid] = now
            out.resyncs.append(pod_ref(b))
            return out
        self._not_bound(uid, now=now, back_off=outcome in ("failed", "unknown"))
        if outcome == "conflict":
            out.resyncs.append(pod_ref(b))
        pod = self.state.pending.get(uid)
        if outcome == "failed" and pod is not None:
            # it backs off before it is placed again: it says why meanwhile
            self._tell(out, pod, "BindingRejected", explain.binding_refused(b.node, error))
        return out

    def on_pod_read(self, uid: PodUID, *, now: float) -> Decisions:
        """A pod whose binding was in doubt has been read again (and fed to :meth:`on_pod`):
        still unbound, its binding did not happen."""
        out = Decisions()
        if uid not in self._in_doubt:
            return out
        self._in_doubt.discard(uid)
        pod = self.state.pods.get(uid)
        if uid in self.state.assumed and pod is not None and not pod.node_name:
            self._not_bound(uid, now=now, back_off=True)
        return out

    def _not_bound(self, uid: PodUID, *, now: float, back_off: bool) -> None:
        """A pod handed to the binder is not bound: pending again, its gang tried again."""
        self._assumed_at.pop(uid, None)
        self._in_doubt.discard(uid)
        self.state.forget(uid)
        self.groups.touch(uid)
        self._sync(uid)
        group = self.groups.group_of(uid)
        if group is not None:
            # the rest of the gang is retried as its remainder at once
            self._forget_gang(group.key)
            self.reports.dirty.add(group.key)
        if back_off:
            # refused (a namespace being deleted...) or unanswered: its class waits out a
            # back-off instead of being bound again, and failing again, at once
            ckey = self.singles.class_of(uid)
            pod = self.state.pending.get(uid)
            if ckey is not None and pod is not None:
                self.waits.sleep(("class", ckey), now, pod.requests)
                self.waits.wake(("class", ckey))
        self.wants_step = True

    def on_evict_result(self, e: Eviction, outcome: str, *, error: str = "") -> Decisions:
        """``outcome``: evicted, gone (nothing left to evict), blocked (a disruption budget
        refused), failed (``error`` says why)."""
        if e.preemptor:
            return self._preemption_result(e, outcome, error)
        out = Decisions()
        key = GroupKey(e.unit)
        group = self.groups.groups.get(key)
        self.reports.dirty.add(key)
        if outcome != "evicted":
            self.groups.eviction_done(key, PodUID(e.uid))
        if group is None:
            return out
        ref = group_ref(group)
        if outcome == "evicted":
            message = explain.member_evicted(e.name, e.node, e.reason)
            out.events.append(EventNote(ref, "Normal", "GangEvicted", message))
            out.events.append(EventNote(pod_ref(e), "Normal", "GangEvicted", message))
        elif outcome == "failed":
            message = explain.member_eviction_failed(e.name, error)
            out.events.append(EventNote(ref, "Warning", "GangEvictionFailed", message))
        return out

    def _preemption_result(self, e: Eviction, outcome: str, error: str) -> Decisions:
        """A victim's eviction: tell who preempted it, or give the preemption up."""
        out = Decisions()
        victim = pod_ref(e)
        group = self.groups.groups.get(GroupKey(e.unit))
        if outcome == "evicted":
            out.events.append(EventNote(victim, "Normal", "Preempted", e.reason))
            if group is not None and (e.preemptor, e.unit) not in self._told_groups:
                self._told_groups.add((e.preemptor, e.unit))
                out.events.append(EventNote(group_ref(group), "Normal", "Preempted", e.reason))
            return out
        if outcome == "gone":
            return out  # nothing left to evict: the capacity is free
        dropped = self.queues.drop(e.preemptor)
        message = explain.preemption_blocked(
            f"{e.namespace}/{e.name}", budget=outcome == "blocked", error=error,
        )
        if dropped is not None:
            for ref in self._preemptor_refs.get(e.preemptor, []):
                out.events.append(EventNote(ref, "Warning", "PreemptionBlocked", message))
            self._clear_nominated(dropped.pods, out)
        out.events.append(EventNote(victim, "Normal", "PreemptionBlocked", message))
        # try again: the unit may find other victims, or the same once the budget allows
        for uid in dropped.pods if dropped is not None else ():
            ckey = self.singles.class_of(PodUID(uid))
            if ckey is not None:
                self.waits.forget(("class", ckey))
        self._forget_gang(e.preemptor)
        self.wants_step = True
        return out

    # -- a step ----------------------------------------------------------------------------------

    def step(self, now: float) -> Decisions:
        """Everything due at ``now``: one cycle and the writes that follow it."""
        self.wants_step = False
        for key, started in self._succeeded:
            self.runtimes.record(key, now - started)
        self._succeeded.clear()
        out = Decisions()
        out.events.extend(self._notes)
        self._notes.clear()
        self._check_assumed(now, out)
        self._clean_stale(now, out)
        self._check_gangs(now, out)
        self._hold_running(now, out)
        self._run_cycle(now, out)
        self.reports.statuses(
            self.state, now, lambda: Room(self.state, self.groups, self.queues, _once(self.state.snapshot), now),
            out,
        )
        self._sync_queues(now, out)
        self.check(now)
        return out

    def check(self, now: float) -> None:
        """The mirror's invariants (raises :class:`~batchsched.core.mirror.StateError`):
        its books after every step, the usage recomputed from every charge at most every
        :data:`FULL_CHECK_SECONDS` (it costs a pass over every running pod)."""
        self.state.check_books()
        if now - self._last_full_check >= FULL_CHECK_SECONDS:
            self._last_full_check = now
            self.state.check()
            self.waits.prune(self._still_waiting)
            self._gang_class = {k: v for k, v in self._gang_class.items() if k in self.waits}
            live = {id(v[1]) for v in self._member_classes.values()}
            self._member_keys = {k: v for k, v in self._member_keys.items() if id(v) in live}

    def _quota_root(self, key: str, plan: Plan) -> str | None:
        """For a unit its queue's quota held back: the top of that queue's tree (whose
        usage falling wakes it); None when quota did not hold it back."""
        if key not in plan.quota_blocked:
            return None
        q = self.queues.waiting.get(key)
        return self.queues.root_of(q) if isinstance(q, str) else ""

    def _waits_in(self, key: str) -> str | None:
        """The queue a unit the last cycle tried waits in (None: unqueued or a problem)."""
        q = self.queues.waiting.get(key)
        return q if isinstance(q, str) else None

    def _forget_gang(self, key: str) -> None:
        """The gang changed or was placed: worth trying at once, its class found anew."""
        self.waits.forget(key)
        self._gang_class.pop(key, None)

    def _still_waiting(self, key: object) -> bool:
        """Whether a sleeper's class or gang still has pods."""
        if isinstance(key, tuple) and key[0] == "class":
            return key[1] in self.singles.classes
        return isinstance(key, str) and GroupKey(key) in self.groups.groups

    def schedulable_units(self, now: float, snapshot: Callable[[], Snapshot] | None = None) -> list[Unit]:
        """The units worth trying at ``now``: pending and not gated; of each class of single
        pods that is awake, the oldest members that could fit in the free capacity and one
        more (:func:`~batchsched.core.equivalence.fit_count`); each gang that is awake (or
        blocked, to be told so); and every unit holding a nomination, asleep or not.
        ``snapshot()``: the step's snapshot."""
        snapshot = snapshot or _once(self.state.snapshot)
        retry = self.settings.retry_unschedulable
        nominated = self.queues.nominations
        units: list[Unit] = []
        seen: set[PodUID] = set()
        self._cut = {}
        free: Any = None
        columns: dict[str, int] = {}
        def fits(need: Mapping[str, int]) -> int:
            nonlocal free, columns
            if free is None:
                snap = snapshot()
                free = snap.alloc - snap.used
                columns = {c: i for i, c in enumerate(snap.columns)}
            return fit_count(free, columns, need)

        def hand(ckey: Any, members: Any) -> None:
            limit = len(members)
            if limit > 2:
                fit = fits(members[0].requests)
                # one more than fits (two: the first may only hold a reservation)
                if 0 <= fit < limit - 2:
                    limit = fit + 2
                    last = members[limit - 1]
                    self._cut[ckey] = arrival_order(last)
            for pod in members.islice(0, limit):
                seen.add(pod.uid)
                units.append(single_unit(pod))

        for ckey, members in self.singles.items():
            if not self.waits.asleep(("class", ckey), now, retry):
                hand(ckey, members)
        for key in nominated:
            uid = self.state.by_name.get(tuple(key.split("/", 1)))  # type: ignore[arg-type]
            if uid is not None and uid not in seen and self.singles.class_of(uid) is not None:
                seen.add(uid)
                units.append(single_unit(self.state.pending[uid]))
        if not self._restored:
            # after a start: pods nominated before it are looked at, wherever they queue
            for uid in self.singles.nominated(seen):
                units.append(single_unit(self.state.pending[uid]))
        room = Room(self.state, self.groups, self.queues, snapshot, now)

        units.extend(self._gangs(now, room, nominated, fits))
        gang_turns: list[tuple[tuple[int, float, int, str], str]] = []
        before = len(units)
        self._turned_classes = set()
        for turn in self._fair_turns(now, units, snapshot, fits):
            if isinstance(turn, tuple):  # a class of single pods: its first members, as when awake
                members = self.singles.classes.get(turn[1])
                if members is not None and members[0].uid not in seen:
                    self._turned_classes.add(turn[1])
                    hand(turn[1], members)
            elif isinstance(turn, str) and turn in self._gang_class and turn not in nominated:
                gang_turns.append((self._gang_class[turn][1], turn))
        if gang_turns:
            units.extend(self._gang_turns(gang_turns, now, room, nominated, fits))
        self._turned = {u.key for u in units[before:]}
        if units and self._holders:
            # reservations hold room against the others tried in a cycle: their holders
            # are tried too, asleep or not (with nothing else to try, they may sleep)
            for ckey in self._holder_classes:
                members = self.singles.classes.get(ckey)
                if members is not None and members[0].uid not in seen:
                    hand(ckey, members)
            built = {u.key for u in units}
            holders = {k for k in self._holders if k not in built and GroupKey(k) in self.groups.groups}
            if holders:
                units.extend(self.groups.units(self.state, now, room, want=holders.__contains__))
        return units

    def _gangs(self, now: float, room: Room, nominated: Mapping[str, Any],
               fits: Callable[[Mapping[str, int]], int]) -> list[Unit]:
        """The gangs to hand to the cycle: those awake, and of each class of alike gangs
        only the oldest that could fit and one more (the rest share their outcome)."""
        retry = self.settings.retry_unschedulable
        self._gang_cut = {}
        # gangs known to fail alike: of each class, only the first few are built at all
        awake: dict[Any, list[tuple[tuple[int, float, int, str], str]]] = {}
        for key, (ckey, order, _, _) in self._gang_class.items():
            if key not in nominated and not self.waits.asleep(key, now, retry):
                awake.setdefault(ckey, []).append((order, key))
        skip: set[str] = set()
        for ckey, members in awake.items():
            members.sort()
            n = self._gang_fit(self._gang_class[members[0][1]], fits, len(members))
            if n < len(members):
                self._gang_cut[ckey] = [k for _, k in members[n:]]
                skip.update(k for _, k in members[n:])

        def want(key: str) -> bool:
            return key in nominated or (key not in skip and not self.waits.asleep(key, now, retry))

        return self._cut_alike(self.groups.units(self.state, now, room, want=want), nominated, fits)

    def _cut_alike(self, built: list[Unit], nominated: Mapping[str, Any],
                   fits: Callable[[Mapping[str, int]], int]) -> list[Unit]:
        """Of each class of alike gangs built, the oldest that could fit and one more; the
        rest are left out (:attr:`_gang_cut`) to share their outcome."""
        out: list[Unit] = []
        by_class: dict[Any, list[Unit]] = {}
        for unit in built:
            ckey = self._gang_key(unit)
            if unit.blocked or unit.key in nominated or not gang_like(ckey.parts[1]):
                out.append(unit)
            else:
                by_class.setdefault(ckey, []).append(unit)
        for ckey, alike in by_class.items():
            alike.sort(key=Unit.order)
            first = alike[0]
            n = self._gang_fit((ckey, first.order(), _smallest(first), first.min_count), fits, len(alike))
            out.extend(alike[:n])
            if n < len(alike):
                self._gang_cut.setdefault(ckey, []).extend(u.key for u in alike[n:])
                for u in alike[n:]:
                    self._gang_class[u.key] = (ckey, u.order(), _smallest(u), u.min_count)
        return out

    def _gang_turns(self, turns: list[tuple[tuple[int, float, int, str], str]], now: float, room: Room,
                    nominated: Mapping[str, Any], fits: Callable[[Mapping[str, int]], int]) -> list[Unit]:
        """Gangs given a fair turn: of each class, as many as could fit and one more, built."""
        by_class: dict[Any, list[tuple[tuple[int, float, int, str], str]]] = {}
        for order, key in sorted(turns):
            by_class.setdefault(self._gang_class[key][0], []).append((order, key))
        want: set[str] = set()
        for alike in by_class.values():
            n = self._gang_fit(self._gang_class[alike[0][1]], fits, len(alike))
            want.update(key for _, key in alike[:n])
        return self._cut_alike(self.groups.units(self.state, now, room, want=want.__contains__), nominated, fits)

    def _fair_turns(self, now: float, units: Sequence[Unit], snapshot: Callable[[], Snapshot],
                    fits: Callable[[Mapping[str, int]], int]) -> list[object]:
        """The sleepers backing off that are tried now anyway: those the fair order puts
        before a unit handed over from another queue of their cohort, and that free
        capacity could take now (the fair turn of :mod:`batchsched.core.requeue`)."""
        held = self.waits.backing_off(now, self.settings.retry_unschedulable)
        if held and units:
            room = {key: fits(self.waits.sleepers[key].need) for key in held}
            held = {key: leaf for key, leaf in held.items() if room[key] < 0 or room[key] >= self._quorum_of(key)}
        if not held or not units:
            return []
        structure = self.queues.structure()
        asks: dict[object, tuple[str, Mapping[str, int]]] = {}
        for unit in units:
            if not unit.blocked:
                q = self.queues.queue_of(unit.pods, self.groups.groups.get(GroupKey(unit.key)), structure)
                if isinstance(q, str):
                    asks[unit.key] = (q, _quorum(unit))
        if not asks:
            return []
        awake = set(asks)
        asks.update((key, (q, self.waits.sleepers[key].need)) for key, q in held.items())
        ranks = self.queues.ranks(asks, state=self.state, groups=self.groups, snap=snapshot(), now=now)
        last: dict[str, dict[str, tuple[bool, float]]] = {}  # cohort -> queue -> its last unit awake
        for key in awake & ranks.keys():
            root, rank = ranks[key]
            queues = last.setdefault(root, {})
            leaf = asks[key][0]
            queues[leaf] = max(queues.get(leaf, rank), rank)
        heads: dict[str, tuple[tuple[int, float, int, str], object]] = {}  # queue -> its first sleeper due a turn
        for key, leaf in held.items():
            if key in ranks and any(other != leaf and rank > ranks[key][1]
                                    for other, rank in last.get(ranks[key][0], {}).items()):
                order = self._head_order(key)
                if leaf not in heads or order < heads[leaf][0]:
                    heads[leaf] = (order, key)
        return [key for _, key in heads.values()]

    def _quorum_of(self, key: object) -> int:
        """How many members of a sleeper must be placed together (1 for a class)."""
        entry = self._gang_class.get(key) if isinstance(key, str) else None
        return max(entry[3], 1) if entry is not None else 1

    def _head_order(self, key: object) -> tuple[int, float, int, str]:
        """Where a sleeper comes in its queue: its first pod's (a class) or its own (a gang)
        priority, then first come, first served (:meth:`~batchsched.core.plan.Unit.order`)."""
        if isinstance(key, tuple):
            members = self.singles.classes.get(key[1])
            if members:
                pod = members[0]
                return (-pod.priority, pod.created, pod.arrival, pod.uid)
        elif isinstance(key, str) and key in self._gang_class:
            order: tuple[int, float, int, str] = self._gang_class[key][1]
            return order
        return (0, float("inf"), 0, "")

    @staticmethod
    def _gang_fit(entry: tuple[Any, Any, Mapping[str, int], int], fits: Callable[[Mapping[str, int]], int],
                  count: int) -> int:
        """How many gangs of a class to hand over: as many as could fit, and one more."""
        _, _, need, quorum = entry
        per = fits(need)
        return count if per < 0 else min(count, per // max(quorum, 1) + 1)

    def _gang_key(self, unit: Unit) -> Any:
        """A gang's class across gangs: its shape and members (:func:`unit_class`) and the
        queue its PodGroup names."""
        found = self._step_classes.get(unit.key)
        if found is None:
            group = self.groups.groups.get(GroupKey(unit.key))
            queue = (group.queue, group.labels.get(QUEUE_LABEL, "")) if group is not None else ("", "")
            found = self._step_classes[unit.key] = ClassKey((queue, unit_class(unit, self._pod_class)))
        return found

    def _wake(self) -> None:
        """Wake the sleepers the events since the last step could make fit."""
        state = self.state
        if state.node_generation != self._node_generation:
            self._node_generation = state.node_generation
            self.waits.wake_all()
        freed = state.freed_nodes
        if freed or self._freed_roots:
            rows = [state.node_row[n] for n in freed if n in state.node_row]
            columns = {c: i for i, c in enumerate(state.columns)}
            self.waits.freed((state.alloc[r] - state.used[r] for r in rows), columns, self._freed_roots)
            freed.clear()
            self._freed_roots.clear()

    def _clean_stale(self, now: float, out: Decisions) -> None:
        """Ask for the removal of card assignments no binding followed; again after the
        assumed timeout if the watch never shows the pod clean."""
        for uid, pod in self.state.stale.items():
            asked = self._cleanup_at.get(uid)
            if asked is not None and now - asked < self.settings.assumed_timeout:
                continue
            self._cleanup_at[uid] = now
            notes, labels = stale_keys(pod.annotations, pod.labels)
            out.cleanups.append((pod_ref(pod), notes, labels))
        for uid in [u for u in self._cleanup_at if u not in self.state.stale]:
            del self._cleanup_at[uid]

    def _check_assumed(self, now: float, out: Decisions) -> None:
        """A binding the apiserver accepted that the watch never confirmed: read it again."""
        limit = self.settings.assumed_timeout
        for uid, since in list(self._assumed_at.items()):
            if now - since > limit and uid in self.state.assumed:
                pod = self.state.pods.get(uid)
                self._assumed_at[uid] = now
                if pod is not None:
                    out.resyncs.append(pod_ref(pod))

    def _check_gangs(self, now: float, out: Decisions) -> None:
        """Gangs below quorum: start their timers, evict those that ran out of time."""
        if now - self._last_gang_check < GANG_CHECK_SECONDS and not self.groups.lost:
            return
        self._last_gang_check = now
        check = self.groups.check(self.state, now)
        for n in check.notices:
            self.reports.dirty.add(n.group.key)
            out.events.append(EventNote(group_ref(n.group), n.type, n.reason, n.message))
        out.evictions.extend(check.evictions)

    def _hold_running(self, now: float, out: Decisions) -> None:
        """Evict, whole, the running gangs of suspended PodGroups, the running work of queues
        stopped with ``HoldAndDrain``, and GPU work on nodes whose health label says evict
        (each pod once; its job holds, or restarts elsewhere, when recreated)."""
        if now - self._last_hold_check < GANG_CHECK_SECONDS:
            return
        self._last_hold_check = now
        for pod, unit_key, why, cause in [*self._suspended_work(), *self._unhealthy_work(), *self._drained_work(now)]:
            if pod.deleting or pod.uid in self._held_evicting:
                continue
            self._held_evicting.add(pod.uid)
            out.evictions.append(Eviction(
                uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node_name,
                unit=unit_key, reason=why, cause=cause,
            ))

    def _running_members(self, group: PodGroup) -> list[Pod]:
        return [p for uid in self.groups.member_uids(group)
                if (p := self.state.pods.get(uid)) is not None and p.holds_resources]

    def _suspended_work(self) -> list[tuple[Pod, str, str, str]]:
        return [(pod, group.key, explain.suspended_eviction(group.display), "suspended")
                for group in self.groups.groups.values() if group.suspended
                for pod in self._running_members(group)]

    def _unhealthy_work(self) -> list[tuple[Pod, str, str, str]]:
        health, out = self.settings.node_health, []
        for name in sorted(self._health_evict):
            node = self.state.nodes.get(name)
            why = explain.health_eviction(name, health.label, health.value(node) if node is not None else "")
            for pod in list(self.state.pods_on(name)):
                if not pod.card_asks or not pod.holds_resources:
                    continue  # CPU work stays: only the GPUs are unhealthy
                gang = self.groups.group_of(pod.uid)
                if gang is None:
                    out.append((pod, pod.key, why, "node-health"))
                else:
                    out.extend((p, gang.key, why, "node-health") for p in self._running_members(gang))
        return out

    def _drained_work(self, now: float) -> list[tuple[Pod, str, str, str]]:
        if not self.queues.draining():
            return []
        out = []
        snap = self.state.snapshot()
        tree = self.queues.tree(snap.columns)
        for unit in self.queues.running(state=self.state, groups=self.groups, snap=snap, tree=tree, now=now):
            if unit.queue is not None and tree.stop_policy(unit.queue) is StopPolicy.HOLD_AND_DRAIN:
                for rp in unit.pods:
                    pod = self.state.pods.get(PodUID(rp.uid))
                    if pod is not None:
                        out.append((pod, unit.key, explain.drained_eviction(unit.queue), "drained"))
        return out

    # -- what the views read ---------------------------------------------------------------------

    def last_word(self, key: str) -> tuple[str, str] | None:
        """The ``(reason, message)`` a unit (a group's key, or a pod's ``namespace/name``)
        was last told about why it waits; None when it was told nothing yet."""
        found = self.reports.last_message(key)
        if found is not None:
            return found
        uid = self.state.by_name.get(tuple(key.split("/", 1)))  # type: ignore[arg-type]
        told = self._told.get(uid) if uid is not None else None
        if told is not None:
            return told[0], told[1]
        pod = self.state.pending.get(uid) if uid is not None else None
        return pod.shows if pod is not None else None

    def next_due(self, now: float) -> float | None:
        """When a step after ``now`` would try something an event already woke (a back-off
        ends); None when only new events (or the slow retry timer) would."""
        return self.waits.next_try(now)

    @property
    def holding_count(self) -> int:
        """Units holding a reservation or a nomination after the last cycle."""
        return len(self._holders)

    def holds_reservation(self, key: str) -> bool:
        """Whether the unit held a reservation or a nomination after the last cycle."""
        return key in self._holders

    def _run_cycle(self, now: float, out: Decisions) -> None:
        self._wake()
        # one snapshot for the whole decision (the units' admission and the cycle), taken
        # only when there is something to decide
        snapshot = _once(self.state.snapshot)
        self._step_classes = {}
        units = self.schedulable_units(now, snapshot)
        self._tell_joined(out)
        if not units:
            return
        snap = snapshot()
        if not self._restored:
            self._restored = True
            self._restore_nominations(units, snap, now)
        self._give_up_nominations(now, out)
        queues = self.queues.prepare(state=self.state, groups=self.groups, snap=snap, units=units, now=now)
        queues.turns = frozenset(self._turned)
        def classes(unit: Unit) -> Any:
            return unit_class(unit, self._pod_class) if unit.single else self._gang_key(unit)

        plan = self.cycle.run(snap, units, queues=queues, state=self.state, classes=classes)
        self.queues.settle(plan, queues.queue_of)
        self.cycles += 1
        out.plan = plan
        gangs = {u.key: u for u in units if not (u.single and u.key == u.pods[0].key)}
        for b in plan.bindings:
            uid = PodUID(b.uid)
            ckey = self.singles.class_of(uid)
            if ckey is not None:
                self.waits.forget(("class", ckey))  # it fits again: no back-off carried over
            self.state.assume(uid, b.node, b.cards)
            self.groups.touch(uid)
            self._sync(uid)
            self._assumed_at[uid] = now
            out.binds.append(b)
        delay = self.settings.gang_report_delay
        failed: dict[Any, tuple[str, str, Pod]] = {}
        reserved: dict[Any, tuple[str, str, Pod]] = {}
        awake: set[Any] = set()
        for u in plan.unschedulable:
            unit = gangs.get(u.unit)
            message = u.message
            if unit is None:
                ckey = self.singles.class_of(u.pod.uid)
                if u.unit in plan.deferred:
                    awake.add(ckey)  # its victim search is owed: next cycle
                elif u.reason == RESERVED:
                    reserved[ckey] = (u.reason, message, u.pod)
                elif ckey is not None:
                    failed[ckey] = (u.reason, message, u.pod)
            elif unit.blocked and now - self._blocked_since.setdefault(unit.key, now) < delay:
                continue  # members and PodGroups usually arrive together: do not report yet
            elif u.reason == RESERVED or _failed_with(plan, unit.key, message):
                message = self.reports.pod_message(unit.key, u.reason, message, now)
            if u.unit not in self._turned:
                self._tell(out, u.pod, u.reason, message)
        for ckey, (_, _, head) in reserved.items():
            # its head holds a reservation: it sleeps too, and the rest are told they wait behind it
            failed.setdefault(ckey, ("Unschedulable", explain.behind(f"pod {head.key}"), head))
        self._sleep_classes(failed, awake, plan, now, out)
        self._preempt(plan, out)
        self._gang_results(plan, gangs, now, out)
        self._share_gang_results(plan, gangs, now, out)
        self._holders = {k for k, r in plan.results.items() if r.holding or r.reason == RESERVED}
        self._holders.update(n.unit for n in plan.nominations)
        self._holder_classes = {
            self.singles.class_of(u.pod.uid) for u in plan.unschedulable
            if u.reason == RESERVED and u.unit not in gangs} - {None}
        if plan.deferred:
            # a victim search did not fit in this cycle's budget: next cycle, not later
            out.again = True
        self.charged = queues.tree
        self._sync_queues(now, out, queues)
        for key in [k for k in self._blocked_since if k not in gangs or not gangs[k].blocked]:
            del self._blocked_since[key]

    def _pod_class(self, pod: Pod) -> Any:
        """A pod's equivalence class: the index's for a single pod, else computed once per
        version of the pod."""
        found = self.singles.class_of(pod.uid)
        if found is not None:
            return found
        cached = self._member_classes.get(pod.uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        found = pod_class(pod, self.singles.read)
        found = self._member_keys.setdefault(found, found)  # one key object per class
        self._member_classes[pod.uid] = (pod, found)
        return found

    def _sleep_classes(
        self, failed: dict[Any, tuple[str, str, Pod]], awake: set[Any], plan: Plan, now: float, out: Decisions,
    ) -> None:
        """Classes of single pods that failed sleep; their members the cycle was not handed
        are told the same (once per change of message)."""
        for ckey, (reason, message, pod) in failed.items():
            if ckey in self._turned_classes:
                # a fair turn that failed: its back-off runs on to its own try (with its
                # victim search), and its members keep what they were told
                continue
            if ckey not in awake:
                self.waits.sleep(("class", ckey), now, pod.requests, quota=self._quota_root(pod.key, plan),
                                 queue=self._waits_in(pod.key))
            cut = self._cut.get(ckey)
            before = self._class_told.get(ckey)
            told_at = before[2] if before is not None else -1e18
            if cut is not None and (before is None or before[0] != reason or (
                    before[1] != message and now - told_at >= SHARED_REFRESH_SECONDS)):
                told_at = now
                # the members after the last one handed over (the order of the index)
                for member in self.singles.classes[ckey].irange_key(min_key=cut, inclusive=(False, True)):
                    self._tell(out, member, reason, message)
            # the latest word (pods joining the class are told it), and when all were told
            self._class_told[ckey] = (reason, message, told_at)
        if any(ckey not in failed for ckey in self._cut):
            out.again = True  # a class was cut and none of it failed: place more of it now
        if len(self._class_told) > 2 * len(self.singles.classes) + 64:
            self._class_told = {k: v for k, v in self._class_told.items() if k in self.singles.classes}

    def _tell_joined(self, out: Decisions) -> None:
        """Pods that joined a class after it was told why it waits: told the same."""
        for uid in self._joined:
            ckey = self.singles.class_of(uid)
            told = self._class_told.get(ckey)
            if told is not None and ("class", ckey) in self.waits:
                self._tell(out, self.state.pending[uid], told[0], told[1])
        self._joined.clear()

    def _tell(self, out: Decisions, pod: Pod, reason: str, message: str, *, shared_at: float | None = None) -> None:
        """A pending pod's ``PodScheduled`` condition, when it says something new.
        ``shared_at``: the pod shares another unit's outcome; a new message for the same
        reason is told at most every :data:`SHARED_REFRESH_SECONDS`."""
        before = self._told.get(pod.uid)
        if before is None and pod.shows is not None:
            before = (*pod.shows, 0.0)  # what it says since before we started (or relisted)
        if before is not None and before[:2] == (reason, message):
            self._told[pod.uid] = before
            return
        if shared_at is not None and before is not None and before[0] == reason and (
                shared_at - before[2] < SHARED_REFRESH_SECONDS):
            return
        self._told[pod.uid] = (reason, message, shared_at if shared_at is not None else before[2] if before else 0.0)
        out.unschedulable.append(PodCondition(pod_ref(pod), reason, message))

    def _share_gang_results(self, plan: Plan, gangs: dict[str, Unit], now: float, out: Decisions) -> None:
        """Gangs left out as alike to others (:meth:`_gangs`): when the class failed, they
        share its outcome and sleep; when it did not, they are handed over next."""
        first_failed: dict[Any, Unit] = {}
        placed: set[Any] = set()
        for key, unit in gangs.items():
            result = plan.results.get(key)
            if result is None or unit.blocked:
                continue
            ckey = self._gang_key(unit)
            if (result.failed or result.reason == RESERVED) and key not in plan.deferred:
                first_failed.setdefault(ckey, unit)
            elif not result.failed:
                placed.add(ckey)
        for ckey, keys in self._gang_cut.items():
            first = first_failed.get(ckey)
            if first is None:
                out.again = True  # the class was not found failing: hand the rest over now
                continue
            result = plan.results[first.key]
            if result.reason == RESERVED:
                shared = UnitResult(UnitStatus.UNSCHEDULABLE, "Unschedulable", explain.behind(f"gang {first.display}"))
            else:
                shared = UnitResult(result.status, result.reason, explain.like_gang(first.display, result.message))
            if first.key in self._turned:
                continue  # a fair turn that failed: they wait for their own try, as they did
            quota, queue = self._quota_root(first.key, plan), self._waits_in(first.key)
            for key in keys:
                self.waits.sleep(key, now, self._gang_class[key][2], quota=quota, queue=queue)
            self._tell_cut_gangs(keys, shared, now, out)

    def _tell_cut_gangs(self, keys: list[str], result: UnitResult, now: float, out: Decisions) -> None:
        """The PodGroups and pending pods of gangs that share a class's outcome."""
        for key in keys:
            group = self.groups.groups.get(GroupKey(key))
            if group is None:
                continue
            self.reports.shared(group.key, result)
            message = self.reports.pod_message(key, result.reason, result.message, now)
            for uid in self.groups.member_uids(group):
                pod = self.state.pending.get(uid)
                if pod is not None:
                    self._tell(out, pod, result.reason, message, shared_at=now)

    def _restore_nominations(self, units: list[Unit], snap: Snapshot, now: float) -> None:
        """After a restart: units whose quorum carries ``status.nominatedNodeName`` hold
        those nodes again (:func:`~batchsched.core.preemption.restored_nominations`)."""
        for n in restored_nominations(units, self.state, self.groups, self.queues, snap, now):
            self.queues.restore(n)
            self._preemptor_refs[n.unit] = self._refs(n.unit, [self.state.pods[PodUID(uid)] for uid in n.pods])

    def _give_up_nominations(self, now: float, out: Decisions) -> None:
        """The nominations the cycle is about to give up, told to their preemptors (their
        ``nominatedNodeName`` cleared): those that timed out, and those of stopped queues."""
        for n in self.queues.expired(self.state, now):
            message = explain.nomination_expired(n.nodes, self.settings.queues.nomination_timeout)
            for ref in self._preemptor_refs.get(n.unit, []):
                out.events.append(EventNote(ref, "Warning", "NominationExpired", message))
            self._clear_nominated(n.pods, out)
        for n, stop in self.queues.stopped(self.state, now):
            message = explain.nomination_stopped(n.nodes, str(n.queue), stop.value)
            for ref in self._preemptor_refs.get(n.unit, []):
                out.events.append(EventNote(ref, "Warning", "NominationDropped", message))
            self._clear_nominated(n.pods, out)

    def _refs(self, key: str, pods: Iterable[Pod]) -> list[ObjectRef]:
        """What a unit's Events go to: its PodGroup, or its pods when it has none."""
        group = self.groups.groups.get(GroupKey(key))
        return [group_ref(group)] if group is not None else [pod_ref(p) for p in pods]

    def _clear_nominated(self, uids: Iterable[str], out: Decisions) -> None:
        for uid in uids:
            pod = self.state.pods.get(PodUID(uid))
            if pod is not None and pod.nominated_node:
                out.nominated.append((pod_ref(pod), ""))

    def _preempt(self, plan: Plan, out: Decisions) -> None:
        """The cycle's preemptions: Events, then each victim evicted."""
        for rec in plan.preemptions:
            unit = rec.preemptor
            refs = self._preemptor_refs[unit.key] = self._refs(unit.key, unit.pods)
            for ref in refs:
                out.events.append(EventNote(ref, "Normal", "Preempting", rec.summary))
            for member, node in zip(unit.pods, rec.nodes, strict=False):
                out.nominated.append((pod_ref(member), node))
            for victim, message in zip(rec.victims, rec.messages, strict=True):
                self._told_groups.discard((unit.key, victim.unit.key))  # a new preemption: told anew
                for rp in victim.pods:
                    pod = self.state.pods.get(PodUID(rp.uid))
                    if pod is None or pod.deleting:
                        continue
                    out.evictions.append(Eviction(
                        uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node_name,
                        unit=victim.unit.key, reason=message, preemptor=unit.key,
                        cause="reclaimed" if victim.kind is VictimKind.RECLAIM else "preempted",
                    ))
        live = {n.unit for n in plan.nominations}
        for key in [k for k in self._preemptor_refs if k not in live]:
            del self._preemptor_refs[key]
        # a pair is forgotten when its victim is preempted anew (told again, above), not
        # when the preemption ends: a preemptor placed before its last victim's eviction is
        # answered would tell the group twice
        if len(self._told_groups) > TOLD_GROUPS_KEPT:
            self._told_groups = {t for t in self._told_groups if t[0] in live}

    def _gang_results(self, plan: Plan, gangs: dict[str, Unit], now: float, out: Decisions) -> None:
        """Each gang's result: told to its PodGroup, and whether it sleeps."""
        for key, unit in gangs.items():
            if not unit.blocked:
                self._blocked_since.pop(key, None)
            result = plan.results.get(key)
            holding = result is not None and result.holding
            if key in self._turned and result is not None and result.failed:
                continue  # a fair turn that failed: its back-off runs on to its own try
            self.reports.result(unit, result, holding=holding, now=now, out=out)
            if result is None:
                continue
            if result.status is UnitStatus.SCHEDULED:
                self.groups.placed_whole(key)
            if result.status is UnitStatus.SCHEDULED or holding:
                # placed, or it preempted others (or waits for them to go): tried next cycle
                self._forget_gang(key)
            elif (result.failed or result.reason == RESERVED) and not unit.blocked and key not in plan.deferred:
                # failed, or holds a reservation (tried again whenever others are)
                need = _smallest(unit)
                self.waits.sleep(key, now, need, quota=self._quota_root(key, plan), queue=self._waits_in(key))
                self._gang_class[key] = (self._gang_key(unit), unit.order(), need, unit.min_count)

    def _sync_queues(self, now: float, out: Decisions, queues: QueueInput | None = None) -> None:
        """The Queue statuses, at most every ``queue_status_interval``.

        ``queues``: the input of the cycle that just ran (its tree is charged with what the
        cycle decided); without one, running work and nominations are charged to a fresh
        tree by the cycle's own accounting."""
        if not self.queues.queue_objects or out.queue_statuses:
            return
        if now - self._last_queue_status < self.settings.queue_status_interval:
            return
        self._last_queue_status = now
        if queues is None:
            snap = self.state.snapshot()
            queues = self.queues.prepare(state=self.state, groups=self.groups, snap=snap, units=[], now=now)
            self.cycle.account(snap, queues)
        self.charged = queues.tree
        out.queue_statuses.extend(self.queues.statuses(queues.tree, self._has_pending).items())

    def _has_pending(self, key: str) -> bool:
        """Whether the unit ``key`` (a group's, or a single pod's ``namespace/name``) still
        has a pod waiting."""
        pending = self.state.pending
        group = self.groups.groups.get(GroupKey(key))
        if group is not None:
            return any(uid in pending for uid in self.groups.member_uids(group))
        uid = self.state.by_name.get(tuple(key.split("/", 1)))  # type: ignore[arg-type]
        return uid is not None and uid in pending
