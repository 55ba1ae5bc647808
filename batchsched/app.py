"""The running scheduler: watches in, one cycle loop, binder and status writers out.

Everything here is I/O and wiring; decisions are made by :class:`batchsched.core.cycle.Cycle`
over a snapshot of :class:`batchsched.core.mirror.ClusterState`. The event loop is the
single writer of the state: watch callbacks and bind results mutate it between cycles,
and a cycle runs synchronously, so it never sees a half-applied event.

Loop::

    wait for a reason to run (a new pending pod, capacity freed or added, a bind failed,
    or the slow retry timer) -> gang timers (evict gangs stuck below quorum) -> snapshot
    -> queue input (queues, running work, nominations) -> cycle over single pods and gangs
    -> assume each binding and hand it to the binder -> mark and evict preemption victims
    -> write FailedScheduling for pods whose reason changed -> PodGroup statuses of the
    groups that changed -> Queue statuses (at most every few seconds)

Two clocks: the monotonic one for back-offs and timers, the wall clock for what is compared
with object times (creation, start, the age of a nomination).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from batchsched.config import Config, ConfigError, load_config
from batchsched.core.cycle import Cycle
from batchsched.core.disruption import parse_pdb
from batchsched.core.gangs import (
    VOLCANO,
    XK8S,
    GroupBook,
    GroupKey,
    PodGroup,
    desired_status,
    free_capacity,
    parse_podgroup,
)
from batchsched.core.mirror import ClusterState
from batchsched.core.model import PodUID, parse_node, parse_pod
from batchsched.core.placement import kernels
from batchsched.core.placement.topology import (
    CLUSTER,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
)
from batchsched.core.plan import Binding, Eviction, Plan, Unit, single_unit
from batchsched.core.queues import QUEUE_LABEL, QueueBook, QueueInput, QueueSettings
from batchsched.kube.binder import Binder
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import KubeError, NotFoundError
from batchsched.kube.evictor import Evictor
from batchsched.kube.groupstatus import GroupStatusWriter, group_ref
from batchsched.kube.leader import LeaderElector
from batchsched.kube.queuestatus import QUEUES_PATH, QueueStatusWriter
from batchsched.kube.status import ObjectRef, StatusWriter, rfc3339
from batchsched.kube.watch import Reflector
from batchsched.metrics import Metrics

log = logging.getLogger("batchsched")


def pod_ref(namespace: str, name: str, uid: str) -> ObjectRef:
    return ObjectRef(kind="Pod", api_version="v1", namespace=namespace, name=name, uid=uid)


PODGROUP_PATHS = {
    XK8S: "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
    VOLCANO: "/apis/scheduling.volcano.sh/v1beta1/podgroups",
}
#: a full pass over every group's status, besides the groups known to have changed
_GROUP_SWEEP_SECONDS = 5.0
#: how often the gang timers are looked at
_GANG_CHECK_SECONDS = 0.5
#: a waiting gang's message changes with every change of capacity ("only 12 fit now"); its
#: PodGroup condition follows each change (one write), its pods at most this often (a
#: write per member)
_GANG_POD_MESSAGE_SECONDS = 30.0


def _spec(group: PodGroup) -> tuple[Any, ...]:
    """What of a group decides its placement (its status, which we write, does not)."""
    return (
        group.min_member, dict(group.min_resources), dict(group.min_task_member),
        group.priority_class, group.invalid, group.uid, group.queue, group.labels.get(QUEUE_LABEL),
        group.annotations.get(TOPOLOGY_ANNOTATION), group.annotations.get(TOPOLOGY_PREFERRED_ANNOTATION),
    )


def queue_settings(config: Config) -> QueueSettings:
    q, p = config.queues, config.preemption
    return QueueSettings(
        default_queue=q.default_queue,
        max_wait=q.max_wait_seconds,
        history_half_life=q.history.half_life_seconds,
        history_weight=q.history.weight,
        preemption=p.enabled,
        nomination_timeout=p.nomination_timeout_seconds,
        max_searches=p.max_searches_per_cycle,
    )


class Scheduler:
    """One replica. ``await run()`` until :meth:`stop` (or SIGTERM through :func:`serve`)."""

    def __init__(
        self,
        client: KubeClient,
        config: Config,
        *,
        metrics: Metrics | None = None,
        identity: str | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.metrics = metrics or Metrics()
        self.identity = identity or config.identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.state = ClusterState(config.scheduler_names)
        self.cycle = Cycle(config.scoring_config(), levels=config.topology_levels())
        self.binder = Binder(
            client, concurrency=config.binder.concurrency, retries=config.binder.retries,
            on_result=self._bind_result,
        )
        self.status = StatusWriter(client, instance=self.identity, concurrency=config.status.concurrency)
        gang = config.gang
        self.groups = GroupBook(
            default_timeout=gang.default_schedule_timeout_seconds,
            initial_backoff=gang.initial_backoff_seconds,
            max_backoff=gang.max_backoff_seconds,
            levels=config.topology_levels(),
        )
        self.evictor = Evictor(client, concurrency=gang.eviction_concurrency, on_result=self._evict_result)
        self.group_status = GroupStatusWriter(client)
        self.queues = QueueBook(queue_settings(config))
        self.queue_status = QueueStatusWriter(client)
        self._last_queue_status = -1e9
        #: preemptor unit key -> the objects its Events go to
        self._preemptor_refs: dict[str, list[ObjectRef]] = {}
        #: (preemptor, victim unit) pairs already told on the victim's group
        self._told_groups: set[tuple[str, str]] = set()
        #: group unit key -> (capacity generation, time) of its last failed placement
        self._group_attempts: dict[str, tuple[int, float]] = {}
        #: group unit key -> (reason, message) of why it was not placed in the last cycle
        self._unit_message: dict[str, tuple[str, str]] = {}
        #: group unit key -> when it was first found blocked (its pods are told after a delay)
        self._blocked_since: dict[str, float] = {}
        self._schedule_start: dict[GroupKey, str] = {}
        self._reported_invalid: dict[GroupKey, str] = {}
        self._dirty_groups: set[GroupKey] = set()
        self._last_sweep = 0.0
        #: gang unit key -> (message, time) last told its pods
        self._pods_told: dict[str, tuple[str, float]] = {}
        self._last_gang_check = -1e9
        self.ready = False
        self.leading = asyncio.Event()
        self.cycles = 0
        self.http_port: int | None = None
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        #: uid -> (capacity generation, time) of the last failed attempt
        self._attempts: dict[PodUID, tuple[int, float]] = {}
        self._assumed_at: dict[PodUID, float] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self.elector: LeaderElector | None = None
        self.reflectors = [
            Reflector(client, "/api/v1/nodes", on_list=self._nodes_listed, on_event=self._node_event, name="nodes"),
            Reflector(client, "/api/v1/pods", on_list=self._pods_listed, on_event=self._pod_event, name="pods"),
            Reflector(
                client, "/apis/scheduling.k8s.io/v1/priorityclasses", on_list=self._priority_classes_listed,
                on_event=self._priority_class_event, name="priorityclasses",
            ),
        ]
        self.reflectors += [
            Reflector(client, QUEUES_PATH, on_list=self._queues_listed, on_event=self._queue_event, name="queues"),
            Reflector(client, "/api/v1/namespaces", on_list=self._namespaces_listed,
                      on_event=self._namespace_event, name="namespaces"),
            Reflector(client, "/apis/policy/v1/poddisruptionbudgets", on_list=self._budgets_listed,
                      on_event=self._budget_event, name="poddisruptionbudgets"),
        ]
        for api, path in PODGROUP_PATHS.items():
            self.reflectors.append(Reflector(
                client, path, name=f"podgroups.{api}",
                on_list=lambda items, api=api: self._groups_listed(api, items),  # type: ignore[misc]
                on_event=lambda kind, obj, api=api: self._group_event(api, kind, obj),  # type: ignore[misc]
            ))

    # -- watch callbacks (the only writers of the state, with bind results) ------------------

    def _nodes_listed(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_nodes(parse_node(o) for o in items)
        self._wake.set()

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels("nodes").inc()
        before = self.state.capacity_generation
        self.state.node_event(kind, parse_node(obj))
        if self.state.capacity_generation != before:
            self._wake.set()

    def _pods_listed(self, items: list[dict[str, Any]]) -> None:
        pods = [parse_pod(o) for o in items]
        self.state.replace_pods(pods)
        self.groups.replace_pods(pods)
        self._dirty_groups.update(self.groups.groups)
        self._wake.set()

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels("pods").inc()
        pod = parse_pod(obj)
        before = self.state.capacity_generation
        was_pending = pod.uid in self.state.pending
        group = self.groups.group_of(pod.uid)
        self.state.pod_event(kind, pod)
        self.groups.pod_event(kind, pod)
        for g in (group, self.groups.group_of(pod.uid)):
            if g is not None:
                self._dirty_groups.add(g.key)
                if pod.uid in self.state.pending:
                    # a member arrived or changed: try the gang again
                    self._group_attempts.pop(g.key, None)
        if kind == "DELETED" or pod.holds_resources or pod.terminal:
            self._attempts.pop(pod.uid, None)
            self._assumed_at.pop(pod.uid, None)
            if kind == "DELETED":
                self.status.forget(pod.uid)
        if self.state.capacity_generation != before or (
            pod.uid in self.state.pending and not was_pending
        ):
            self._wake.set()
        elif pod.uid in self.state.pending and self._attempts.get(pod.uid) is not None:
            # the pod itself changed (new tolerations, gates removed...): try it again
            self._attempts.pop(pod.uid, None)
            self._wake.set()

    def _groups_listed(self, api: str, items: list[dict[str, Any]]) -> None:
        groups = [parse_podgroup(api, o) for o in items]
        gone = {k for k, g in self.groups.groups.items() if g.api == api} - {g.key for g in groups}
        for key in gone:
            self.group_status.forget(key)
        self.groups.replace_groups(api, groups)
        self._dirty_groups.update(g.key for g in groups)
        self._group_attempts.clear()
        self._wake.set()

    def _group_event(self, api: str, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels(f"podgroups.{api}").inc()
        group = parse_podgroup(api, obj)
        old = self.groups.groups.get(group.key)
        self.groups.group_event(kind, group)
        changed = kind == "DELETED" or old is None or _spec(old) != _spec(group)
        if changed:
            self._group_attempts.pop(group.key, None)
            self._pods_told.pop(f"missing:{group.display}", None)
            self._wake.set()
        if kind == "DELETED":
            self.group_status.forget(group.key)
            self._reported_invalid.pop(group.key, None)
            self._schedule_start.pop(group.key, None)
            self._unit_message.pop(group.key, None)
            self._pods_told.pop(group.key, None)
        else:
            self._dirty_groups.add(group.key)

    def _queues_changed(self, before: int) -> None:
        """Which queue a unit goes to, or whether it fits its quota, may have changed."""
        if self.queues.generation != before:
            self._attempts.clear()
            self._group_attempts.clear()
            self._last_queue_status = -1e9
            self._wake.set()

    def _queues_listed(self, items: list[dict[str, Any]]) -> None:
        before = self.queues.generation
        gone = set(self.queues.queue_objects) - {str(o["metadata"]["name"]) for o in items}
        for name in gone:
            self.queue_status.forget(name)
        self.queues.replace_queues(items)
        self._queues_changed(before)

    def _queue_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels("queues").inc()
        before = self.queues.generation
        self.queues.queue_event(kind, obj)
        if kind == "DELETED":
            self.queue_status.forget(str(obj["metadata"]["name"]))
        self._queues_changed(before)

    def _namespaces_listed(self, items: list[dict[str, Any]]) -> None:
        before = self.queues.generation
        self.queues.replace_namespaces(items)
        self._queues_changed(before)

    def _namespace_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels("namespaces").inc()
        before = self.queues.generation
        self.queues.namespace_event(kind, obj)
        self._queues_changed(before)

    def _budgets_listed(self, items: list[dict[str, Any]]) -> None:
        self.queues.replace_budgets(parse_pdb(o) for o in items)

    def _budget_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.metrics.watch_events.labels("poddisruptionbudgets").inc()
        budget = parse_pdb(obj)
        old = self.queues.budgets.get(budget.namespace, budget.name)
        self.queues.budget_event(kind, budget)
        if old is not None and old.allowed == 0 and (kind == "DELETED" or budget.allowed > 0):
            # work it protected may be preempted now: look at waiting units again
            self._attempts.clear()
            self._group_attempts.clear()
            self._wake.set()

    def _priority_classes_listed(self, items: list[dict[str, Any]]) -> None:
        self.groups.replace_priority_classes(
            {str(o["metadata"]["name"]): int(o.get("value") or 0) for o in items}
        )

    def _priority_class_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.groups.priority_class_event(kind, str(obj["metadata"]["name"]), int(obj.get("value") or 0))

    # -- binding results -------------------------------------------------------------------------

    def _bind_result(self, b: Binding, outcome: str, err: KubeError | None) -> None:
        self.metrics.binds.labels(outcome).inc()
        uid = PodUID(b.uid)
        if outcome == "bound":
            if self.config.status.scheduled_events:
                self.status.pod_scheduled(pod_ref(b.namespace, b.name, b.uid), b.node, where=b.where)
            return
        self._assumed_at.pop(uid, None)
        self.state.forget(uid)
        group = self.groups.group_of(uid)
        if group is not None:
            # the rest of the gang is retried as its remainder at once
            self._group_attempts.pop(group.key, None)
            self._dirty_groups.add(group.key)
        if outcome == "conflict":
            self._resync(b.namespace, b.name, uid)
        elif outcome == "failed":
            self._attempts[uid] = (self.state.capacity_generation, time.monotonic())
        self._wake.set()

    def _resync(self, namespace: str, name: str, uid: PodUID) -> None:
        async def fetch() -> None:
            try:
                obj = await self.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            except NotFoundError:
                pod = self.state.pods.get(uid)
                if pod is not None:
                    self.state.pod_event("DELETED", pod)
                return
            except KubeError as exc:
                log.warning("resync of %s/%s failed: %s", namespace, name, exc)
                return
            if obj.get("metadata", {}).get("uid") != uid:
                old = self.state.pods.get(uid)
                if old is not None:
                    self.state.pod_event("DELETED", old)
            self._pod_event("MODIFIED", obj)

        self._tasks.append(asyncio.get_running_loop().create_task(fetch()))

    # -- evictions (gangs that timed out) -----------------------------------------------------------

    def _evict_result(self, e: Eviction, outcome: str, err: KubeError | None) -> None:
        if e.preemptor:
            self._preemption_result(e, outcome, err)
            return
        key = GroupKey(e.unit)
        group = self.groups.groups.get(key)
        self._dirty_groups.add(key)
        if outcome != "evicted":
            self.groups.eviction_done(key, PodUID(e.uid))
        if group is None:
            return
        ref = group_ref(group)
        if outcome == "evicted":
            message = f"evicted member {e.name} from node {e.node}: {e.reason}"
            self.status.event(ref, type="Normal", reason="GangEvicted", message=message)
            self.status.event(pod_ref(e.namespace, e.name, e.uid), type="Normal", reason="GangEvicted", message=message)
        elif outcome == "failed":
            self.status.event(ref, type="Warning", reason="GangEvictionFailed",
                              message=f"could not evict member {e.name} (will retry): {err}")

    def _preemption_result(self, e: Eviction, outcome: str, err: KubeError | None) -> None:
        """A victim's eviction: tell who preempted it, or give the preemption up."""
        victim = pod_ref(e.namespace, e.name, e.uid)
        group = self.groups.groups.get(GroupKey(e.unit))
        if outcome == "evicted":
            self.metrics.attempts.labels("preempted").inc()
            self.status.event(victim, type="Normal", reason="Preempted", message=e.reason)
            if group is not None and (e.preemptor, e.unit) not in self._told_groups:
                self._told_groups.add((e.preemptor, e.unit))
                self.status.event(group_ref(group), type="Normal", reason="Preempted", message=e.reason)
            return
        if outcome == "gone":
            return  # nothing left to evict: the capacity is free
        dropped = self.queues.drop(e.preemptor)
        why = (
            "a PodDisruptionBudget allows no disruption of it now" if outcome == "blocked"
            else f"the eviction failed: {err}"
        )
        message = f"could not preempt {e.namespace}/{e.name} ({why}); the preemption is given up and retried later"
        log.info("preemption for %s: %s", e.preemptor, message)
        if dropped is not None:
            for ref in self._preemptor_refs.get(e.preemptor, []):
                self.status.event(ref, type="Warning", reason="PreemptionBlocked", message=message)
        self.status.event(victim, type="Normal", reason="PreemptionBlocked", message=message)
        # try again: the unit may find other victims, or the same once the budget allows
        for uid in (dropped.pods if dropped is not None else ()):
            self._attempts.pop(PodUID(uid), None)
        self._group_attempts.pop(e.preemptor, None)
        self._wake.set()

    def _preempt(self, plan: Plan) -> None:
        """Carry out the cycle's preemptions: Events, then each victim marked and evicted."""
        for rec in plan.preemptions:
            unit = rec.preemptor
            group = self.groups.groups.get(GroupKey(unit.key))
            refs = [group_ref(group)] if group is not None else [
                pod_ref(p.namespace, p.name, p.uid) for p in unit.pods
            ]
            self._preemptor_refs[unit.key] = refs
            for ref in refs:
                self.status.event(ref, type="Normal", reason="Preempting", message=rec.summary)
            for victim, message in zip(rec.victims, rec.messages, strict=True):
                for rp in victim.pods:
                    pod = self.state.pods.get(PodUID(rp.uid))
                    if pod is None or pod.deleting:
                        continue
                    self.evictor.submit(Eviction(
                        uid=pod.uid, namespace=pod.namespace, name=pod.name, node=pod.node_name,
                        unit=victim.unit.key, reason=message, preemptor=unit.key,
                    ))
        live = {n.unit for n in plan.nominations}
        for key in [k for k in self._preemptor_refs if k not in live]:
            del self._preemptor_refs[key]
        self._told_groups = {t for t in self._told_groups if t[0] in live}

    def _check_gangs(self, now: float) -> None:
        """Gangs below quorum: start their timers, evict those that ran out of time."""
        if now - self._last_gang_check < _GANG_CHECK_SECONDS:
            return
        self._last_gang_check = now
        check = self.groups.check(self.state, now)
        for n in check.notices:
            self._dirty_groups.add(n.group.key)
            self.status.event(group_ref(n.group), type=n.type, reason=n.reason, message=n.message)
        for e in check.evictions:
            self.evictor.submit(e)

    # -- the loop ----------------------------------------------------------------------------------

    def schedulable_units(self, now: float) -> list[Unit]:
        retry = self.config.cycle.retry_unschedulable_seconds
        gen = self.state.capacity_generation
        nominated = self.queues.nominations
        units = []
        for uid, pod in self.state.pending.items():
            if pod.gated or self.groups.in_group(uid):
                continue
            seen = self._attempts.get(uid)
            if seen is not None and seen[0] == gen and now - seen[1] < retry and pod.key not in nominated:
                continue
            units.append(single_unit(pod))
        free: dict[str, int] | None = None

        def cluster_free() -> dict[str, int]:
            nonlocal free
            if free is None:
                free = free_capacity(self.state.snapshot())
            return free

        for unit in self.groups.units(self.state, now, cluster_free):
            seen = self._group_attempts.get(unit.key)
            if (not unit.blocked and seen is not None and seen[0] == gen and now - seen[1] < retry
                    and unit.key not in nominated):
                continue
            units.append(unit)
        return units

    def run_cycle(self) -> int:
        """One cycle now; returns the number of bindings handed to the binder."""
        now = time.monotonic()
        units = self.schedulable_units(now)
        self.metrics.pending_pods.set(len(self.state.pending))
        if not units:
            return 0
        gen = self.state.capacity_generation
        wall = time.time()
        for n in self.queues.expired(self.state, wall):
            message = (
                f"gave up the capacity held for it on node(s) {', '.join(sorted(set(n.nodes)))} "
                f"after {self.config.preemption.nomination_timeout_seconds:g} s; it is tried again as usual"
            )
            for ref in self._preemptor_refs.get(n.unit, []):
                self.status.event(ref, type="Warning", reason="NominationExpired", message=message)
        t0 = time.perf_counter()
        snap = self.state.snapshot()
        t1 = time.perf_counter()
        queues = self.queues.prepare(state=self.state, groups=self.groups, snap=snap, units=units, now=wall)
        plan = self.cycle.run(snap, units, queues=queues)
        self.queues.settle(plan, queues.queue_of)
        self.cycles += 1
        gangs = {u.key: u for u in units if not (u.single and u.key == u.pods[0].key)}
        for b in plan.bindings:
            uid = PodUID(b.uid)
            self.state.assume(uid, b.node)
            self._attempts.pop(uid, None)
            self._assumed_at[uid] = now
            self.binder.submit(b)
        delay = self.config.gang.report_delay_seconds
        for u in plan.unschedulable:
            unit = gangs.get(u.unit)
            message = u.message
            if unit is None:
                self._attempts[u.pod.uid] = (gen, now)
            elif unit.blocked and now - self._blocked_since.setdefault(unit.key, now) < delay:
                continue  # members and PodGroups usually arrive together: do not report yet
            elif message == plan.failed_units.get(unit.key):
                message = self._gang_pod_message(unit.key, message, now)
            self.status.pod_unschedulable(pod_ref(u.pod.namespace, u.pod.name, u.pod.uid), message, reason=u.reason)
        self._preempt(plan)
        self._gang_results(plan, gangs, gen, now)
        for key in plan.deferred:
            # its victim search did not fit in this cycle's budget: next cycle, not later
            unit = gangs.get(key)
            if unit is None:
                for pod in next((u.pods for u in units if u.key == key), ()):
                    self._attempts.pop(pod.uid, None)
            self._wake.set()
        self._sync_queues(wall, queues)
        for key in [k for k in self._blocked_since if k not in gangs or not gangs[k].blocked]:
            del self._blocked_since[key]
        t2 = time.perf_counter()
        m = self.metrics
        m.cycle_duration.labels("snapshot").observe(t1 - t0)
        m.cycle_duration.labels("kernel").observe(plan.timings.get("kernel", 0.0))
        m.cycle_duration.labels("preempt").observe(plan.timings.get("preempt", 0.0))
        m.cycle_duration.labels("total").observe(t2 - t0)
        m.attempts.labels("scheduled").inc(len(plan.bindings))
        m.attempts.labels("unschedulable").inc(len(plan.unschedulable))
        m.assumed_pods.set(len(self.state.assumed))
        m.nodes.set(len(self.state.nodes))
        log.debug(
            "cycle %d: %d units, %d bound, %d unschedulable in %.1f ms",
            self.cycles, len(units), len(plan.bindings), len(plan.unschedulable), (t2 - t0) * 1e3,
        )
        return len(plan.bindings)

    def _gang_pod_message(self, key: str, message: str, now: float) -> str:
        """What to tell a waiting gang's pods: a new message, or the last one if it was told
        less than ``_GANG_POD_MESSAGE_SECONDS`` ago."""
        told = self._pods_told.get(key)
        if told is None or (told[0] != message and now - told[1] >= _GANG_POD_MESSAGE_SECONDS):
            self._pods_told[key] = (message, now)
            return message
        return told[0]

    def _gang_results(self, plan: Plan, gangs: dict[str, Unit], gen: int, now: float) -> None:
        failed, placed = plan.failed_units, plan.placed_units
        for key, unit in gangs.items():
            gkey = GroupKey(key)
            self._dirty_groups.add(gkey)
            if not unit.blocked:
                self._blocked_since.pop(key, None)
                self._schedule_start.setdefault(gkey, rfc3339(time.time()))
            if key in placed:
                self._unit_message.pop(key, None)
                self._pods_told.pop(key, None)
                self._group_attempts.pop(key, None)
                group = self.groups.groups.get(gkey)
                if group is not None:
                    what = (
                        f"{unit.min_count} members as one gang (quorum {group.min_member})"
                        if unit.min_count else "elastic members"
                    )
                    extra = placed[key] - unit.min_count
                    more = f" and {extra} elastic member(s)" if unit.min_count and extra > 0 else ""
                    where = self._placed_where(unit, plan.placed_where.get(key, ""))
                    self.status.event(group_ref(group), type="Normal", reason="Scheduled",
                                      message=f"placed {what}{more}{where}")
            elif key in plan.nominated:
                # it preempted others (or waits for them to go): retried in the next cycles
                self._unit_message[key] = ("WaitingForPreemption", plan.nominated[key])
                self._group_attempts.pop(key, None)
            elif key in failed:
                if unit.blocked:
                    reason = self.groups.blocked_reasons.get(gkey, "Unschedulable")
                else:
                    reason = plan.reasons.get(key, "Unschedulable")
                self._unit_message[key] = (reason, failed[key])
                if not unit.blocked and key not in plan.deferred:
                    self._group_attempts[key] = (gen, now)

    def _placed_where(self, unit: Unit, where: str) -> str:
        """`` within rack r-3``: the end of a placed gang's message (empty without a domain)."""
        if not where:
            return ""
        if where != CLUSTER:
            return f" within {where}"
        level = unit.topology_level
        name = self.cycle.levels.name(level) if level is not None else "domain"
        return f" across the cluster (no single {name} had room for it)"

    def _sync_groups(self, now: float) -> None:
        """Write the status of the groups that changed (and, now and then, of every group)."""
        if now - self._last_sweep >= _GROUP_SWEEP_SECONDS:
            self._last_sweep = now
            self._dirty_groups.update(self.groups.groups)
        dirty, self._dirty_groups = self._dirty_groups, set()
        free: dict[str, int] | None = None
        for key in dirty:
            group = self.groups.groups.get(key)
            if group is None:
                continue
            if group.invalid and self._reported_invalid.get(key) != group.invalid:
                self._reported_invalid[key] = group.invalid
                self.status.event(group_ref(group), type="Warning", reason="InvalidPodGroup",
                                  message=f"PodGroup {group.display} is invalid, its pods are not scheduled: {group.invalid}")
            tally = self.groups.tally(group, self.state)
            if not tally.ours:
                continue
            admitted = False
            if group.api == VOLCANO and group.observed.phase in ("", "Pending"):
                if free is None:
                    free = free_capacity(self.state.snapshot())
                admitted = self.groups.admitted(group, self.state, now, free)
            reason, message = self._unit_message.get(key, ("", ""))
            if not tally.pending and not group.invalid and not self.groups.backing_off(key, now):
                reason, message = "", ""  # the cycle's last word is stale: nothing waits to be placed
            elif self.groups.backing_off(key, now):
                reason = "GangBackoff"
                message = self.groups.blocked_message(group, now)
            status = desired_status(
                group, tally, waiting=message, reason=reason, admitted=admitted,
                schedule_start=self._schedule_start.get(key, ""),
            )
            self.group_status.update(group, status)

    def _sync_queues(self, wall: float, queues: QueueInput | None = None) -> None:
        """Write the Queue statuses, at most every ``queues.statusIntervalSeconds``.

        ``queues``: the input of the cycle that just ran (its tree is charged with what the
        cycle decided); without one, running work is charged to a fresh tree."""
        if not self.queues.queue_objects:
            return
        now = time.monotonic()
        if now - self._last_queue_status < self.config.queues.status_interval_seconds:
            return
        self._last_queue_status = now
        if queues is None:
            snap = self.state.snapshot()
            queues = self.queues.prepare(state=self.state, groups=self.groups, snap=snap, units=[], now=wall)
            self.cycle.run(snap, [], queues=queues)  # charges running work and nominations
        pending: set[str] = set()
        for uid, pod in self.state.pending.items():
            group = self.groups.group_of(uid)
            pending.add(group.key if group is not None else pod.key)
        for name, status in self.queues.statuses(queues.tree, pending.__contains__).items():
            self.queue_status.update(name, status)

    def _check_assumed(self, now: float) -> None:
        """A binding the apiserver accepted that the watch never confirmed: look again."""
        limit = self.config.binder.assumed_timeout_seconds
        for uid, since in list(self._assumed_at.items()):
            if now - since > limit and uid in self.state.assumed:
                pod = self.state.pods.get(uid)
                self._assumed_at[uid] = now
                if pod is not None:
                    self._resync(pod.namespace, pod.name, uid)

    async def _loop(self) -> None:
        interval = self.config.cycle.min_interval_seconds
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            if not self.leading.is_set() or self._stopping.is_set():
                continue
            if interval:
                await asyncio.sleep(interval)
            now = time.monotonic()
            self._check_assumed(now)
            self._check_gangs(now)
            self.run_cycle()
            self._sync_groups(time.monotonic())
            self._sync_queues(time.time())

    # -- life cycle --------------------------------------------------------------------------------

    async def _serve_http(self) -> web.AppRunner:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(text="ok") if self.ready else web.Response(status=503, text="not ready")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, _, port = self.config.metrics_address.rpartition(":")
        site = web.TCPSite(runner, host, int(port))
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.http_port = int(server.sockets[0].getsockname()[1])
        return runner

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        runner = await self._serve_http()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(r.run(), name=f"watch-{r.name}") for r in self.reflectors]
        tasks.append(loop.create_task(self.status.run(), name="status"))
        tasks.append(loop.create_task(self.group_status.run(), name="group-status"))
        tasks.append(loop.create_task(self.queue_status.run(), name="queue-status"))
        warm = loop.run_in_executor(None, kernels.warm_up)
        try:
            await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
            await warm
            self.ready = True
            log.info("mirror synced: %d nodes, %d pods; %d pending", len(self.state.nodes), len(self.state.pods), len(self.state.pending))
            le = self.config.leader_election
            if le.enabled:
                self.elector = LeaderElector(
                    client=self.client, namespace=le.namespace, name=le.lease_name, identity=self.identity,
                    lease_duration=le.lease_duration_seconds, renew_deadline=le.renew_deadline_seconds,
                    retry_period=le.retry_period_seconds,
                )

                def started() -> None:
                    log.info("%s is the leader", self.identity)
                    self.metrics.leader.set(1)
                    self.leading.set()
                    self._wake.set()

                def stopped() -> None:
                    log.warning("%s lost the lease; stopping", self.identity)
                    self.metrics.leader.set(0)
                    self.leading.clear()
                    self.stop()

                tasks.append(loop.create_task(self.elector.run(started, stopped), name="leader"))
            else:
                self.leading.set()
            loop_task = loop.create_task(self._loop(), name="cycle")
            await self._stopping.wait()
            await loop_task
        finally:
            self.leading.clear()
            drained = await self.binder.drain(10.0)
            if not drained:
                log.warning("shutting down with %d bindings in flight", self.binder.in_flight)
            if not await self.evictor.drain(5.0):
                log.warning("shutting down with %d evictions in flight", self.evictor.in_flight)
            await self.group_status.drain(5.0)
            await self.queue_status.drain(5.0)
            await self.status.drain(5.0)
            if self.elector is not None:
                with contextlib.suppress(Exception):
                    await self.elector.release()
            for t in tasks + self._tasks:
                t.cancel()
            await asyncio.gather(*tasks, *self._tasks, return_exceptions=True)
            await runner.cleanup()


async def serve(kubeconfig: str | None, config: Config) -> None:
    client = await KubeClient.connect(kubeconfig)
    sched = Scheduler(client, config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sched.stop)
    try:
        await sched.run()
    finally:
        await client.close()


def run_from_cli(*, kubeconfig: str | None, config_path: str | None) -> int:
    logging.basicConfig(
        level=os.environ.get("BATCHSCHED_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"batchsched: error: {exc}", file=__import__("sys").stderr)
        return 1
    try:
        asyncio.run(serve(kubeconfig, config))
    except KeyboardInterrupt:
        return 130
    except (KubeError, OSError) as exc:
        print(f"batchsched: error: {exc}", file=__import__("sys").stderr)
        return 1
    return 0
