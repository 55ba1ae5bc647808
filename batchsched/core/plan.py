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
from typing import NewType

import numpy as np
import numpy.typing as npt

from batchsched.core.model import Pod

IntArray = npt.NDArray[np.int64]

#: a leaf or inner Queue's name
QueueName = NewType("QueueName", str)

@dataclass(slots=True, frozen=True)
class RunningPod:
    uid: str
    node: int
    """The node's row in the snapshot arrays."""
    req: IntArray
    """The request vector charged to that node (snapshot columns)."""
    gpus: int = 0
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

    @property
    def gpus(self) -> int:
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
    #: why the unit may not be placed at all, when that is known before placement
    blocked: str = ""
    #: the topology level its quorum is kept inside (see :mod:`batchsched.core.placement.topology`),
    #: None for no topology policy; required (else preferred) by ``topology_required``
    topology_level: int | None = None
    topology_required: bool = False
    #: nodes of members already holding resources, in member order (a required topology
    #: keeps the rest of the gang in their domain)
    placed_on: tuple[str, ...] = ()

    @property
    def single(self) -> bool:
        return len(self.pods) == 1 and self.min_count == 1

    @property
    def display(self) -> str:
        """``namespace/name`` of the pod or group (the key without its API prefix)."""
        return self.key.rsplit(":", 1)[-1]

    def order(self) -> tuple[int, float, str]:
        return (-self.priority, self.created, self.uid)


def single_unit(pod: Pod) -> Unit:
    return Unit(
        key=pod.key, pods=(pod,), min_count=1, priority=pod.priority,
        created=pod.created, uid=pod.uid,
    )


@dataclass(slots=True, frozen=True)
class Binding:
    uid: str
    namespace: str
    name: str
    node: str
    unit: str
    #: the topology domain its gang was placed in (``rack r-3``); empty when none was asked
    where: str = ""


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


@dataclass(slots=True)
class Plan:
    bindings: list[Binding] = field(default_factory=list)
    unschedulable: list[Unschedulable] = field(default_factory=list)
    #: unit key -> message, for units that were not placed (gang status)
    failed_units: dict[str, str] = field(default_factory=dict)
    #: unit key -> number of members placed, for units that were placed
    placed_units: dict[str, int] = field(default_factory=dict)
    #: unit key -> where a placed unit with a topology policy went: a domain (``rack r-3``)
    #: or :data:`~batchsched.core.placement.topology.CLUSTER` (a preferred topology that fell back)
    placed_where: dict[str, str] = field(default_factory=dict)
    #: unit key -> condition reason for failed units whose reason is not "Unschedulable"
    reasons: dict[str, str] = field(default_factory=dict)
    #: preemptions decided in this cycle
    preemptions: list[PreemptionRecord] = field(default_factory=list)
    #: every nomination alive after this cycle (carried over and new)
    nominations: list[Nomination] = field(default_factory=list)
    #: unit key -> why it waits, for units holding a nomination
    nominated: dict[str, str] = field(default_factory=dict)
    #: units whose victim search was skipped (search budget spent): retry them soon
    deferred: set[str] = field(default_factory=set)
    #: unit keys in the order they were tried
    tried: list[str] = field(default_factory=list)
    #: victim searches made
    searches: int = 0
    timings: dict[str, float] = field(default_factory=dict)


