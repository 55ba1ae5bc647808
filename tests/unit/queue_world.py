"""A mirror with queues, driven through the real cycle: what the scheduler's loop does
minus the I/O (bindings are confirmed at once, evictions applied when asked).

Used by the queue scenarios on the real :meth:`Cycle.run` and by the property test.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchsched.core.books.nominations import NominationBook
from batchsched.core.cycle import Cycle
from batchsched.core.disruption import parse_pdb
from batchsched.core.gangs import GroupBook, parse_podgroup
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Pod, PodUID, parse_node, parse_pod
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import Nomination, Plan, Unit, single_unit
from batchsched.core.queues import QueueBook, QueueInput, QueueSettings
from tests.builders import make_group, make_node, make_pod


def stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Outcome:
    """One cycle's decisions, by the names the test gave its units and pods."""

    admitted: dict[str, list[str]] = field(default_factory=dict)
    nominated: dict[str, list[str]] = field(default_factory=dict)
    evicted: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


class QueueWorld:
    """Nodes, pods, PodGroups and queues in a mirror; :meth:`step` runs one cycle."""

    def __init__(self, settings: QueueSettings | None = None, *, use_jit: bool = True) -> None:
        self.state = ClusterState()
        self.groups = GroupBook()
        self.book = QueueBook(settings)
        #: the nominations held across cycles (the session's book of them)
        self.nominations = NominationBook(self.book.settings.nomination_timeout)
        self.cycle = Cycle(ScoringConfig(), use_jit=use_jit)
        #: unit key -> the test's name for it
        self.names: dict[str, str] = {}
        self.node_names: list[str] = []
        self.last_input: QueueInput | None = None

    # -- objects

    def node(self, name: str, *, gpu: int = 0, cpu: str = "64", memory: str = "256Gi") -> None:
        self.state.node_event("ADDED", parse_node(make_node(name).cap(cpu=cpu, memory=memory, gpu=gpu).obj()))
        self.node_names.append(name)

    def queues(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.book.replace_queues(list(objs))

    def namespaces(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        self.book.replace_namespaces({"metadata": {"name": ns, "labels": dict(v)}} for ns, v in labels.items())

    def pdbs(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.book.replace_budgets(parse_pdb(o) for o in objs)

    def pod(self, obj: dict[str, Any], kind: str = "MODIFIED") -> Pod:
        pod = parse_pod(obj)
        self.state.pod_event(kind, pod)
        self.groups.pod_event(kind, pod)
        return pod

    def group(self, name: str, *, min_member: int, namespace: str = "default", created: float = 0.0,
              priority_class: str = "", volcano_queue: str | None = None,
              labels: Mapping[str, str] | None = None) -> str:
        g = make_group(name, namespace).min_member(min_member).created(created)
        if priority_class:
            g.priority_class(priority_class)
        if volcano_queue is not None:
            g.volcano().queue(volcano_queue)
        obj = g.obj()
        if labels:
            obj["metadata"]["labels"] = dict(labels)
        group = parse_podgroup("scheduling.volcano.sh" if volcano_queue is not None else "scheduling.x-k8s.io", obj)
        self.groups.group_event("ADDED", group)
        return group.key

    def unit(
        self,
        name: str,
        pods: Sequence[Mapping[str, Any]],
        *,
        namespace: str = "default",
        queue: str | None = None,
        priority: int = 0,
        created: float = 0.0,
        min_member: int | None = None,
        volcano_queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        nodes: Sequence[str | None] | None = None,
        start: float = 0.0,
        again: int = 0,
    ) -> str:
        """Pending (``nodes`` None) or running pods of one unit; returns its unit key.

        One pod and no ``min_member`` or Volcano queue: a single pod named ``name``
        (``name-0`` when running). Otherwise a PodGroup ``name`` with pods ``name-<i>``.
        Each pod spec: ``gpu``, ``cpu``, ``memory``, and ``elastic`` for running extras.
        ``again``: the unit's pods are submitted again (new names: ``name-r<again>...``).
        """
        gang = len(pods) > 1 or min_member is not None or volcano_queue is not None
        running = nodes is not None
        all_labels = dict(labels or {})
        if queue is not None:
            all_labels["batchsched.io/queue"] = queue
        if gang:
            quorum = min_member if min_member is not None else sum(1 for p in pods if not p.get("elastic"))
            key = self.group(name, min_member=max(1, quorum), namespace=namespace, created=created,
                             volcano_queue=volcano_queue)
        for i, spec in enumerate(pods):
            base = f"{name}-r{again}" if again else name
            pod_name = f"{base}-{i}" if gang or running else base
            b = (make_pod(pod_name, namespace).uid(f"{namespace}-{pod_name}").priority(priority).created(created)
                 .req(cpu=str(spec.get("cpu", 1)), memory=str(spec.get("memory", "1Gi"))))
            if spec.get("gpu"):
                b.req(gpu=int(spec["gpu"]))
            if gang:
                b.group(name, via="volcano" if volcano_queue is not None else "x-k8s")
            if all_labels:
                b.label(all_labels)
            obj = b.obj()
            if running:
                assert nodes is not None
                node = nodes[i]
                if node is not None:
                    obj["spec"]["nodeName"] = node
                    # (a start time of 0 would read as "not started": one second later)
                    obj["status"] = {"phase": "Running", "startTime": stamp(start or 1)}
            pod = self.pod(obj, "ADDED")
            if not gang:
                key = pod.key
        self.names[key] = name
        return key

    # -- the cycle

    def units(self) -> list[Unit]:
        singles = [single_unit(p) for uid, p in self.state.pending.items()
                   if not p.gated and not self.groups.in_group(uid)]
        return singles + self.groups.units(self.state, 0.0)

    def step(self, now: float, *, apply: bool = True) -> Plan:
        snap = self.state.snapshot()
        units = self.units()
        qi = self.book.prepare(state=self.state, groups=self.groups, snap=snap, units=units, now=now,
                               nominations=self.live(now))
        self.last_input = qi
        plan = self.cycle.run(snap, units, queues=qi)
        self.book.settle(plan, qi.queue_of)
        self.nominations.settle(plan)
        if apply:
            for b in plan.bindings:
                self.bind(b.uid, b.node, now)
        return plan

    def live(self, now: float) -> tuple[Nomination, ...]:
        """The nominations still worth holding at ``now``, as the session charges them."""
        return self.nominations.live(self.state, self.book.structure(), now)

    def bind(self, uid: str, node: str, now: float) -> None:
        pod = self.state.pods[PodUID(uid)]
        obj = _pod_obj(pod)
        obj["spec"]["nodeName"] = node
        obj["status"] = {"phase": "Running", "startTime": stamp(now)}
        self.pod(obj)

    def delete(self, uid: str) -> Pod | None:
        pod = self.state.pods.get(PodUID(uid))
        if pod is not None:
            self.state.pod_event("DELETED", pod)
            self.groups.pod_event("DELETED", pod)
        return pod

    def outcome(self, plan: Plan, preexisting: Iterable[str] = ()) -> Outcome:
        out = Outcome()
        pod_names = {p.uid: p.name for p in self.state.pods.values()}
        name = self.names
        for key, _n in plan.placed_units.items():
            out.admitted[name[key]] = [b.node for b in plan.bindings if b.unit == key]
        known = set(preexisting)
        for n in plan.nominations:
            if n.unit not in known:
                out.nominated[name[n.unit]] = list(n.nodes)
        for rec in plan.preemptions:
            for v in rec.victims:
                out.evicted[name[v.unit.key]] = (
                    "whole" if v.whole else [pod_names[PodUID(p.uid)] for p in v.pods]
                )
        for key, message in plan.failed_units.items():
            if key in plan.reasons:
                out.problems[name[key]] = message
            else:
                out.pending[name[key]] = message
        out.order = [name[k] for k in plan.tried]
        return out


def _pod_obj(pod: Pod) -> dict[str, Any]:
    """A pod object equivalent to ``pod`` as parsed (enough for the fields the mirror reads)."""
    containers = [{"name": "main", "image": "x", "resources": {"requests": {
        k: str(v) if k != "cpu" else f"{v}m" for k, v in pod.requests.items() if k != "pods"}}}]
    meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                            "labels": dict(pod.labels), "annotations": dict(pod.annotations)}
    if pod.created:
        meta["creationTimestamp"] = stamp(pod.created)
    return {"metadata": meta,
            "spec": {"schedulerName": pod.scheduler_name, "priority": pod.priority, "containers": containers},
            "status": {"phase": pod.phase}}
