"""The rows of the job, queue and node views, read off a live session.

A *job* is a unit of scheduling: a PodGroup with its members, or a pod of ours in none.
Its state, in the order checked (the first that holds):

- ``invalid``: the PodGroup or a pod cannot be read, or the queue it names cannot take it;
- ``suspended``: its PodGroup is annotated ``batchsched.io/suspend: "true"``;
- ``running``: its required members are bound (elastic extras may still wait);
- ``queue-stopped``: its queue, or a cohort above it, has a ``stopPolicy``;
- ``gated``: every waiting pod carries a scheduling gate;
- ``preempting``: it preempted others and waits for them to terminate;
- ``reserved``: it holds a reservation (later work may not delay it);
- ``backoff``: its gang timed out below quorum and waits out the back-off;
- ``incomplete``: fewer members exist than it requires;
- ``placing``: some required members are bound, the rest not yet;
- ``queued``: it waits for room.

The position of a waiting job is its place among the waiting jobs of its queue in the
order the cycle tries them within a queue (higher priority first, then older).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchsched.core import explain
from batchsched.core.devices import CARDS_ANY, card_columns_of
from batchsched.core.dra.book import CLASS_COLUMN
from batchsched.core.gangs import K8S, KUEUE, VOLCANO, XK8S, GroupKey, PodGroup
from batchsched.core.model import Pod
from batchsched.core.quantity import MILLI_RESOURCES
from batchsched.core.queues import QueueName, QueueProblem, QueueTree, StopPolicy
from batchsched.core.queues.running import natural
from batchsched.core.session import Session

__all__ = ["API_ORDER", "Job", "amount", "find_job", "groups_named", "jobs", "node_rows", "queue_rows"]

#: states whose jobs wait for a person to act: no start estimate
HELD_STATES = frozenset({"suspended", "queue-stopped", "invalid", "gated"})
WAITING_STATES = frozenset({
    "queued", "reserved", "preempting", "backoff", "incomplete", "placing",
    "gated", "suspended", "queue-stopped", "invalid",
})


@dataclass(slots=True)
class Job:
    """One job as the views show it (see the module docstring)."""

    key: str
    kind: str
    #: the PodGroup's API group (``scheduling.k8s.io`` for Kubernetes' own); "" for a pod
    api: str
    namespace: str
    name: str
    queue: str | None
    priority: int
    created: float
    state: str
    reason: str
    message: str
    bound: int
    required: int
    total: int
    gpus: float
    pods: list[Pod] = field(default_factory=list)
    #: DRA devices its pods' ResourceClaims ask for or hold, per DeviceClass
    devices: dict[str, int] = field(default_factory=dict)
    waiting_since: float | None = None
    position: int | None = None
    #: waiting jobs in its queue that have a position
    queue_length: int | None = None
    ahead: list[str] = field(default_factory=list)
    #: its place in line within its creation second (the scheduler's order: ``Unit.arrival``)
    arrival: int = 0

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    def row(self, now: float, estimate: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "key": self.key, "kind": self.kind, "api": self.api or None, "namespace": self.namespace, "name": self.name,
            "queue": self.queue, "priority": self.priority, "state": self.state,
            "stateText": explain.STATE_WORDS.get(self.state, self.state),
            "reason": self.reason, "message": self.message,
            "members": {"bound": self.bound, "required": self.required, "total": self.total},
            "gpus": round(self.gpus, 3), "devices": dict(self.devices), "created": self.created,
            "wait": None if not self.waiting or self.waiting_since is None else max(0.0, now - self.waiting_since),
            "position": self.position, "queueLength": self.queue_length,
            "ahead": len(self.ahead) if self.position is not None else None,
            "estimate": dict(estimate) if estimate is not None and self.state not in HELD_STATES else {
                "start": None, "inSeconds": None, "confidence": "none",
                "basis": explain.estimate_unknown(explain.ESTIMATE_HELD) if self.state in HELD_STATES else "",
            },
        }


def devices_asked(pods: list[Pod]) -> dict[str, int]:
    """The DRA devices the pods' ResourceClaims ask for (pending) or hold (bound), per
    DeviceClass (:mod:`batchsched.core.dra.book`'s columns)."""
    out: dict[str, int] = {}
    for p in pods:
        for column, n in p.requests.items():
            if column.startswith(CLASS_COLUMN) and n:
                name = column.removeprefix(CLASS_COLUMN)
                out[name] = out.get(name, 0) + n
    return out


def cards_asked(pod: Pod) -> float:
    """GPU cards the pod asks for, a share of a card counted as its fraction."""
    return sum(a.whole + a.share / 1000 for a in pod.card_asks)


def _queue_of(session: Session, pods: list[Pod], group: PodGroup | None,
              tree: QueueTree) -> tuple[str | None, str, str]:
    """``(queue name, problem reason, problem message)``."""
    q = session.queues.queue_of(pods, group, tree)
    if isinstance(q, QueueProblem):
        return q.queue, q.reason, q.message
    if q is not None and tree.stop_policy(q) is not StopPolicy.NONE:
        return str(q), "QueueStopped", explain.queue_stopped(str(q), tree.stop_policy(q).value)
    return (str(q) if q is not None else None), "", ""


def _state(session: Session, key: str, pods: list[Pod], group: PodGroup | None, required: int,
           bound: int, problem: tuple[str, str], now: float) -> tuple[str, str, str]:
    """``(state, reason, message)`` of a job (see the module docstring)."""
    pending = [p for p in pods if not p.node_name]
    told = session.last_word(key) or ("", "")
    if group is not None and group.invalid:
        return "invalid", "InvalidPodGroup", explain.invalid_group(group.described, group.invalid)
    bad = next((p for p in pods if p.invalid), None)
    if bad is not None:
        return "invalid", "InvalidPod", explain.invalid_pod(bad.key, bad.invalid)
    if group is not None and group.suspended:
        return "suspended", "Suspended", explain.suspended(group.display)
    if bound >= required:
        return "running", "", ""
    if problem[0] == "QueueStopped":
        return "queue-stopped", *problem
    if problem[0]:
        return "invalid", *problem
    if pending and all(p.gated for p in pending):
        return "gated", "SchedulingGated", f"{len(pending)} pod(s) carry scheduling gates"
    if key in session.nominations:
        return "preempting", *(told if told[0] else ("WaitingForPreemption", ""))
    if session.holds_reservation(key):
        return "reserved", *told
    if group is not None and session.groups.backing_off(group.key, now):
        return "backoff", "GangBackoff", session.groups.blocked_message(group, now)
    if len(pods) < required:
        return "incomplete", "WaitingForMembers", explain.members_missing(len(pods), required)
    if bound:
        return "placing", *told
    return "queued", *told


def jobs(session: Session, now: float) -> list[Job]:
    """Every job with a pod that waits or runs, positions filled in."""
    state, groups = session.state, session.groups
    tree = session.queues.structure()
    out: list[Job] = []
    in_groups: set[str] = set()
    for group in groups.groups.values():
        pods = [p for uid in groups.member_uids(group) if (p := state.pods.get(uid)) is not None and not p.terminal]
        in_groups.update(p.uid for p in pods)
        if not pods:
            continue
        out.append(_job(session, group.key, "PodGroup", group.api, group.namespace, group.name, pods, group,
                        group.min_member, groups.priority(group, pods), group.created, tree, now))
    for pod in state.pods.values():
        if pod.uid in in_groups or pod.terminal or not state.ours(pod):
            continue
        job = _job(session, pod.key, "Pod", "", pod.namespace, pod.name, [pod], None, 1,
                   pod.priority, pod.created, tree, now)
        if groups.in_group(pod.uid) and job.waiting and job.state != "invalid":
            # it names a PodGroup that does not exist (yet): it waits for it
            job.state, job.reason = "incomplete", "PodGroupNotFound"
        out.append(job)
    _positions(out)
    return out


def _job(session: Session, key: str, kind: str, api: str, namespace: str, name: str, pods: list[Pod],
         group: PodGroup | None, required: int, priority: int, created: float, tree: QueueTree,
         now: float) -> Job:
    assumed = session.state.assumed
    bound = sum(1 for p in pods if p.node_name or p.uid in assumed)
    queue, *problem = _queue_of(session, pods, group, tree)
    st, reason, message = _state(session, key, pods, group, required, bound, (problem[0], problem[1]), now)
    waiting = [p.created for p in pods if not p.node_name and p.uid not in assumed]
    return Job(
        key=key, kind=kind, api=api, namespace=namespace, name=name, queue=queue, priority=priority,
        created=created or min((p.created for p in pods), default=0.0), state=st, reason=reason,
        message=message, bound=bound, required=required, total=len(pods),
        gpus=sum(cards_asked(p) for p in pods), pods=pods, devices=devices_asked(pods),
        waiting_since=min(waiting) if waiting else None,
        arrival=group.arrival if group is not None else pods[0].arrival,
    )


def _positions(all_jobs: Iterable[Job]) -> None:
    by_queue: dict[str | None, list[Job]] = {}
    for j in all_jobs:
        if j.waiting and j.state not in ("invalid", "suspended", "queue-stopped", "gated"):
            by_queue.setdefault(j.queue, []).append(j)
    for waiting in by_queue.values():
        waiting.sort(key=lambda j: (-j.priority, j.created, j.arrival, j.key))
        for i, j in enumerate(waiting):
            j.position = i + 1
            j.queue_length = len(waiting)
            j.ahead = [w.key for w in waiting[:i]]


#: which API's PodGroup ``explain podgroup NAME`` picks when a namespace holds the name in
#: several: Kubernetes' own first, then in the order the kube-batch annotation resolves
#: (Volcano's, then scheduler-plugins'); the answer names the others
API_ORDER = (K8S, VOLCANO, XK8S, KUEUE)


def _api_rank(api: str) -> int:
    return API_ORDER.index(api) if api in API_ORDER else len(API_ORDER)


def groups_named(all_jobs: Iterable[Job], *, namespace: str, name: str) -> list[Job]:
    """The PodGroup jobs named ``namespace/name``, in every API, in :data:`API_ORDER`."""
    found = [j for j in all_jobs if j.kind == "PodGroup" and j.namespace == namespace and j.name == name]
    return sorted(found, key=lambda j: (_api_rank(j.api), j.api))


def find_job(all_jobs: Iterable[Job], *, kind: str, namespace: str, name: str, api: str = "") -> Job | None:
    """The job of a pod (its gang's, when it is in one) or of a PodGroup (of ``api`` when
    given, else the first in :data:`API_ORDER`)."""
    if kind == "podgroup":
        named = [j for j in groups_named(all_jobs, namespace=namespace, name=name) if not api or j.api == api]
        return named[0] if named else None
    for j in all_jobs:
        if kind == "pod" and any(p.namespace == namespace and p.name == name for p in j.pods):
            return j
    return None


# -- queues ---------------------------------------------------------------------------------------


def amount(resource: str, units: int | None) -> float | None:
    """A quantity in the unit people read: cards, cores, bytes."""
    if units is None:
        return None
    return units / 1000 if resource in MILLI_RESOURCES else float(units)


def _unit_name(resource: str) -> str:
    if resource in ("nvidia.com/gpu", "batchsched.io/gpu") or resource.endswith("/gpu"):
        return "cards"
    if resource == "cpu":
        return "cores"
    if resource in ("memory", "ephemeral-storage"):
        return "bytes"
    return ""


def queue_rows(session: Session, now: float, all_jobs: list[Job]) -> list[dict[str, Any]]:
    """One row per Queue object: its spec, what it holds (as last charged), its jobs."""
    charged = session.charged
    structure = session.queues.structure()
    pending: dict[str, int] = {}
    admitted: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for j in all_jobs:
        if j.queue is None:
            continue
        # a cohort counts the jobs of every queue under it
        for q in _up(structure, j.queue):
            if j.state == "running":
                admitted[q] = admitted.get(q, 0) + 1
            elif j.waiting:
                pending[q] = pending.get(q, 0) + 1
                if j.waiting_since is not None:
                    oldest[q] = min(oldest.get(q, now), j.waiting_since)
    rows = []
    for name in sorted(session.queues.queue_objects):
        obj = session.queues.queue_objects[name]
        raw = obj.get("spec")
        spec: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        problem = structure.errors.get(QueueName(name))
        known = name in structure.names
        row: dict[str, Any] = {
            "name": name, "parent": spec.get("parent") if isinstance(spec.get("parent"), str) else None,
            "state": "Invalid", "message": str(problem) if problem is not None else "",
            "weight": structure.queue(name).weight if known else None,
            "pending": pending.get(name, 0), "admitted": admitted.get(name, 0),
            "fairShare": None,
            "oldestWait": (now - oldest[name]) if name in oldest else None,
            "resources": [],
        }
        if known:
            stop = structure.stop_policy(name)
            row["state"] = "Active" if stop is StopPolicy.NONE else stop.value
            row["message"] = "" if stop is StopPolicy.NONE else explain.queue_stopped(name, stop.value)
            row["resources"] = _resources(structure.queue(name).quotas, charged, name)
            if charged is not None and name in charged.names:
                row["fairShare"] = round(charged.share(name), 4)
        rows.append(row)
    return rows


def _up(tree: QueueTree, queue: str) -> list[str]:
    """The queue and the cohorts above it (just the queue when the tree does not hold it)."""
    out = [queue]
    if queue not in tree.names:
        return out
    parent = tree.parent(queue)
    while parent is not None and parent not in out:
        out.append(parent)
        parent = tree.parent(parent)
    return out


def _resources(quotas: Mapping[str, Any], charged: QueueTree | None, name: str) -> list[dict[str, Any]]:
    report = charged.report(name) if charged is not None and name in charged.names else None
    out = []
    # its own quotas, and for a cohort that lists none, its children's sum as the tree has it
    listed = set(quotas) | (set(report.nominal) if report is not None else set())
    gpu_first = sorted(listed, key=lambda r: (_unit_name(r) != "cards", r))
    for r in gpu_first:
        q = quotas.get(r)
        nominal = q.nominal if q is not None else report.nominal.get(r) if report is not None else None
        out.append({
            "name": r, "unit": _unit_name(r),
            "nominal": amount(r, nominal),
            "used": amount(r, report.used.get(r, 0) if report else 0),
            "borrowed": amount(r, report.borrowed.get(r, 0) if report else 0),
            "lent": amount(r, report.lent.get(r, 0) if report else 0),
            "unavailable": amount(r, report.unavailable.get(r, 0) if report else 0),
            "borrowingLimit": amount(r, q.borrowing_limit) if q is not None else None,
            "lendingLimit": amount(r, q.lending_limit) if q is not None else None,
        })
    return out


# -- nodes ----------------------------------------------------------------------------------------


def node_rows(session: Session) -> list[dict[str, Any]]:
    """Each node's readiness and the occupancy of each of its GPU cards (0..1). Cards the
    device plugin hands out by count are shown as the first free ones, filled."""
    state = session.state
    col = {c: i for i, c in enumerate(state.columns)}
    pairs = card_columns_of(col)
    anywhere = col.get(CARDS_ANY)
    rows = []
    for name in sorted(state.nodes, key=natural):
        node = state.nodes[name]
        r = state.node_row.get(name)
        cards: list[dict[str, Any]] = []
        if r is not None:
            for i, (compute, _memory) in enumerate(pairs):
                total = int(state.alloc[r, compute])
                if total > 0:
                    cards.append({"index": i, "used": round(min(1.0, int(state.used[r, compute]) / total), 3)})
            by_count = int(state.used[r, anywhere]) if anywhere is not None else 0
            for c in cards:
                if by_count <= 0:
                    break
                if c["used"] == 0:
                    c["used"] = 1.0
                    by_count -= 1
        rows.append({
            "name": name, "ready": node.ready, "schedulable": not node.unschedulable,
            "cards": cards, "gpus": len(cards), "gpusUsed": round(sum(c["used"] for c in cards), 3),
        })
    return rows


def group_of(session: Session, key: str) -> PodGroup | None:
    return session.groups.groups.get(GroupKey(key))
