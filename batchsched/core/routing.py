"""How the events of the watched objects reach the books: the Session's event intake.

Each ``on_*`` takes one parsed object (or a full list of one kind) and routes it: to the
mirror of the cluster and the gang and queue books first, then to each book of
:mod:`batchsched.core.books` the change concerns, which answers with a value (a class woke,
a gang must be tried again); it sets :attr:`EventRouting.wants_step` when the change is
worth a step. Nothing here decides: the step does (:class:`~batchsched.core.session.Session`,
which is an :class:`EventRouting`).

A pod whose claims, volumes or namespace changed is admitted and routed again like any
changed pod (what placement reads of it changed); the routing never calls an ``on_*``
from inside.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

from batchsched.core.books.backlog import Backlog
from batchsched.core.books.holds import Holds
from batchsched.core.books.intake import PodIntake
from batchsched.core.books.ledger import BindLedger
from batchsched.core.books.statuses import GroupReports, QueueStatuses
from batchsched.core.books.told import ToldBook
from batchsched.core.disruption import DisruptionBudget
from batchsched.core.dra.book import DeviceChange
from batchsched.core.dra.objects import DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice
from batchsched.core.gangs import GroupBook, GroupKey, PodGroup
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Node, Pod, PodUID, Term, arrival_of
from batchsched.core.nodehealth import with_health
from batchsched.core.queues import QueueBook
from batchsched.core.settings import SessionSettings
from batchsched.core.volumes import VolumeClaim

__all__ = ["EventRouting"]


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _closing(namespace: Mapping[str, Any]) -> bool:
    """Whether a Namespace is being deleted (it takes no new content, Bindings included)."""
    status = namespace.get("status") or {}
    return bool((namespace.get("metadata") or {}).get("deletionTimestamp")) or status.get("phase") == "Terminating"


class EventRouting:
    """The event intake of a :class:`~batchsched.core.session.Session` (which builds the
    books named here)."""

    settings: SessionSettings
    state: ClusterState
    groups: GroupBook
    queues: QueueBook
    intake: PodIntake
    backlog: Backlog
    told: ToldBook
    holds: Holds
    ledger: BindLedger
    reports: GroupReports
    queue_statuses: QueueStatuses
    #: an event gave a reason to run a step now
    wants_step: bool

    def on_nodes_listed(self, nodes: Iterable[Node]) -> None:
        nodes = self.intake.devices.replace_nodes([with_health(n, self.settings.node_health) for n in nodes])
        self.holds.nodes_listed(nodes)
        self.state.replace_nodes(nodes)
        # where a pod's claims could be allocated was found among the nodes known then (none,
        # for a pod listed before the nodes at start): found again
        self._read_again(self.intake.using_devices(None))
        self.wants_step = True

    def on_node(self, kind: str, node: Node) -> None:
        self._node(kind, with_health(node, self.settings.node_health))

    def _node(self, kind: str, node: Node) -> None:
        """A node event, its health read: with the DRA devices it may offer counted in, to
        the holds and the mirror."""
        node = self.intake.devices.node_event(kind, node)
        self.holds.node_event(kind, node)
        before = self.state.capacity_generation
        self.state.node_event(kind, node)
        if self.state.capacity_generation != before:
            self.wants_step = True

    def on_pods_listed(self, pods: list[Pod]) -> None:
        pods = self.intake.relisted(pods, self.state.pods)
        self.state.replace_pods(pods)
        self._devices_held()
        self.groups.replace_pods(pods)
        self.backlog.relisted(pods)
        self.told.forget_pods()
        self.told.seen_listed(pods, self.state.ours)
        for uid in self.state.pending:
            self._sync(uid)
        self.reports.dirty.update(self.groups.groups)
        self.wants_step = True

    def on_pod(self, kind: str, pod: Pod, *, read: bool = False) -> None:
        """A pod event; ``read``: the pod was read outside the watch (read again after a
        conflict, or a Binding never confirmed), and is not applied when the mirror holds a
        later version of it: the watch showed one (its Binding landed) while the read was
        under way, and the read's older answer would undo it."""
        known = self.state.pods.get(pod.uid)
        if read and known is not None and _older(pod.resource_version, known.resource_version):
            return
        self._route_pod(kind, self.intake.admit(kind, pod, known))

    def _route_pod(self, kind: str, pod: Pod) -> None:
        """An admitted pod event: the mirror and the gangs first, then each book it concerns."""
        if kind != "DELETED" and self.backlog.read(pod):
            self.wants_step = True
        state, uid = self.state, pod.uid
        before, was_pending, group = state.capacity_generation, state.pending.get(uid), self.groups.group_of(uid)
        self._mirror_pod(kind, pod, group)
        self.told.seen(kind, pod, ours=state.ours(pod))
        self._devices_held()
        self._sync(uid)
        now_group = self.groups.group_of(uid)
        self.reports.dirty.update(g.key for g in (group, now_group) if g is not None)
        if kind == "DELETED" or pod.holds_resources or pod.terminal:
            self.ledger.settled(uid)
        capacity = state.capacity_generation != before or (uid in state.stale and not self.ledger.cleaning(uid))
        if self.backlog.pod_changed(
            kind, pod, was=was_pending, now=state.pending.get(uid), group=group.key if group else None,
            now_group=now_group.key if now_group else None, moved=group is not now_group, capacity=capacity,
        ) or capacity:
            self.wants_step = True

    def _mirror_pod(self, kind: str, pod: Pod, group: PodGroup | None) -> None:
        """A pod event in the mirror and the gangs (``group``: the pod's before it)."""
        state = self.state
        charged = pod.uid in state.charges
        state.pod_event(kind, pod)
        if charged and pod.uid not in state.charges:  # its usage went: what it was charged to wakes
            self.backlog.freed_root(self.queues.pod_queue_root(state.pods.get(pod.uid, pod), group))
            self.intake.ended(pod, group.key if group is not None else None)
        if kind == "DELETED" or not pod.holds_resources:
            self.holds.released(pod.uid)
        self.groups.pod_event(kind, pod)
        if kind != "DELETED" and pod.holds_resources:
            self.groups.confirmed(pod, state)
        if group is not None and group.from_pods and group.key not in self.groups.groups:
            self.reports.changed(group, spec=True, deleted=True)  # its last member left

    def _sync(self, uid: PodUID) -> None:
        """Keep the pod's place in the class index: pending, not gated, not in a gang."""
        pod = self.state.pending.get(uid)
        alone = pod is not None and not pod.gated and not self.groups.in_group(uid)
        before, after = self.backlog.place(uid, pod if alone else None)
        self.told.moved(uid, pending=pod is not None, before=before, after=after)

    def _read_again(self, pods: Iterable[Pod]) -> None:
        """Pods (as parsed) whose claims or namespace changed: admitted and routed anew."""
        for pod in pods:
            self._route_pod("MODIFIED", self.intake.admit("MODIFIED", pod, self.state.pods.get(pod.uid)))

    def on_claims_listed(self, claims: list[VolumeClaim]) -> None:
        self._read_again(self.intake.claiming(self.intake.volumes.replace_claims(claims)))

    def on_claim(self, kind: str, claim: VolumeClaim) -> None:
        self._read_again(self.intake.claiming(self.intake.volumes.claim_event(kind, claim)))

    def on_volumes_listed(self, volumes: list[tuple[str, tuple[Term, ...] | None]]) -> None:
        self._read_again(self.intake.claiming(self.intake.volumes.replace_volumes(volumes)))

    def on_volume(self, kind: str, volume: tuple[str, tuple[Term, ...] | None]) -> None:
        self._read_again(self.intake.claiming(self.intake.volumes.volume_event(kind, *volume)))

    def on_storage_classes_listed(self, classes: list[tuple[str, str]]) -> None:
        self._read_again(self.intake.claiming(self.intake.volumes.replace_classes(classes)))

    def on_storage_class(self, kind: str, storage_class: tuple[str, str]) -> None:
        self._read_again(self.intake.claiming(self.intake.volumes.class_event(kind, *storage_class)))

    # -- dynamic resource allocation (:mod:`batchsched.core.dra`)

    def on_resource_slices_listed(self, slices: list[ResourceSlice]) -> None:
        self._devices_changed(self.intake.devices.replace_slices(slices))

    def on_resource_slice(self, kind: str, rs: ResourceSlice) -> None:
        self._devices_changed(self.intake.devices.slice_event(kind, rs))

    def on_device_classes_listed(self, classes: list[DeviceClass]) -> None:
        self._devices_changed(self.intake.devices.replace_classes(classes))

    def on_device_class(self, kind: str, dc: DeviceClass) -> None:
        self._devices_changed(self.intake.devices.class_event(kind, dc))

    def on_device_taint_rules_listed(self, rules: list[DeviceTaintRule]) -> None:
        self._devices_changed(self.intake.devices.replace_taint_rules(rules))

    def on_device_taint_rule(self, kind: str, rule: DeviceTaintRule) -> None:
        self._devices_changed(self.intake.devices.taint_rule_event(kind, rule))

    def on_resource_claims_listed(self, claims: list[ResourceClaim]) -> None:
        self._devices_changed(self.intake.devices.replace_claims(claims))

    def on_resource_claim(self, kind: str, claim: ResourceClaim) -> None:
        self._devices_changed(self.intake.devices.claim_event(kind, claim))

    def _devices_held(self) -> None:
        """The nodes where what bound pods hold of DRA devices changed: to the mirror again
        (their allocatable counts the devices those pods are charged with)."""
        for name in self.intake.devices.take_held_nodes():
            node = self.intake.devices.nodes.get(name)
            if node is not None:
                self._node("MODIFIED", node)

    def _devices_changed(self, change: DeviceChange) -> None:
        """Devices, their classes or the claims on them changed: the nodes whose free devices
        changed go to the mirror again, and the pending pods using a changed claim (every
        pod with claims, when what devices match changed) are read again."""
        nodes = list(self.state.nodes) if change.nodes is None else sorted(change.nodes)
        for name in nodes:
            # as last seen, before the devices were counted in
            node = self.intake.devices.nodes.get(name)
            if node is not None:
                self._node("MODIFIED", node)
        self._read_again(self.intake.using_devices(change.claims))
        if change.owners and change.claims is not None:
            self._read_again(self.intake.kept(change.owners))
        if not change.empty:
            self.wants_step = True

    def on_groups_listed(self, api: str, groups: list[PodGroup]) -> set[GroupKey]:
        """A full list of one API's PodGroups; returns the keys of those that are gone."""
        gone = {k for k, g in self.groups.groups.items() if g.api == api} - {g.key for g in groups}
        self.groups.replace_groups(api, groups)
        self.reports.dirty.update(g.key for g in groups)
        for g in groups:
            self.backlog.forget_gang(g.key)
        self.wants_step = True
        return gone

    def on_podgroup(self, kind: str, group: PodGroup) -> None:
        old = self.groups.groups.get(group.key)
        self.groups.group_event(kind, group)
        spec = self.backlog.group_changed(kind, old, group)
        if kind == "DELETED" or spec:
            self.wants_step = True
        self.reports.changed(group, spec=spec, deleted=kind == "DELETED")

    def _queues_change(self, change: Callable[..., None], *args: Any) -> None:
        """``change(*args)`` to the queues' book; when it changed which queue a unit goes to,
        or whether it fits its quota: every sleeper is worth trying, the statuses are due."""
        before = self.queues.generation
        change(*args)
        if self.queues.generation != before:
            self.backlog.forget_all()
            self.queue_statuses.queues_changed()
            self.wants_step = True

    def on_queues_listed(self, items: Sequence[Mapping[str, Any]]) -> set[str]:
        """A full list of the Queues; returns the names of those that are gone."""
        gone = set(self.queues.queue_objects) - {str(o["metadata"]["name"]) for o in items}
        self._queues_change(self.queues.replace_queues, items)
        return gone

    def on_queue(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._queues_change(self.queues.queue_event, kind, obj)

    def on_namespaces_listed(self, items: Sequence[Mapping[str, Any]]) -> None:
        self._queues_change(self.queues.replace_namespaces, items)
        self._close_namespaces({_name(o) for o in items if _closing(o)})

    def on_namespace(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._queues_change(self.queues.namespace_event, kind, obj)
        name = _name(obj)
        closed = self.state.closed_namespaces - {name}
        self._close_namespaces(closed | {name} if kind != "DELETED" and _closing(obj) else closed)

    def _close_namespaces(self, closed: Set[str]) -> None:
        """The namespaces being deleted are ``closed``: the pods of those newly closed are no
        longer pending (the apiserver would refuse their Bindings), and any reopened (a
        namespace recreated under its name) are looked at again."""
        changed = closed ^ self.state.closed_namespaces
        if changed:
            self.state.closed_namespaces = frozenset(closed)
            self._read_again([self.intake.parsed(pod) for pod in list(self.state.pods.values())
                              if pod.namespace in changed and not pod.node_name])

    def on_budgets_listed(self, budgets: Iterable[DisruptionBudget]) -> None:
        self.queues.replace_budgets(budgets)

    def on_budget(self, kind: str, budget: DisruptionBudget) -> None:
        old = self.queues.budgets.get(budget.namespace, budget.name)
        self.queues.budget_event(kind, budget)
        if self.backlog.budget_changed(kind, old, budget):
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
        if self.backlog.forget_gangs(g.key for g in self.groups.groups.values() if g.priority_class in names):
            self.wants_step = True


def _older(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` comes before ``than`` (both etcd revisions, which
    compare as integers; when either is not one, nothing is known to be older)."""
    a, b = arrival_of(version), arrival_of(than)
    return 0 < a < b
