"""Gangs: PodGroups of every API parsed, turned into units, placed whole or not at all."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.cycle import Cycle
from batchsched.core.gangs import (
    VOLCANO,
    XK8S,
    GroupBook,
    GroupStatus,
    PodGroup,
    desired_status,
    free_capacity,
    group_ref,
    parse_podgroup,
)
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Node, Pod, PodUID
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import Plan, Unit, single_unit
from tests.builders import make_group, make_node, make_pod

# -- a small world: the mirror, the book, a cycle ---------------------------------------------


@dataclass
class World:
    state: ClusterState = field(default_factory=ClusterState)
    book: GroupBook = field(default_factory=lambda: GroupBook(default_timeout=30, initial_backoff=10))
    cycle: Cycle = field(default_factory=lambda: Cycle(ScoringConfig()))

    def add(self, *objs: Node | Pod | PodGroup) -> World:
        for o in objs:
            if isinstance(o, Node):
                self.state.node_event("ADDED", o)
            elif isinstance(o, Pod):
                self.pod(o)
            else:
                self.book.group_event("ADDED", o)
        return self

    def pod(self, pod: Pod, kind: str = "MODIFIED") -> None:
        self.state.pod_event(kind, pod)
        self.book.pod_event(kind, pod)

    def units(self, now: float = 0.0) -> list[Unit]:
        singles = [
            single_unit(p) for uid, p in self.state.pending.items()
            if not p.gated and not self.book.in_group(uid)
        ]
        return singles + self.book.units(self.state, now, self.room)

    def room(self, group: PodGroup, pods: object) -> tuple[dict[str, int], dict[str, int]]:
        """The free capacity; nothing is preemptible (the session adds that)."""
        return free_capacity(self.state.snapshot()), {}

    def run(self, now: float = 0.0) -> Plan:
        plan = self.cycle.run(self.state.snapshot(), self.units(now))
        for b in plan.bindings:
            self.state.assume(PodUID(b.uid), b.node)
        return plan

    def confirm(self) -> None:
        """The watch shows every assumed pod bound and running."""
        for uid, node in list(self.state.assumed.items()):
            pod = self.state.pods[uid]
            self.pod(_with(pod, node_name=node, phase="Running"))

    def unit(self, key: str, now: float = 0.0) -> Unit:
        [u] = [u for u in self.units(now) if u.key == key]
        return u


def _with(pod: Pod, **changes: object) -> Pod:
    from dataclasses import replace

    return replace(pod, **changes)  # type: ignore[arg-type]


def gpu_nodes(count: int, gpus: int = 8) -> list[Node]:
    return [make_node(f"n{i}").cap(cpu="64", memory="512Gi", gpu=gpus).build() for i in range(count)]


def members(group: str, count: int, *, gpu: int = 1, prefix: str = "", via: str = "x-k8s", created: float = 0.0) -> list[Pod]:
    prefix = prefix or group
    return [
        make_pod(f"{prefix}-{i}").req(cpu="1", gpu=gpu).group(group, via=via).uid(f"{prefix}-{i}")
        .created(created).build()
        for i in range(count)
    ]


# -- parsing --------------------------------------------------------------------------------------


def test_scheduler_plugins_podgroup_as_the_training_operator_creates_it() -> None:
    g = (
        make_group("job", "team").min_member(101).min_resources(cpu="101", memory="202Gi", gpu=16)
        .timeout(120).created("2025-01-02T03:04:05Z").build()
    )
    assert (g.api, g.namespace, g.name, g.key) == (XK8S, "team", "job", "x-k8s:team/job")
    assert g.min_member == 101 and g.schedule_timeout == 120.0
    assert g.min_resources == {"cpu": 101_000, "memory": 202 * 2**30, "nvidia.com/gpu": 16}
    assert not g.invalid and g.api_version == "scheduling.x-k8s.io/v1alpha1"
    assert g.created == 1735787045.0


def test_volcano_podgroup_with_tasks_queue_and_priority_class() -> None:
    g = (
        make_group("job").volcano().min_member(3).tasks(master=1, worker=2).queue("research")
        .priority_class("high-priority").min_resources(gpu=8).build()
    )
    assert g.api == VOLCANO and g.key == "volcano:default/job"
    assert dict(g.min_task_member) == {"master": 1, "worker": 2}
    assert (g.queue, g.priority_class, g.schedule_timeout) == ("research", "high-priority", None)


def test_observed_status_is_read() -> None:
    g = make_group("g").min_member(2).status(
        phase="Running", running=2, succeeded=0, scheduleStartTime="2025-01-01T00:00:00Z",
        conditions=[{"type": "PodGroupScheduled", "status": "True", "reason": "Scheduled", "message": "2 of 2"}],
    ).build()
    assert g.observed == GroupStatus(phase="Running", running=2, schedule_start="2025-01-01T00:00:00Z",
                                     scheduled=True, reason="Scheduled", message="2 of 2")


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda b: b.min_member(-1), "spec.minMember must be a positive integer, got -1"),
        (lambda b: b.min_member(0), "spec.minMember must be a positive integer, got 0"),
        (lambda b: b.min_member("3"), "spec.minMember must be a positive integer, got '3'"),
        (lambda b: b.min_member(2.5), "got 2.5"),
        (lambda b: b.min_member(True), "got True"),
        (lambda b: b.min_member(None), "got none"),
        (lambda b: b.min_member(2**40), "got 1099511627776"),
        (lambda b: b.min_member(2).min_resources(cpu="lots"), "spec.minResources.cpu: 'lots' is not a quantity"),
        (lambda b: b.min_member(2).min_resources(cpu="-1"), "spec.minResources.cpu: '-1' is negative"),
        (lambda b: b.min_member(2).spec({"minMember": 2, "minResources": ["cpu"]}), "spec.minResources must map"),
        (lambda b: b.min_member(2).volcano().tasks(w=-1), "spec.minTaskMember.w must be a whole number"),
        (lambda b: b.min_member(2).timeout("soon"), "spec.scheduleTimeoutSeconds must be an integer"),
        (lambda b: b.spec("nonsense"), "spec is not an object"),
    ],
)
def test_malformed_groups_are_reported_not_raised(build, problem: str) -> None:  # type: ignore[no-untyped-def]
    g = build(make_group("bad")).build()
    assert problem in g.invalid


def test_an_empty_object_parses() -> None:
    g = parse_podgroup(XK8S, {})
    assert g.invalid and g.min_member == 1


def test_group_reference_precedence() -> None:
    base = make_pod("p")
    assert group_ref(base.copy().build()) is None
    assert group_ref(base.copy().group("a").build()) == (XK8S, "a")
    assert group_ref(base.copy().group("b", via="volcano").build()) == (VOLCANO, "b")
    assert group_ref(base.copy().group("c", via="annotation").build()) == ("any", "c")
    both = base.copy().group("c", via="annotation").group("a").build()
    assert group_ref(both) == (XK8S, "a")


# -- units ------------------------------------------------------------------------------------------


def test_pods_of_a_missing_group_wait_and_are_never_placed_alone() -> None:
    w = World().add(*gpu_nodes(1), *members("ghost", 2))
    [u] = w.units()
    assert u.key == "missing:default/ghost" and u.blocked == "waiting for PodGroup default/ghost to exist"
    plan = w.run()
    assert not plan.bindings
    assert {x.message for x in plan.unschedulable} == {"waiting for PodGroup default/ghost to exist"}
    w.add(make_group("ghost").min_member(2).build())
    assert [b.name for b in w.run().bindings] == ["ghost-0", "ghost-1"]


def test_quorum_waits_for_enough_members_to_exist() -> None:
    w = World().add(*gpu_nodes(2), make_group("g").min_member(8).build(), *members("g", 3))
    u = w.unit("x-k8s:default/g")
    assert u.blocked == "waiting for pods: 3 of 8 required members exist"
    assert not w.run().bindings
    w.add(*members("g", 8))
    plan = w.run()
    assert len(plan.bindings) == 8 and plan.placed_units == {"x-k8s:default/g": 8}


def test_gated_members_do_not_count_and_are_not_reported() -> None:
    pods = members("g", 3)
    gated = make_pod("g-3").group("g").uid("g-3").gate().build()
    w = World().add(*gpu_nodes(1), make_group("g").min_member(4).build(), *pods, gated)
    u = w.unit("x-k8s:default/g")
    assert u.blocked == "waiting for pods: 3 of 4 required members exist (1 more are gated)"
    assert "g-3" not in [p.name for p in u.pods]


def test_remainder_of_a_partly_bound_gang_is_retried_as_one_gang() -> None:
    pods = members("g", 8)
    w = World().add(*gpu_nodes(2), make_group("g").min_member(8).build(), *pods)
    for i, pod in enumerate(pods[:3]):
        w.pod(_with(pod, node_name="n0", phase="Running"))
        del i
    u = w.unit("x-k8s:default/g")
    assert (u.min_count, len(u.pods), u.blocked) == (5, 5, "")
    assert [p.name for p in u.pods] == [f"g-{i}" for i in range(3, 8)]


def test_succeeded_members_count_for_the_quorum_failed_ones_do_not() -> None:
    pods = members("g", 4)
    w = World().add(*gpu_nodes(1), make_group("g").min_member(4).build(), *pods)
    w.pod(_with(pods[0], node_name="n0", phase="Succeeded"))
    w.pod(_with(pods[1], node_name="n0", phase="Failed"))
    u = w.unit("x-k8s:default/g")
    assert u.blocked == "waiting for pods: 3 of 4 required members exist"
    t = w.book.tally(w.book.groups[u.key], w.state)  # type: ignore[index]
    assert (t.placed, t.succeeded, t.failed, len(t.pending)) == (1, 1, 1, 2)


def test_elastic_members_follow_the_quorum_and_go_where_room_allows() -> None:
    # 2 nodes x 8 GPUs; quorum of 2 x 4 GPUs, then 3 extras of 4 GPUs: only 2 fit
    w = World().add(*gpu_nodes(2), make_group("g").min_member(2).build(), *members("g", 5, gpu=4))
    u = w.unit("x-k8s:default/g")
    assert (u.min_count, len(u.pods)) == (2, 5)
    plan = w.run()
    assert [b.name for b in plan.bindings] == ["g-0", "g-1", "g-2", "g-3"]
    [extra] = plan.unschedulable
    assert extra.pod.name == "g-4" and extra.message.startswith("elastic member beyond the gang's quorum: 0/2 nodes fit")
    w.confirm()
    # the quorum is placed: what is left is elastic only
    u = w.unit("x-k8s:default/g")
    assert (u.min_count, [p.name for p in u.pods]) == (0, ["g-4"])
    w.state.node_event("ADDED", make_node("n2").cap(cpu="64", memory="512Gi", gpu=8).build())
    assert [b.node for b in w.run().bindings] == ["n2"]


def test_min_task_member_puts_each_task_quorum_first() -> None:
    group = make_group("job").volcano().min_member(3).tasks(ps=1, worker=2).build()
    pods = [
        make_pod(f"job-worker-{i}").req(cpu="1").group("job", via="annotation").task("worker").uid(f"w{i}").build()
        for i in range(4)
    ] + [make_pod("job-ps-0").req(cpu="1").group("job", via="annotation").task("ps").uid("ps0").created(5).build()]
    w = World().add(*gpu_nodes(1), group, *pods)
    u = w.unit("volcano:default/job")
    assert u.min_count == 3
    assert [p.name for p in u.pods] == ["job-ps-0", "job-worker-0", "job-worker-1", "job-worker-2", "job-worker-3"]


def test_min_task_member_waits_for_a_missing_task() -> None:
    group = make_group("job").volcano().min_member(2).tasks(ps=1, worker=2).build()
    pods = [make_pod(f"w{i}").group("job", via="volcano").task("worker").uid(f"w{i}").build() for i in range(3)]
    w = World().add(*gpu_nodes(1), group, *pods)
    assert w.unit("volcano:default/job").blocked == "waiting for pods: task ps has 0 of 1 required members"


def test_min_resources_holds_back_a_gang_the_cluster_cannot_hold() -> None:
    running = make_pod("busy").req(gpu=4).running("n0").build()
    group = make_group("g").min_member(2).min_resources(gpu=16).build()
    w = World().add(*gpu_nodes(2), running, group, *members("g", 2))
    u = w.unit("x-k8s:default/g")
    short = "gang default/g needs minResources the cluster does not have free: 16 nvidia.com/gpu (free: 12)"
    # not blocked: it keeps its turn (and may hold a reservation), but is never placed
    assert (u.blocked, u.min_resources_short) == ("", short)
    plan = w.run()
    assert not plan.bindings
    assert plan.results["x-k8s:default/g"].message.startswith(short)
    w.pod(_with(running, phase="Succeeded"))
    assert not w.unit("x-k8s:default/g").min_resources_short
    assert len(w.run().bindings) == 2


def test_an_invalid_group_is_reported_and_its_pods_never_placed() -> None:
    w = World().add(*gpu_nodes(1), make_group("g").min_member(-3).build(), *members("g", 2))
    plan = w.run()
    assert not plan.bindings
    assert plan.failed_units["x-k8s:default/g"] == (
        "PodGroup default/g is invalid: spec.minMember must be a positive integer, got -3"
    )
    assert len(plan.unschedulable) == 2
    assert not w.book.check(w.state, 1000.0).evictions


def test_kube_batch_annotation_prefers_volcano_then_scheduler_plugins() -> None:
    pods = members("job", 2, via="annotation")
    w = World().add(*gpu_nodes(1), *pods, make_group("job").min_member(2).build())
    assert w.book.group_of(pods[0].uid).key == "x-k8s:default/job"  # type: ignore[union-attr]
    w.add(make_group("job").volcano().min_member(2).build())
    assert w.book.group_of(pods[0].uid).key == "volcano:default/job"  # type: ignore[union-attr]
    assert [u.key for u in w.units()] == ["volcano:default/job"]


def test_group_priority_from_priority_class_or_members_and_group_creation_time() -> None:
    pods = [make_pod(f"p{i}").group("g", via="volcano").priority(i).uid(f"p{i}").build() for i in range(3)]
    group = make_group("g").volcano().min_member(3).priority_class("high").created(42).uid("G").build()
    w = World().add(*gpu_nodes(1), group, *pods)
    u = w.unit("volcano:default/g")
    assert (u.priority, u.created, u.uid) == (2, 42.0, "G")
    w.book.priority_class_event("ADDED", "high", 1000)
    assert w.unit("volcano:default/g").priority == 1000


def test_groups_of_another_scheduler_are_left_alone() -> None:
    pods = [make_pod(f"v{i}").scheduler("volcano").group("g", via="annotation").uid(f"v{i}").build() for i in range(2)]
    w = World().add(*gpu_nodes(1), make_group("g").volcano().min_member(3).build(), *pods)
    w.pod(_with(pods[0], node_name="n0", phase="Running"))
    assert w.units() == []
    group = w.book.groups["volcano:default/g"]  # type: ignore[index]
    assert not w.book.tally(group, w.state).ours
    assert w.book.check(w.state, 0).notices == [] and w.book.check(w.state, 1e6).evictions == []


# -- the cycle: whole or not at all ---------------------------------------------------------------


@pytest.mark.parametrize("use_jit", [True, False])
def test_two_gangs_each_needing_more_than_half_never_split_the_gpus(use_jit: bool) -> None:
    # 16 GPUs free; each gang needs 12 (3 x 4): one is placed whole, the other waits whole
    w = World(cycle=Cycle(ScoringConfig(), use_jit=use_jit))
    w.add(
        *gpu_nodes(2),
        make_group("a").min_member(3).created(10).uid("A").build(),
        make_group("b").min_member(3).created(5).uid("B").build(),
        *members("a", 3, gpu=4, created=1), *members("b", 3, gpu=4, created=1),
    )
    plan = w.run()
    assert sorted(b.name for b in plan.bindings) == ["b-0", "b-1", "b-2"]  # b is older
    assert plan.placed_units == {"x-k8s:default/b": 3}
    a = plan.results["x-k8s:default/a"]
    assert a.message.startswith("gang needs 3 pods (3 cpu, 12 nvidia.com/gpu) placed together; only 1 fit now.")
    assert "Member a-1: 0/2 nodes fit" in a.message
    # it waits whole, holding the nodes b runs on (b declares no end) for when b ends
    assert a.reason == "Reserved" and "holds a reservation on node(s) n0, n1" in a.message, a.message
    assert {u.pod.name for u in plan.unschedulable} == {"a-0", "a-1", "a-2"}
    # while b holds its GPUs, a stays empty; when b finishes, a goes whole
    w.confirm()
    assert not w.run().bindings
    for uid in [PodUID(f"b-{i}") for i in range(3)]:
        w.pod(_with(w.state.pods[uid], phase="Succeeded"))
    assert sorted(b.name for b in w.run().bindings) == ["a-0", "a-1", "a-2"]


def test_a_gang_that_fits_nowhere_explains_why_and_places_nothing() -> None:
    w = World().add(*gpu_nodes(2), make_group("big").min_member(3).build(), *members("big", 3, gpu=8))
    plan = w.run()
    assert not plan.bindings and w.state.assumed == {}
    assert plan.failed_units["x-k8s:default/big"].startswith(
        "gang needs 3 pods (3 cpu, 24 nvidia.com/gpu) placed together; only 2 fit now. Member big-2: "
        "0/2 nodes fit: 2 insufficient nvidia.com/gpu."
    )


# -- no partial gang survives ------------------------------------------------------------------------


def test_partial_gang_times_out_is_evicted_and_backs_off() -> None:
    pods = members("g", 4)
    w = World().add(*gpu_nodes(1), make_group("g").min_member(4).timeout(20).build(), *pods)
    for pod in pods[:2]:
        w.pod(_with(pod, node_name="n0", phase="Running"))
    w.pod(pods[3], "DELETED")  # only 3 of 4 will ever exist
    check = w.book.check(w.state, now=100.0)
    assert [(n.reason, n.message) for n in check.notices] == [
        ("GangIncomplete", "2 of 4 required members are placed; retrying the other 2 as one gang")
    ]
    assert not check.evictions
    assert not w.book.check(w.state, now=119.0).notices
    check = w.book.check(w.state, now=120.0)
    assert [n.reason for n in check.notices] == ["GangTimeout"]
    assert check.notices[0].message.startswith("only 2 of 4 required members were placed within 20 s; evicting the 2")
    assert sorted(e.name for e in check.evictions) == ["g-0", "g-1"]
    assert {e.unit for e in check.evictions} == {"x-k8s:default/g"}
    # evictions in flight are not asked for twice
    assert not w.book.check(w.state, now=121.0).evictions
    # while it backs off, its pending member is not tried
    u = w.unit("x-k8s:default/g", now=121.0)
    assert u.blocked.startswith("gang default/g timed out after 20 s with 2 of 4 required members placed")
    # a member bound meanwhile (its binding was in flight) is evicted at once
    w.pod(_with(pods[2], node_name="n0", phase="Running"))
    assert [e.name for e in w.book.check(w.state, now=122.0).evictions] == ["g-2"]
    # the evicted pods go away; after the back-off the group is tried again
    for pod in pods[:3]:
        w.pod(pod, "DELETED")
    assert not w.book.backing_off("x-k8s:default/g", 130.0)  # type: ignore[arg-type]


def test_second_timeout_backs_off_twice_as_long() -> None:
    book = GroupBook(default_timeout=5, initial_backoff=10, max_backoff=15)
    w = World(book=book)
    pods = members("g", 2)
    w.add(*gpu_nodes(1), make_group("g").min_member(3).build(), *pods)
    w.pod(_with(pods[0], node_name="n0", phase="Running"))
    book.check(w.state, 0.0)
    assert book.check(w.state, 5.0).evictions
    assert book.backing_off("x-k8s:default/g", 14.9)  # type: ignore[arg-type]
    assert not book.backing_off("x-k8s:default/g", 15.0)  # type: ignore[arg-type]
    book.eviction_done("x-k8s:default/g", pods[0].uid)  # type: ignore[arg-type]
    book.check(w.state, 15.0)
    assert book.check(w.state, 20.0).evictions
    assert book.backing_off("x-k8s:default/g", 34.9)  # type: ignore[arg-type]  # capped at 15 s


def test_a_whole_gang_is_left_alone() -> None:
    w = World().add(*gpu_nodes(1), make_group("g").min_member(2).timeout(1).build(), *members("g", 2))
    w.run()
    assert w.book.check(w.state, 0.0).notices == []  # assumed members count
    w.confirm()
    assert w.book.check(w.state, 1e6) == w.book.check(w.state, 2e6)
    assert not w.book.check(w.state, 3e6).evictions


# -- status ---------------------------------------------------------------------------------------------


def _status(w: World, key: str, **kw: object) -> GroupStatus:
    group = w.book.groups[key]  # type: ignore[index]
    args: dict[str, object] = {"waiting": "", "reason": "", "admitted": False, "schedule_start": ""}
    args.update(kw)
    return desired_status(group, w.book.tally(group, w.state), **args)  # type: ignore[arg-type]


def test_scheduler_plugins_phases_follow_the_members() -> None:
    pods = members("g", 2)
    w = World().add(*gpu_nodes(1), make_group("g").min_member(2).build(), *pods)
    s = _status(w, "x-k8s:default/g", waiting="gang needs ...", reason="Unschedulable", schedule_start="T0")
    assert (s.phase, s.scheduled, s.reason, s.message, s.schedule_start) == ("Pending", False, "Unschedulable", "gang needs ...", "T0")
    w.run()
    s = _status(w, "x-k8s:default/g")
    assert (s.phase, s.scheduled, s.reason, s.message) == ("Scheduling", True, "Scheduled", "2 of 2 required members placed")
    w.confirm()
    s = _status(w, "x-k8s:default/g")
    assert (s.phase, s.running) == ("Running", 2)
    for pod in pods:
        w.pod(_with(w.state.pods[pod.uid], phase="Succeeded"))
    s = _status(w, "x-k8s:default/g")
    assert (s.phase, s.running, s.succeeded) == ("Finished", 0, 2)


def test_scheduler_plugins_failed_phase() -> None:
    pods = members("g", 2)
    w = World().add(*gpu_nodes(1), make_group("g").min_member(2).build(), *pods)
    w.pod(_with(pods[0], node_name="n0", phase="Failed"))
    w.pod(_with(pods[1], node_name="n0", phase="Running"))
    assert _status(w, "x-k8s:default/g").phase == "Failed"


def test_volcano_phases_pending_inqueue_running_completed() -> None:
    w = World().add(*gpu_nodes(1), make_group("j").volcano().min_member(2).build())
    assert _status(w, "volcano:default/j").phase == "Pending"
    assert _status(w, "volcano:default/j", admitted=True).phase == "Inqueue"
    pods = members("j", 2, via="annotation")
    w.add(*pods)
    w.run()
    w.confirm()
    s = _status(w, "volcano:default/j")
    assert (s.phase, s.running, s.schedule_start) == ("Running", 2, "")
    for pod in pods:
        w.pod(_with(w.state.pods[pod.uid], phase="Succeeded"))
    assert _status(w, "volcano:default/j").phase == "Completed"


def test_volcano_admission_needs_min_resources_free() -> None:
    w = World().add(*gpu_nodes(1), make_group("j").volcano().min_member(2).min_resources(gpu=12).build())
    group = w.book.groups["volcano:default/j"]  # type: ignore[index]
    assert not w.book.admitted(group, w.state, 0.0, w.room)
    w.state.node_event("ADDED", make_node("big").cap(gpu=8).build())
    assert w.book.admitted(group, w.state, 0.0, w.room)


def test_invalid_group_status_says_why() -> None:
    w = World().add(make_group("g").min_member(0).build())
    s = _status(w, "x-k8s:default/g")
    assert (s.phase, s.reason) == ("Pending", "InvalidPodGroup")
    assert s.message == "PodGroup default/g is invalid: spec.minMember must be a positive integer, got 0"


# -- property: whole or nothing, never over-committed ------------------------------------------------


@dataclass
class Job:
    name: str
    count: int
    min_member: int
    gpu: int
    cpu: int
    duration: int  # cycles it runs before it succeeds


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[list[Job]], bool]:
    nodes = draw(st.lists(st.tuples(st.sampled_from([0, 2, 4, 8]), st.integers(2, 16)), min_size=1, max_size=6))
    waves = []
    n = 0
    for _ in range(draw(st.integers(1, 4))):
        wave = []
        for _ in range(draw(st.integers(0, 4))):
            count = draw(st.integers(1, 6))
            wave.append(Job(
                name=f"j{n}", count=count, min_member=draw(st.integers(1, count)),
                gpu=draw(st.integers(0, 4)), cpu=draw(st.integers(1, 8)), duration=draw(st.integers(0, 3)),
            ))
            n += 1
        waves.append(wave)
    return nodes, waves, draw(st.booleans())


def _placed(w: World, uids: Iterable[PodUID]) -> int:
    n = 0
    for uid in uids:
        pod = w.state.pods.get(uid)
        if pod is not None and (uid in w.state.assumed or pod.node_name):
            n += 1
    return n


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_cycle_leaves_gangs_whole_or_empty_and_no_node_overcommitted(
    scenario: tuple[list[tuple[int, int]], list[list[Job]], bool],
) -> None:
    node_shapes, waves, use_jit = scenario
    w = World(cycle=Cycle(ScoringConfig(), use_jit=use_jit))
    for i, (gpus, cpus) in enumerate(node_shapes):
        w.add(make_node(f"n{i}").cap(cpu=cpus, memory="64Gi", gpu=gpus).build())
    jobs: dict[str, tuple[Job, list[PodUID]]] = {}
    started: dict[PodUID, int] = {}
    created = 0
    for step in range(len(waves) + 4):
        for job in waves[step] if step < len(waves) else []:
            created += 1
            single = job.count == 1 and job.min_member == 1 and created % 2 == 0
            pods = []
            for m in range(job.count):
                b = make_pod(f"{job.name}-{m}").req(cpu=job.cpu, gpu=job.gpu).uid(f"{job.name}-{m}").created(created)
                if not single:
                    b = b.group(job.name)
                pods.append(b.build())
            if not single:
                w.add(make_group(job.name).min_member(job.min_member).created(created).uid(job.name).build())
            w.add(*pods)
            jobs[job.name] = (job, [p.uid for p in pods])
        plan = w.run(now=float(step))
        # no node over-committed on any column
        rows = [w.state.node_row[n] for n in w.state.nodes]
        assert np.all(w.state.used[rows] <= w.state.alloc[rows]), plan
        w.state.check()
        # every gang is whole (at least its quorum placed) or has nothing placed
        for job, uids in jobs.values():
            placed = _placed(w, uids)
            assert placed == 0 or placed >= job.min_member, (job, placed, plan.failed_units)
        # the watch confirms the bindings; members that ran long enough succeed
        w.confirm()
        for uid, pod in list(w.state.pods.items()):
            if pod.phase == "Running":
                started.setdefault(uid, step)
                job = jobs[pod.name.rsplit("-", 1)[0]][0]
                if step - started[uid] >= job.duration:
                    w.pod(_with(pod, phase="Succeeded"))


# -- which groups have a member to place, kept across steps -----------------------------------

_OPS = st.lists(st.tuples(st.sampled_from(["add", "add-gated", "ungate", "bind", "assume", "forget", "finish",
                                           "delete", "regroup"]),
                          st.integers(0, 2), st.integers(0, 3)), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_the_groups_waiting_are_those_with_a_member_pending_and_not_gated_after_any_events(
        ops: list[tuple[str, int, int]]) -> None:
    """The book keeps, across steps, which groups have a member to place; after pods come,
    are gated and ungated, bound, assumed and forgotten, finish, leave or move to another
    group, it names exactly the groups with a member pending and not gated."""
    w = World().add(*gpu_nodes(2))
    for g in range(3):
        w.add(make_group(f"g{g}").min_member(1).uid(f"g{g}").build())
    for op, g, m in ops:
        uid = PodUID(f"g{g}-{m}")
        pod = w.state.pods.get(uid)
        if op in ("add", "add-gated") and pod is None:
            b = make_pod(f"g{g}-{m}").req(cpu="1", gpu=1).group(f"g{g}").uid(uid)
            w.pod((b.gate() if op == "add-gated" else b).build(), "ADDED")
        elif pod is None:
            continue
        elif op == "ungate":
            w.pod(_with(pod, gated=False))
        elif op == "bind" and uid not in w.state.assumed and not pod.node_name:
            w.pod(_with(pod, node_name="n0", phase="Running"))
        elif op == "assume" and uid in w.state.pending and not pod.gated:
            w.state.assume(uid, "n1")
            w.book.touch(uid)
        elif op == "forget" and uid in w.state.assumed:
            w.state.forget(uid)
            w.book.touch(uid)
        elif op == "finish":
            w.pod(_with(pod, phase="Succeeded"))
        elif op == "delete":
            w.pod(pod, "DELETED")
        elif op == "regroup" and not pod.node_name:
            w.pod(make_pod(pod.name).req(cpu="1", gpu=1).group(f"g{(g + 1) % 3}").uid(uid).build())
        expected = sorted({f"x-k8s:default/{w.book.group_of(u).name}" for u, p in w.state.pending.items()  # type: ignore[union-attr]
                           if not p.gated and w.book.group_of(u) is not None})
        assert [grp.key for grp in w.book.waiting(w.state)] == expected, (op, g, m)
