"""Preemption follow-up: what is written after a cycle preempted, and after each eviction.

A preemption the cycle decided is told on the preemptor (a ``Preempting`` Event on its
PodGroup, or its pods when it has none), its members are given ``nominatedNodeName``, and
each victim is evicted. As the evictions are answered the victims are told who preempted
them (a victim gang's PodGroup once per preemptor); a refused eviction gives the preemption
up (its nomination is dropped by the caller, the preemptor told, its nominatedNodeName
cleared). A gang evicted whole (gang timers, holds) has its outcome told on its PodGroup.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from batchsched.core import explain
from batchsched.core.decisions import Decisions, EventNote, group_ref, pod_ref
from batchsched.core.gangs import GroupBook, GroupKey
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Pod, PodUID
from batchsched.core.plan import Eviction, Nomination, ObjectRef, Plan, VictimKind
from batchsched.core.queues import StopPolicy

__all__ = ["TOLD_GROUPS_KEPT", "PreemptionFollowUp", "gang_evicted"]

#: (preemptor, victim group) pairs told are kept up to this many (the rest, of preemptions
#: no longer held, are dropped when it is passed)
TOLD_GROUPS_KEPT = 4096


class PreemptionFollowUp:
    """Whom each preemptor's Events go to, and which victim groups were told (one writer:
    this module)."""

    def __init__(self) -> None:
        #: preemptor unit key -> the objects its Events go to
        self._refs: dict[str, list[ObjectRef]] = {}
        #: (preemptor, victim unit) pairs already told on the victim's group
        self._told_groups: set[tuple[str, str]] = set()

    def restored(self, n: Nomination, pods: Iterable[Pod], groups: GroupBook) -> None:
        """A nomination held again after a restart: its Events go to its unit."""
        self._refs[n.unit] = _refs(n.unit, pods, groups)

    def preempted(self, plan: Plan, state: ClusterState, groups: GroupBook, out: Decisions) -> None:
        """The cycle's preemptions: Events, nominated nodes, then each victim evicted."""
        for rec in plan.preemptions:
            unit = rec.preemptor
            refs = self._refs[unit.key] = _refs(unit.key, unit.pods, groups)
            for ref in refs:
                out.events.append(EventNote(ref, "Normal", "Preempting", rec.summary))
            for member, node in zip(unit.pods, rec.nodes, strict=False):
                out.nominated.append((pod_ref(member), node))
            for victim, message in zip(rec.victims, rec.messages, strict=True):
                self._told_groups.discard((unit.key, victim.unit.key))  # a new preemption: told anew
                for rp in victim.pods:
                    pod = state.pods.get(PodUID(rp.uid))
                    if pod is None or pod.deleting:
                        continue
                    out.evictions.append(Eviction(
                        uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node_name,
                        unit=victim.unit.key, reason=message, preemptor=unit.key,
                        cause="reclaimed" if victim.kind is VictimKind.RECLAIM else "preempted",
                    ))
        live = {n.unit for n in plan.nominations}
        for key in [k for k in self._refs if k not in live]:
            del self._refs[key]
        # a pair is forgotten when its victim is preempted anew (told again, above), not
        # when the preemption ends: a preemptor placed before its last victim's eviction is
        # answered would tell the group twice
        if len(self._told_groups) > TOLD_GROUPS_KEPT:
            self._told_groups = {t for t in self._told_groups if t[0] in live}

    def given_up(
        self, expired: Sequence[Nomination], stopped: Sequence[tuple[Nomination, StopPolicy]], *,
        timeout: float, state: ClusterState, out: Decisions,
    ) -> None:
        """The nominations the cycle is about to give up, told to their preemptors (their
        ``nominatedNodeName`` cleared): those that timed out, and those of stopped queues."""
        for n in expired:
            message = explain.nomination_expired(n.nodes, timeout)
            for ref in self._refs.get(n.unit, []):
                out.events.append(EventNote(ref, "Warning", "NominationExpired", message))
            _clear_nominated(n.pods, state, out)
        for n, stop in stopped:
            message = explain.nomination_stopped(n.nodes, str(n.queue), stop.value)
            for ref in self._refs.get(n.unit, []):
                out.events.append(EventNote(ref, "Warning", "NominationDropped", message))
            _clear_nominated(n.pods, state, out)

    def victim_evicted(self, e: Eviction, outcome: str, groups: GroupBook) -> Decisions:
        """A victim's eviction went through (``outcome`` evicted): tell who preempted it;
        or there was nothing left to evict (gone): the capacity is free, nothing to tell."""
        out = Decisions()
        if outcome != "evicted":
            return out
        group = groups.groups.get(GroupKey(e.unit))
        out.events.append(EventNote(pod_ref(e), "Normal", "Preempted", e.reason))
        if group is not None and (e.preemptor, e.unit) not in self._told_groups:
            self._told_groups.add((e.preemptor, e.unit))
            out.events.append(EventNote(group_ref(group), "Normal", "Preempted", e.reason))
        return out

    def blocked(
        self, e: Eviction, outcome: str, error: str, dropped: Nomination | None, state: ClusterState,
    ) -> Decisions:
        """A victim's eviction was refused: the preemption is given up (``dropped``: its
        nomination, if it still held one)."""
        out = Decisions()
        message = explain.preemption_blocked(
            f"{e.namespace}/{e.name}", budget=outcome == "blocked", error=error,
        )
        if dropped is not None:
            for ref in self._refs.get(e.preemptor, []):
                out.events.append(EventNote(ref, "Warning", "PreemptionBlocked", message))
            _clear_nominated(dropped.pods, state, out)
        out.events.append(EventNote(pod_ref(e), "Normal", "PreemptionBlocked", message))
        return out


def gang_evicted(e: Eviction, outcome: str, error: str, groups: GroupBook) -> Decisions:
    """A member of a gang evicted whole (gang timers, holds): told on its PodGroup, and
    the gang no longer waits for it unless it was evicted (then its deletion ends the wait)."""
    out = Decisions()
    key = GroupKey(e.unit)
    group = groups.groups.get(key)
    if outcome != "evicted":
        groups.eviction_done(key, PodUID(e.uid))
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


def _refs(key: str, pods: Iterable[Pod], groups: GroupBook) -> list[ObjectRef]:
    """What a unit's Events go to: its PodGroup, or its pods when it has none."""
    group = groups.groups.get(GroupKey(key))
    return [group_ref(group)] if group is not None else [pod_ref(p) for p in pods]


def _clear_nominated(uids: Iterable[str], state: ClusterState, out: Decisions) -> None:
    for uid in uids:
        pod = state.pods.get(PodUID(uid))
        if pod is not None and pod.nominated_node:
            out.nominated.append((pod_ref(pod), ""))

