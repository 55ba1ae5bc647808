"""What a scheduling step decides, as plain values for the I/O edge to carry out.

:class:`Decisions` is the whole output of :meth:`batchsched.core.session.Session.step`
(and of its result intake): bindings for the binder, evictions for the evictor, pod
conditions and Events and PodGroup and Queue statuses for the status writers, and pods
to read again. Objects are named by :class:`~batchsched.core.plan.ObjectRef`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchsched.core.gangs import GroupStatus, PodGroup
from batchsched.core.model import Pod
from batchsched.core.plan import Binding, Eviction, ObjectRef, Plan

__all__ = ["Decisions", "EventNote", "PodCondition", "PodScheduledNote", "gang_refs", "group_ref", "pod_ref"]


@dataclass(slots=True, frozen=True)
class EventNote:
    ref: ObjectRef
    type: str
    reason: str
    message: str


@dataclass(slots=True, frozen=True)
class PodCondition:
    """``PodScheduled=False`` with this reason and message (and a FailedScheduling Event)."""

    ref: ObjectRef
    reason: str
    message: str


@dataclass(slots=True, frozen=True)
class PodScheduledNote:
    ref: ObjectRef
    node: str
    where: str = ""


@dataclass(slots=True)
class Decisions:
    """What a step (or a result) leads to, for the binder, evictor and writers."""

    binds: list[Binding] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    unschedulable: list[PodCondition] = field(default_factory=list)
    scheduled: list[PodScheduledNote] = field(default_factory=list)
    events: list[EventNote] = field(default_factory=list)
    group_statuses: list[tuple[PodGroup, GroupStatus]] = field(default_factory=list)
    queue_statuses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: pods to read again from the apiserver (a conflict, a binding never confirmed)
    resyncs: list[ObjectRef] = field(default_factory=list)
    #: ``status.nominatedNodeName`` to write on preemptors' pods ("" clears it)
    nominated: list[tuple[ObjectRef, str]] = field(default_factory=list)
    #: stale card assignments to remove from pods that are not bound (a binding that
    #: failed after its annotations were written, or a restart in between): the pod,
    #: the annotation keys and the label keys to delete
    cleanups: list[tuple[ObjectRef, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)
    #: ResourceClaims made for pods' extended resources by attempts that bound nothing, to
    #: delete (namespace, name, uid) before those pods are placed again
    claim_deletes: list[tuple[str, str, str]] = field(default_factory=list)
    #: the cycle's plan, when a cycle ran
    plan: Plan | None = None
    #: a unit is owed another step soon (its victim search was deferred)
    again: bool = False


def pod_ref(pod: Pod | Binding | Eviction) -> ObjectRef:
    return ObjectRef(kind="Pod", api_version="v1", namespace=pod.namespace, name=pod.name, uid=pod.uid)


def group_ref(group: PodGroup) -> ObjectRef:
    """What Events about ``group`` are about: its PodGroup, or for a group read from its
    pods (Kueue's) the Workload Kueue made for it, which bears the group's name."""
    return ObjectRef(
        kind="Workload" if group.from_pods else "PodGroup", api_version=group.api_version,
        namespace=group.namespace, name=group.name, uid=group.uid,
    )


def gang_refs(group: PodGroup) -> tuple[ObjectRef, ...]:
    """Every object an Event about the gang (why it waits, that it was placed) goes to:
    the group's own (:func:`group_ref`) and the object that made it, its controller owner
    (a PyTorchJob, a RayCluster...), where a user of that tool looks (``kubectl describe
    pytorchjob``). One step up only: an owner's own owner is not looked for."""
    own = group_ref(group)
    return (own,) if group.owner is None or group.owner == own else (own, group.owner)
