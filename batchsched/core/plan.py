"""The values passed between the parts of a scheduling step.

A *unit* is what is placed all at once: a gang of pods, or a single pod (a gang of one).
The cycle turns units into a :class:`Plan`: :class:`Binding` s, :class:`Eviction` s,
:class:`Unschedulable` pods and :class:`PreemptionRecord` s; preemptors keep a
:class:`Nomination` (capacity held for them) between cycles. Running work, as seen by
preemption, is :class:`RunningUnit` s of :class:`RunningPod` s.

Plain frozen values: no behaviour beyond small derived properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NewType

import numpy as np
import numpy.typing as npt

from batchsched.core.model import Pod

IntArray = npt.NDArray[np.int64]

#: a leaf or inner Queue's name
QueueName = NewType("QueueName", str)

@dataclass(slots=True, frozen=True)
class ObjectRef:
    """Which object an Event is about (and, for pods, which pod a condition is written to)."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, obj: Mapping[str, Any], *, kind: str = "Pod", api_version: str = "v1") -> ObjectRef:
        """The reference to an object as the API returns it.

        Items of a LIST carry no ``kind``/``apiVersion``; the keyword arguments stand in.
        """
        meta = obj.get("metadata") or {}
        return cls(
            kind=str(obj.get("kind") or kind),
            api_version=str(obj.get("apiVersion") or api_version),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta["name"]),
            uid=str(meta.get("uid") or ""),
        )


@dataclass(slots=True, frozen=True)
class RunningPod:
    uid: str
    node: int
    """The node's row in the snapshot arrays."""
    req: IntArray
    """The request vector charged to that node (snapshot columns)."""
    gpus: float = 0
    """GPU cards it holds; a share of a card counts its fraction."""
    elastic: bool = False
    """An elastic extra of its gang (beyond the quorum): the first to go."""


@dataclass(slots=True, frozen=True)
class RunningUnit:
    """A running gang or single pod, as a preemption candidate."""

    key: str
    queue: QueueName | None
    priority: int
    created: float
    uid: str
    start: float
    pods: tuple[RunningPod, ...]
    protected: str = ""
    """Why it may not be evicted at all (a PodDisruptionBudget that allows no disruption,
    pods already terminating); empty when it may. Such units are never victims."""
    arrival: int = 0
    """Its place in line within its creation second (:attr:`Unit.arrival`): which of two
    alike units is the newer."""

    @property
    def gpus(self) -> float:
        return sum(p.gpus for p in self.pods)



class VictimKind(StrEnum):
    PRIORITY = "Priority"
    RECLAIM = "Reclaim"


@dataclass(slots=True, frozen=True)
class Victim:
    unit: RunningUnit
    pods: tuple[RunningPod, ...]
    kind: VictimKind
    gpu_hours: float
    message: str
    """Why, for the Event and the ``DisruptionTarget`` condition."""
    borrowed: str = ""
    """For a reclaim: the resource its queue was borrowing."""

    @property
    def whole(self) -> bool:
        return len(self.pods) == len(self.unit.pods)



@dataclass(slots=True, frozen=True)
class Unit:
    """Pods placed together: the first ``min_count`` all or none, the rest as room allows."""

    key: str
    pods: tuple[Pod, ...]
    min_count: int
    priority: int
    created: float
    uid: str
    #: ``preemptionPolicy: Never``: it goes ahead of lower priorities but evicts nobody
    never_preempts: bool = False
    #: why the unit may not be placed at all, when that is known before placement
    blocked: str = ""
    #: the machine-readable reason of ``blocked`` (a condition reason: ``GangBackoff``...)
    blocked_reason: str = ""
    #: why the unit may not be placed yet though it takes its turn: its PodGroup's
    #: ``minResources`` is more than the cluster has free or it may preempt. Unlike
    #: ``blocked``, such a unit keeps its place in its queue and may hold a reservation
    #: (:mod:`batchsched.core.reservation`), so that later small work cannot starve it
    min_resources_short: str = ""
    #: the topology level its quorum is kept inside (see :mod:`batchsched.core.placement.topology`),
    #: None for no topology policy; required (else preferred) by ``topology_required``
    topology_level: int | None = None
    topology_required: bool = False
    #: nodes of members already holding resources, in member order (a required topology
    #: keeps the rest of the gang in their domain)
    placed_on: tuple[str, ...] = ()
    #: the order the watch delivered it, among units created in the same second (a pod's
    #: :attr:`~batchsched.core.model.Pod.arrival`; a PodGroup's, see
    #: :attr:`~batchsched.core.gangs.PodGroup.arrival`)
    arrival: int = 0

    @property
    def single(self) -> bool:
        return len(self.pods) == 1 and self.min_count == 1

    @property
    def display(self) -> str:
        """``namespace/name`` of the pod or group (the key without its API prefix)."""
        return self.key.rsplit(":", 1)[-1]

    def order(self) -> tuple[int, float, int, str]:
        """Higher priority first, then first come, first served: creation time, then the
        order the watch delivered it (:attr:`arrival`); the UID only keeps the order total."""
        return (-self.priority, self.created, self.arrival, self.uid)


def single_unit(pod: Pod) -> Unit:
    return Unit(
        key=pod.key, pods=(pod,), min_count=1, priority=pod.priority,
        created=pod.created, uid=pod.uid, arrival=pod.arrival, never_preempts=pod.never_preempts,
    )


@dataclass(slots=True, frozen=True)
class ClaimWrite:
    """A ResourceClaim's status as it must read before a pod's Binding: the allocation this
    scheduler chose (None for a claim allocated already, which the pod shares) and
    ``reservedFor`` with the pod added. Written with the claim's UID and resourceVersion as
    read, so a claim changed meanwhile is not overwritten."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    allocation: Mapping[str, Any] | None
    reserved_for: tuple[Mapping[str, str], ...]
    #: ``reservedFor`` as read (what a failed Binding restores)
    reserved_before: tuple[Mapping[str, str], ...] = ()
    #: the claim to create first, when it is the one the scheduler makes for the pod's
    #: extended resources (:mod:`batchsched.core.dra.extended`; its name, UID and version
    #: are then known once made, and a failed Binding deletes it)
    create: Mapping[str, Any] | None = None
    #: which of its requests serves which container's extended resource, written in the
    #: pod's ``status.extendedResourceClaimStatus`` before the Binding (with ``create``)
    mappings: tuple[Mapping[str, str], ...] = ()


@dataclass(slots=True, frozen=True)
class Binding:
    uid: str
    namespace: str
    name: str
    node: str
    unit: str
    #: the topology domain its gang was placed in (``rack r-3``); empty when none was asked
    where: str = ""
    #: the GPU cards each of the pod's card asks got (``Pod.card_asks`` order); None: no asks
    cards: tuple[tuple[int, ...], ...] | None = None
    #: annotations and labels to write on the pod before the Binding (the card assignment
    #: a node agent reads); if that write fails, the pod is not bound
    annotations: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    #: the pod's ResourceClaims to allocate and reserve before the Binding; if a write
    #: fails, the pod is not bound and the claims written are put back
    claims: tuple[ClaimWrite, ...] = ()


@dataclass(slots=True, frozen=True)
class Eviction:
    """A bound pod to remove through the Eviction API, with the reason told to its owner.

    ``preemptor`` is the unit key of the preemptor for an eviction by preemption (empty for
    a gang that timed out); such an eviction first sets the pod's ``DisruptionTarget``
    condition with ``reason`` as its message.
    """

    uid: str
    namespace: str
    name: str
    node: str
    unit: str
    reason: str
    preemptor: str = ""
    #: why, for counting: preempted, gang-timeout, suspended, drained
    cause: str = "preempted"


@dataclass(slots=True, frozen=True)
class Unschedulable:
    pod: Pod
    message: str
    unit: str
    #: the ``PodScheduled`` condition's reason
    reason: str = "Unschedulable"


@dataclass(slots=True, frozen=True)
class Nomination:
    """Capacity held for a unit that preempted others, until it is bound or given up.

    The quorum's members (``pods``, by UID) are charged on ``nodes`` (one per member) and
    to ``queue`` in every cycle, and the pods evicted for it (``victims``, by UID) are
    treated as gone, so a smaller unit cannot take the freed capacity while the victims
    terminate. The caller drops a nomination after a timeout, when the unit is gone, or
    when an eviction was refused.
    """

    unit: str
    queue: QueueName | None
    pods: tuple[str, ...]
    nodes: tuple[str, ...]
    requests: tuple[Mapping[str, int], ...]
    victims: frozenset[str]
    since: float
    priority: int = 0


@dataclass(slots=True, frozen=True)
class PreemptionRecord:
    """A preemption decided by the cycle: what to evict, for whom, and what to tell people."""

    preemptor: Unit
    queue: QueueName | None
    nodes: tuple[str, ...]
    victims: tuple[Victim, ...]
    #: per victim, the message of its Events and its ``DisruptionTarget`` condition
    messages: tuple[str, ...]
    #: the message of the preemptor's Event
    summary: str


class UnitStatus(StrEnum):
    """What became of a unit in one cycle (in the spirit of kube-scheduler's status codes).

    ``UNSCHEDULABLE`` may change when capacity or quota does; ``UNRESOLVABLE`` needs the
    user to change something (an invalid pod or group, an unknown queue); ``WAITING``
    needs time, not capacity (members still arriving, a back-off, victims terminating).
    """

    SCHEDULED = "Scheduled"
    PREEMPTING = "Preempting"
    WAITING = "Waiting"
    UNSCHEDULABLE = "Unschedulable"
    UNRESOLVABLE = "UnschedulableAndUnresolvable"


#: which result wins when a cycle records two for one unit
_RANK = {
    UnitStatus.SCHEDULED: 3, UnitStatus.PREEMPTING: 2, UnitStatus.WAITING: 2,
    UnitStatus.UNSCHEDULABLE: 1, UnitStatus.UNRESOLVABLE: 1,
}


@dataclass(slots=True, frozen=True)
class UnitResult:
    """One unit's outcome: a status, a stable reason (the ``PodScheduled`` or PodGroup
    condition reason), the message a person reads, and for a placed unit how many members
    went and where (a topology domain such as ``rack r-3``, or
    :data:`~batchsched.core.placement.topology.CLUSTER` when a preferred one fell back)."""

    status: UnitStatus
    reason: str
    message: str = ""
    placed: int = 0
    where: str = ""

    @property
    def failed(self) -> bool:
        return _RANK[self.status] == 1

    @property
    def holding(self) -> bool:
        """It preempted others, or waits for its victims to go, holding their capacity."""
        return self.reason in _HOLDING and self.status in (UnitStatus.PREEMPTING, UnitStatus.WAITING)


@dataclass(slots=True)
class Plan:
    """The decisions of one cycle."""

    bindings: list[Binding] = field(default_factory=list)
    unschedulable: list[Unschedulable] = field(default_factory=list)
    #: unit key -> what became of it in this cycle (every unit tried or reported)
    results: dict[str, UnitResult] = field(default_factory=dict)
    #: preemptions decided in this cycle
    preemptions: list[PreemptionRecord] = field(default_factory=list)
    #: every nomination alive after this cycle (carried over and new)
    nominations: list[Nomination] = field(default_factory=list)
    #: units whose victim search was skipped (search budget spent): retry them soon
    deferred: set[str] = field(default_factory=set)
    #: units whose quorum their queue's quota did not admit (they wait for usage to fall)
    quota_blocked: set[str] = field(default_factory=set)
    #: unit keys in the order they were tried
    tried: list[str] = field(default_factory=list)
    #: the walk stopped at its time budget with units not tried yet (they are tried in the
    #: next cycle, at once): the Bindings found so far leave first
    unfinished: bool = False
    #: victim searches made
    searches: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def record(self, key: str, result: UnitResult, *, keep_first: bool = False) -> None:
        """Set ``key``'s result: placed beats preempting or waiting beats failed; within a
        rank the last word wins (the first with ``keep_first``)."""
        old = self.results.get(key)
        if old is not None:
            new_rank, old_rank = _RANK[result.status], _RANK[old.status]
            if new_rank < old_rank or (new_rank == old_rank and keep_first):
                return
        self.results[key] = result

    # views of ``results`` by status, built on each call: for readers that want one kind
    # once, never inside a loop over units (look ``results`` up instead)
    @property
    def failed_units(self) -> dict[str, str]:
        """unit key -> message, for units that were not placed."""
        return {k: r.message for k, r in self.results.items() if r.failed}

    @property
    def reasons(self) -> dict[str, str]:
        """unit key -> condition reason, for failed units whose reason is not Unschedulable."""
        return {
            k: r.reason for k, r in self.results.items() if r.failed and r.reason != "Unschedulable"
        }

    @property
    def placed_units(self) -> dict[str, int]:
        """unit key -> number of members placed."""
        return {k: r.placed for k, r in self.results.items() if r.status is UnitStatus.SCHEDULED}

    @property
    def placed_where(self) -> dict[str, str]:
        """unit key -> the domain a placed unit with a topology policy went to."""
        return {
            k: r.where for k, r in self.results.items()
            if r.status is UnitStatus.SCHEDULED and r.where
        }

    @property
    def nominated(self) -> dict[str, str]:
        """unit key -> why it waits, for units holding capacity after a preemption."""
        return {k: r.message for k, r in self.results.items() if r.holding}


_HOLDING = ("Preempting", "WaitingForPreemption")

#: reasons a unit is held back before placement that time alone resolves
_WAITING_REASONS = frozenset({"GangBackoff", "GangEvicting", "WaitingForMembers", "PodGroupNotFound"})
#: reasons that need the user to change an object
_UNRESOLVABLE_REASONS = frozenset({"InvalidPodGroup", "InvalidTopology", "Suspended"})


#: the condition reason of a unit that is not placed because of :attr:`Unit.min_resources_short`
INSUFFICIENT_MIN_RESOURCES = "InsufficientMinResources"


def blocked_status(unit: Unit) -> UnitStatus:
    """The status of a unit held back before placement (:attr:`Unit.blocked`)."""
    if unit.blocked_reason in _WAITING_REASONS:
        return UnitStatus.WAITING
    if unit.blocked_reason in _UNRESOLVABLE_REASONS:
        return UnitStatus.UNRESOLVABLE
    return UnitStatus.UNSCHEDULABLE
