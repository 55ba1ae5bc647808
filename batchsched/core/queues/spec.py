"""The Queue CRD: its constants, its value types and its parser.

A :class:`Queue` is parsed from our cluster-scoped CRD ``batchsched.io/v1alpha1`` Queue.
Queues form a tree by ``spec.parent``: a queue with children is a *cohort*; only the leaves
hold work. Per resource a queue has a ``nominal`` quota (what it is guaranteed), an
optional ``borrowingLimit`` (how far above nominal it may go; absent = unlimited) and an
optional ``lendingLimit`` (how much of its nominal its cohort may lend to others; absent =
all of it).

How a queue's own work may be preempted is part of the spec too
(:class:`WithinQueuePolicy`, :class:`ReclaimPolicy`). :func:`parse_queue` turns an object
as the API returns it into a :class:`Queue`, or raises :class:`QueueError` with a one-line
message that names the queue.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from batchsched.core.plan import QueueName
from batchsched.core.quantity import QuantityError, to_units

__all__ = [
    "API_VERSION",
    "DEFAULT_QUEUE_LABEL",
    "KIND",
    "QUEUE_LABEL",
    "QUEUE_STOPPED",
    "VOLCANO_DEFAULT_QUEUE",
    "Queue",
    "QueueError",
    "Quota",
    "ReclaimPolicy",
    "StopPolicy",
    "WithinQueuePolicy",
    "parse_queue",
]

API_VERSION = "batchsched.io/v1alpha1"
KIND = "Queue"
QUEUE_LABEL = "batchsched.io/queue"
DEFAULT_QUEUE_LABEL = "batchsched.io/default-queue"
VOLCANO_DEFAULT_QUEUE = "default"
#: the condition reason of work held because its queue is stopped
QUEUE_STOPPED = "QueueStopped"


class WithinQueuePolicy(StrEnum):
    """Which running units of its own queue a pending unit may preempt."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"


class ReclaimPolicy(StrEnum):
    """Which units of borrowing queues of its cohort a queue may evict to get its nominal back."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class StopPolicy(StrEnum):
    """Whether a queue admits work (``spec.stopPolicy``), as Kueue's ClusterQueue does:
    ``Hold`` admits nothing new (what runs goes on); ``HoldAndDrain`` also evicts what runs,
    whole gangs. A cohort's policy holds for every queue under it."""

    NONE = "None"
    HOLD = "Hold"
    HOLD_AND_DRAIN = "HoldAndDrain"


class QueueError(ValueError):
    """A queue that cannot be used: the one-line message names the queue.

    Reported as a condition on the Queue (and on work naming it); the queue's work is not
    admitted. Never raised into the cycle by :class:`QueueTree`, which collects them.
    """

    def __init__(self, queue: str, problem: str) -> None:
        super().__init__(f"queue {queue}: {problem}")
        self.queue = queue
        self.problem = problem


@dataclass(slots=True, frozen=True)
class Quota:
    """One entry of ``spec.resources``, in the scheduler's integer units."""

    nominal: int | None = None
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(slots=True, frozen=True)
class Queue:
    name: QueueName
    parent: QueueName | None = None
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    weight: float = 1.0
    within_queue: WithinQueuePolicy = WithinQueuePolicy.LOWER_PRIORITY
    reclaim: ReclaimPolicy = ReclaimPolicy.ANY
    stop: StopPolicy = StopPolicy.NONE


# -- parsing ------------------------------------------------------------------------------


def _quantity(queue: str, where: str, resource: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise QueueError(queue, f"{where} is not a quantity: {value!r}")
    try:
        units = to_units(resource, value)
    except QuantityError as exc:
        raise QueueError(queue, f"{where}: {exc}") from None
    if units < 0:
        raise QueueError(queue, f"{where} must not be negative, got {value}")
    return units


def _quotas(queue: str, resources: Any) -> dict[str, Quota]:
    if resources is None:
        return {}
    if not isinstance(resources, list):
        raise QueueError(queue, "spec.resources must be a list")
    out: dict[str, Quota] = {}
    for i, entry in enumerate(resources):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise QueueError(queue, f"spec.resources[{i}] needs a name")
        name: str = entry["name"]
        if name in out:
            raise QueueError(queue, f"resource {name} is listed twice")
        values: dict[str, int | None] = {}
        for key in ("nominal", "borrowingLimit", "lendingLimit"):
            raw = entry.get(key)
            values[key] = None if raw is None else _quantity(queue, f"{name} {key}", name, raw)
        nominal = values["nominal"]
        for key in ("borrowingLimit", "lendingLimit"):
            if values[key] is not None and nominal is None:
                raise QueueError(queue, f"{name} {key} needs a nominal")
        lending = values["lendingLimit"]
        if lending is not None and nominal is not None and lending > nominal:
            raise QueueError(queue, f"{name} lendingLimit {entry['lendingLimit']} exceeds nominal {entry['nominal']}")
        out[name] = Quota(nominal=nominal, borrowing_limit=values["borrowingLimit"], lending_limit=lending)
    return out


def parse_queue(obj: Mapping[str, Any]) -> Queue:
    """A Queue object as the API returns it; raises :class:`QueueError` for a bad spec."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        raise QueueError("<unnamed>", "metadata.name is missing")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise QueueError(name, "spec must be an object")
    parent = spec.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise QueueError(name, f"spec.parent must be a queue name, got {parent!r}")
    if parent == name:
        raise QueueError(name, "is its own parent")
    weight_raw = spec.get("weight", 1)
    if isinstance(weight_raw, bool) or not isinstance(weight_raw, int | float | str):
        raise QueueError(name, f"spec.weight must be a number, got {weight_raw!r}")
    try:
        weight = float(weight_raw)
    except ValueError:
        raise QueueError(name, f"spec.weight must be a number, got {weight_raw!r}") from None
    if not math.isfinite(weight) or weight <= 0:
        raise QueueError(name, f"spec.weight must be greater than 0, got {weight_raw}")
    preemption = spec.get("preemption") or {}
    if not isinstance(preemption, Mapping):
        raise QueueError(name, "spec.preemption must be an object")
    within_raw = preemption.get("withinQueue", WithinQueuePolicy.LOWER_PRIORITY.value)
    reclaim_raw = preemption.get("reclaimWithinCohort", ReclaimPolicy.ANY.value)
    try:
        within = WithinQueuePolicy(within_raw)
    except ValueError:
        known = ", ".join(p.value for p in WithinQueuePolicy)
        raise QueueError(name, f"spec.preemption.withinQueue {within_raw!r} is not one of {known}") from None
    try:
        reclaim = ReclaimPolicy(reclaim_raw)
    except ValueError:
        known = ", ".join(p.value for p in ReclaimPolicy)
        raise QueueError(name, f"spec.preemption.reclaimWithinCohort {reclaim_raw!r} is not one of {known}") from None
    stop_raw = spec.get("stopPolicy") or StopPolicy.NONE.value
    try:
        stop = StopPolicy(stop_raw)
    except ValueError:
        known = ", ".join(p.value for p in StopPolicy)
        raise QueueError(name, f"spec.stopPolicy {stop_raw!r} is not one of {known}") from None
    return Queue(
        name=QueueName(name),
        parent=QueueName(parent) if parent else None,
        quotas=_quotas(name, spec.get("resources")),
        weight=weight,
        within_queue=within,
        reclaim=reclaim,
        stop=stop,
    )

