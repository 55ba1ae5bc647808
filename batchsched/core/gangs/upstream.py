"""Kubernetes' own pod groups: ``scheduling.k8s.io/v1beta1`` PodGroup (Kubernetes 1.36+).

A pod joins one by ``spec.schedulingGroup.podGroupName`` (a PodGroup of its namespace).
What the PodGroup's spec says, as batchsched reads it:

- ``schedulingPolicy.gang.minCount``: the quorum, placed whole or not at all; members
  beyond it are elastic. ``schedulingPolicy.basic``: no quorum (one member is enough); the
  members are placed as room allows but stay one unit for queues and preemption;
- ``schedulingConstraints.topology[].key``: a node label key; the gang goes inside one
  domain of it. The key must be one of the configured topology levels
  (``topology.levels``), else the group waits and says so;
- ``priorityClassName`` / ``priority`` (the apiserver fills ``priority`` in from the class)
  and ``preemptionPolicy`` (``Never``: the gang never evicts anyone) hold for the whole
  group, before its members' own;
- ``disruptionMode``: ``all`` restarts the whole gang when a running member is lost (as
  the ``batchsched.io/whole-job-restart`` annotation does; ``all`` wins over the annotation,
  and since the apiserver writes ``single`` when nothing is set, ``single`` leaves the
  choice to the annotation and the configuration). Preemption takes whole gangs in both
  modes: a gang left below its quorum cannot run;
- ``workloadRef`` names the Workload the group was made from. Like kube-scheduler 1.37,
  batchsched reads the PodGroup alone: it carries everything placement needs.

Refused visibly (the group is invalid, its pods are never placed): members of a
composite pod group (``parentCompositePodGroupName``), PodGroup ``resourceClaims``
(dynamic resource allocation is not read yet), and a scheduling policy that is neither
``basic`` nor ``gang``.

Status: batchsched writes the conditions kube-scheduler writes, so ``kubectl`` and Kueue
read its groups alike: ``PodGroupInitiallyScheduled`` (False, reason ``Unschedulable``
with batchsched's own explanation as the message, or ``SchedulerError`` for a group it
refuses; True, reason ``Scheduled``, once the quorum is placed, and never False again) and
``DisruptionTarget`` (True, reason ``PreemptionByScheduler``, while the group is being
preempted; False once it is placed again).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COND_DISRUPTION",
    "COND_SCHEDULED",
    "K8S",
    "REASON_PREEMPTED",
    "UpstreamPolicy",
    "read_conditions",
    "read_spec",
]

K8S = "scheduling.k8s.io"
COND_SCHEDULED = "PodGroupInitiallyScheduled"
COND_DISRUPTION = "DisruptionTarget"
REASON_PREEMPTED = "PreemptionByScheduler"

_INT32_MAX = 2**31 - 1


@dataclass(slots=True, frozen=True)
class UpstreamPolicy:
    """What a ``scheduling.k8s.io`` PodGroup's spec asks beyond its quorum."""

    #: ``spec.priority`` (None: not set; the class or the members decide)
    priority: int | None = None
    #: ``spec.preemptionPolicy`` is ``Never``
    never_preempts: bool = False
    #: ``disruptionMode.all``: a lost member restarts the whole gang
    disruption_all: bool = False
    #: ``schedulingConstraints.topology[0].key``: the node label whose domain holds the gang
    topology_key: str = ""


def read_spec(spec: Mapping[str, Any]) -> tuple[int, UpstreamPolicy, list[str]]:
    """``(quorum, policy, problems)`` of a ``scheduling.k8s.io`` PodGroup's spec; never
    raises. A problem makes the group invalid (its pods wait and are told why). The basic
    policy is a quorum of one: members are placed as room allows, as one unit."""
    problems: list[str] = []
    quorum = 1
    policy = spec.get("schedulingPolicy")
    policy = policy if isinstance(policy, Mapping) else {}
    gang, plain = policy.get("gang"), policy.get("basic")
    if isinstance(gang, Mapping) and plain is None:
        count = gang.get("minCount")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= _INT32_MAX:
            problems.append(f"spec.schedulingPolicy.gang.minCount must be a positive integer, got {count!r}")
        else:
            quorum = count
    elif not (isinstance(plain, Mapping) and gang is None):
        problems.append("spec.schedulingPolicy must set exactly one of basic and gang")
    if spec.get("parentCompositePodGroupName"):
        problems.append(
            f"it belongs to the composite pod group {spec['parentCompositePodGroupName']!s} "
            "(parentCompositePodGroupName): batchsched does not schedule composite pod groups yet"
        )
    if spec.get("resourceClaims"):
        problems.append(
            "spec.resourceClaims: batchsched does not allocate PodGroup resource claims "
            "(dynamic resource allocation) yet"
        )
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        problems.append(f"spec.priority must be an integer, got {priority!r}")
        priority = None
    mode = spec.get("disruptionMode")
    mode = mode if isinstance(mode, Mapping) else {}
    topology = ""
    constraints = spec.get("schedulingConstraints")
    terms = constraints.get("topology") if isinstance(constraints, Mapping) else None
    if terms:
        keys = [t.get("key") for t in terms if isinstance(t, Mapping)] if isinstance(terms, list) else []
        if len(keys) != 1 or not isinstance(keys[0], str) or not keys[0]:
            problems.append(f"spec.schedulingConstraints.topology must name one node label key, got {terms!r}")
        else:
            topology = keys[0]
    return quorum, UpstreamPolicy(
        priority=priority,
        never_preempts=spec.get("preemptionPolicy") == "Never",
        disruption_all=mode.get("all") is not None,
        topology_key=topology,
    ), problems


def read_conditions(status: Mapping[str, Any]) -> tuple[bool, str, str, str]:
    """``(scheduled, reason, message, disruption)`` from a ``scheduling.k8s.io`` PodGroup's
    conditions; ``disruption`` is the message of a True ``DisruptionTarget``."""
    scheduled, reason, message, disruption = False, "", "", ""
    for c in status.get("conditions") or []:
        if not isinstance(c, Mapping):
            continue
        if c.get("type") == COND_SCHEDULED:
            scheduled = c.get("status") == "True"
            reason, message = str(c.get("reason") or ""), str(c.get("message") or "")
        elif c.get("type") == COND_DISRUPTION and c.get("status") == "True":
            disruption = str(c.get("message") or REASON_PREEMPTED)
    return scheduled, reason, message, disruption
