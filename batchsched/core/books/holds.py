"""Holds: running work the scheduler takes back, and what the nodes' labels say.

- **gang timers**: gangs below quorum start a timer, and those that run out of time are
  evicted whole (:meth:`~batchsched.core.gangs.GroupBook.check`);
- **suspended PodGroups**, **queues stopped with** ``HoldAndDrain`` and **GPU health**: their
  running work is evicted, each pod once (its job holds, or restarts elsewhere, when
  recreated);
- the nodes whose GPU health label says *evict*, and the nodes whose allocatable cannot be
  read (told once per change, as an Event with the next step's decisions).

Both sweeps run at most every :data:`GANG_CHECK_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Iterable

from batchsched.core import explain
from batchsched.core.decisions import Decisions, EventNote, group_ref
from batchsched.core.gangs import GroupBook, GroupKey, PodGroup
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Node, Pod, PodUID
from batchsched.core.nodehealth import NodeHealthSettings
from batchsched.core.plan import Eviction, ObjectRef
from batchsched.core.queues import QueueBook, StopPolicy

__all__ = ["GANG_CHECK_SECONDS", "Holds"]

#: how often the gang timers (and the held work) are looked at
GANG_CHECK_SECONDS = 0.5


class Holds:
    """Gang timers, suspended, drained and unhealthy work, and the nodes' word (one writer:
    this module)."""

    def __init__(self, health: NodeHealthSettings) -> None:
        self.health = health
        self._last_gang_check = -1e18
        self._last_hold_check = -1e18
        #: pods evicted because their gang is suspended, their queue drained or their node's
        #: GPU health says evict
        self._held_evicting: set[PodUID] = set()
        #: nodes whose GPU health label says: evict what runs there
        self._health_evict: set[str] = set()
        #: node -> its unreadable allocatable last told
        self._unreadable_told: dict[str, dict[str, str]] = {}
        #: Events decided on intake, written with the next step's decisions
        self._notes: list[EventNote] = []

    # -- intake ----------------------------------------------------------------------------------

    def nodes_listed(self, nodes: Iterable[Node]) -> None:
        """A full list of the nodes (with their health read)."""
        nodes = list(nodes)
        self._health_evict = {n.name for n in nodes if self.health.evicts(n)}
        for node in nodes:
            self._tell_unreadable(node)

    def node_event(self, kind: str, node: Node) -> None:
        if kind != "DELETED" and self.health.evicts(node):
            self._health_evict.add(node.name)
        else:
            self._health_evict.discard(node.name)
        if kind == "DELETED":
            self._unreadable_told.pop(node.name, None)
        else:
            self._tell_unreadable(node)

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

    def released(self, uid: PodUID) -> None:
        """The pod holds nothing any more (gone, or ended)."""
        self._held_evicting.discard(uid)

    def notes(self, out: Decisions) -> None:
        """The Events decided on intake since the last step."""
        out.events.extend(self._notes)
        self._notes.clear()

    # -- a step ----------------------------------------------------------------------------------

    def gang_timers(self, state: ClusterState, groups: GroupBook, now: float, out: Decisions) -> list[GroupKey]:
        """Gangs below quorum: start their timers, evict those that ran out of time.
        Returns the groups told (their statuses are written again)."""
        if now - self._last_gang_check < GANG_CHECK_SECONDS and not groups.lost:
            return []
        self._last_gang_check = now
        check = groups.check(state, now)
        told = []
        for n in check.notices:
            told.append(n.group.key)
            out.events.append(EventNote(group_ref(n.group), n.type, n.reason, n.message))
        out.evictions.extend(check.evictions)
        return told

    def hold_running(
        self, state: ClusterState, groups: GroupBook, queues: QueueBook, now: float, out: Decisions,
    ) -> None:
        """Evict, whole, the running gangs of suspended PodGroups, the running work of queues
        stopped with ``HoldAndDrain``, and GPU work on nodes whose health label says evict
        (each pod once; its job holds, or restarts elsewhere, when recreated)."""
        if now - self._last_hold_check < GANG_CHECK_SECONDS:
            return
        self._last_hold_check = now
        held = [*_suspended(state, groups), *self._unhealthy(state, groups), *_drained(state, groups, queues, now)]
        for pod, unit_key, why, cause in held:
            if pod.deleting or pod.uid in self._held_evicting:
                continue
            self._held_evicting.add(pod.uid)
            out.evictions.append(Eviction(
                uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node_name,
                unit=unit_key, reason=why, cause=cause,
            ))

    def _unhealthy(self, state: ClusterState, groups: GroupBook) -> list[tuple[Pod, str, str, str]]:
        health, out = self.health, []
        for name in sorted(self._health_evict):
            node = state.nodes.get(name)
            why = explain.health_eviction(name, health.label, health.value(node) if node is not None else "")
            for pod in list(state.pods_on(name)):
                if not pod.card_asks or not pod.holds_resources:
                    continue  # CPU work stays: only the GPUs are unhealthy
                gang = groups.group_of(pod.uid)
                if gang is None:
                    out.append((pod, pod.key, why, "node-health"))
                else:
                    out.extend((p, gang.key, why, "node-health") for p in _running_members(state, groups, gang))
        return out


def _running_members(state: ClusterState, groups: GroupBook, group: PodGroup) -> list[Pod]:
    return [p for uid in groups.member_uids(group)
            if (p := state.pods.get(uid)) is not None and p.holds_resources]


def _suspended(state: ClusterState, groups: GroupBook) -> list[tuple[Pod, str, str, str]]:
    return [(pod, group.key, explain.suspended_eviction(group.display), "suspended")
            for group in groups.groups.values() if group.suspended
            for pod in _running_members(state, groups, group)]


def _drained(state: ClusterState, groups: GroupBook, queues: QueueBook, now: float) -> list[tuple[Pod, str, str, str]]:
    if not queues.draining():
        return []
    out = []
    snap = state.snapshot()
    tree = queues.tree(snap.columns)
    for unit in queues.running(state=state, groups=groups, snap=snap, tree=tree, now=now):
        if unit.queue is not None and tree.stop_policy(unit.queue) is StopPolicy.HOLD_AND_DRAIN:
            for rp in unit.pods:
                pod = state.pods.get(PodUID(rp.uid))
                if pod is not None:
                    out.append((pod, unit.key, explain.drained_eviction(unit.queue), "drained"))
    return out
