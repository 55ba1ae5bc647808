"""``preemptionPolicy: Never``, through the session on a fake clock: such a pod (or gang)
goes ahead of lower priorities but evicts nobody, reclaims no quota, and says so; it still
holds a reservation.

kube-scheduler's rule: a pod whose ``spec.preemptionPolicy`` is ``Never`` (the Priority
admission copies it from its PriorityClass) is never a preemptor. A PodGroup takes the
policy from the PriorityClass it names, else from its members.
"""

from __future__ import annotations

from typing import Any

from batchsched.core.plan import UnitStatus
from batchsched.core.queues import QueueSettings
from batchsched.core.reservation import RESERVED, RUNTIME_ANNOTATION
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_pod
from tests.unit.test_session import GPU, T0, Cluster

NEVER_TAIL = "but its preemptionPolicy is Never: it waits for capacity to free"


def pod(name: str, gpus: int, *, priority: int = 0, never: bool = False, group: str = "",
        queue: str = "", runtime: str = "") -> dict[str, Any]:
    b = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).priority(priority).created(T0 - 60)
    if never:
        b = b.preemption_policy("Never")
    if group:
        b = b.group(group)
    if queue:
        b = b.label({"batchsched.io/queue": queue})
    if runtime:
        b = b.annotate({RUNTIME_ANNOTATION: runtime})
    return b.obj()


def queue(name: str, gpus: int, *, parent: str = "", reclaim: str = "Any") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resources": [{"name": GPU, "nominal": str(gpus)}],
        "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": reclaim},
    }
    if parent:
        spec["parent"] = parent
    return {"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"}, "spec": spec}


def cohort(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"}, "spec": {}}


def message(c: Cluster, key: str) -> str:
    plan = c.decisions[-1].plan
    assert plan is not None
    return plan.results[key].message


def test_a_never_pod_evicts_nobody_says_so_and_goes_ahead_of_lower_priorities() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    low = c.pod(pod("low", 8))
    assert [b.uid for b in c.step().binds] == [low]
    urgent = c.pod(pod("urgent", 8, priority=1000, never=True))
    d = c.step(after=1.0)
    assert d.evictions == [] and d.binds == []
    assert message(c, "default/urgent").startswith(
        "0/1 nodes fit: 1 insufficient nvidia.com/gpu; it would preempt 1 pod(s) of default/low, " + NEVER_TAIL
    )
    # a lower priority that arrives later does not take the room when it frees
    mid = c.pod(pod("mid", 8))
    d = c.step(after=1.0)
    assert d.evictions == []
    c.delete_pod(low)
    d = c.step(after=1.0)
    assert [b.uid for b in d.binds] == [urgent]
    assert c.node_of(mid) == ""


def test_the_same_pod_without_the_policy_preempts() -> None:
    # the twin of the test above: what Never changes, and only that
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    low = c.pod(pod("low", 8))
    c.step()
    c.pod(pod("urgent", 8, priority=1000))
    d = c.step(after=1.0)
    assert [e.uid for e in d.evictions] == [low]


def test_a_gang_takes_the_policy_from_its_priority_class() -> None:
    s = Session(SessionSettings(gang_report_delay=0.0))
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    lows = [c.pod(pod(f"low-{i}", 8)) for i in range(2)]
    assert len(c.step().binds) == 2
    s.on_priority_classes_listed({"urgent": 1000, "urgent-never": 1000}, ["urgent-never"])
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("g").min_member(2).priority_class("urgent-never").build()])
    # the members carry no policy of their own (created before the class said Never): the class decides
    [c.pod(pod(f"g-{i}", 8, group="g")) for i in range(2)]
    d = c.step(after=1.0)
    assert d.evictions == [] and d.binds == []
    plan = d.plan
    assert plan is not None and plan.results["x-k8s:default/g"].status is not UnitStatus.PREEMPTING
    assert NEVER_TAIL in message(c, "x-k8s:default/g")
    assert "it would preempt 2 pod(s) of default/low-0, default/low-1" in message(c, "x-k8s:default/g")

    # the class is edited to preempt: the same gang, woken at once, now evicts both
    s.on_priority_class("MODIFIED", "urgent-never", 1000, False)
    d = c.step(after=1.0)
    assert sorted(e.uid for e in d.evictions) == sorted(lows)


def test_a_gang_without_a_known_class_takes_the_policy_from_its_members() -> None:
    s = Session(SessionSettings(gang_report_delay=0.0))
    c = Cluster(s)
    c.node("n0", 8)
    c.pod(pod("low", 8))
    c.step()
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("g").min_member(1).build()])
    c.pod(pod("g-0", 8, priority=1000, never=True, group="g"))
    d = c.step(after=1.0)
    assert d.evictions == []
    assert NEVER_TAIL in message(c, "x-k8s:default/g")


def test_a_never_pod_reclaims_no_quota_and_says_why_it_waits() -> None:
    # a (nominal 8) lent its GPUs to b; a pod of a with Never waits instead of reclaiming
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    s.on_queues_listed([cohort("org"), queue("a", 8, parent="org"), queue("b", 8, parent="org")])
    borrowers = [c.pod(pod(f"b-{i}", 8, queue="b")) for i in range(2)]
    assert len(c.step().binds) == 2
    mine = c.pod(pod("mine", 8, queue="a", never=True))
    d = c.step(after=1.0)
    assert d.evictions == [] and d.binds == []
    assert message(c, "default/mine").endswith(
        "it would reclaim its queue's nominal quota from 1 pod(s) of default/b-0, " + NEVER_TAIL
    )
    c.delete_pod(borrowers[0])
    d = c.step(after=1.0)
    assert [b.uid for b in d.binds] == [mine]


def test_a_never_gang_in_a_queue_holds_a_reservation_without_evicting() -> None:
    # the gang fits its queue's quota but not the nodes; lower-priority work runs there and
    # declares its end: the gang evicts nobody, holds the nodes, and later small work of a
    # lower priority may not take them
    s = Session(SessionSettings(gang_report_delay=0.0, queues=QueueSettings(nomination_timeout=300.0)))
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    s.on_queues_listed([queue("team", 32)])  # its quota admits the gang; the nodes do not
    s.on_priority_classes_listed({"urgent-never": 1000}, ["urgent-never"])
    running = [c.pod(pod(f"run-{i}", 8, queue="team", runtime="10m")) for i in range(2)]
    assert len(c.step().binds) == 2
    s.on_groups_listed("scheduling.x-k8s.io", [
        make_group("g").min_member(2).priority_class("urgent-never").queue("team").build()])
    members = [c.pod(pod(f"g-{i}", 8, group="g", queue="team")) for i in range(2)]
    d = c.step(after=1.0)
    assert d.evictions == []
    plan = d.plan
    assert plan is not None
    result = plan.results["x-k8s:default/g"]
    assert result.reason == RESERVED
    assert NEVER_TAIL in result.message and "holds a reservation on node(s) n0, n1" in result.message
    # one running pod ends: a later small pod of a lower priority does not take its node
    c.delete_pod(running[0])
    small = c.pod(pod("small", 2, queue="team"))
    d = c.step(after=1.0)
    assert d.evictions == [] and small not in {b.uid for b in d.binds}
    c.delete_pod(running[1])
    d = c.step(after=1.0)
    assert sorted(b.uid for b in d.binds) == sorted(members)
    assert c.node_of(small) == ""


def test_a_higher_priority_never_pod_does_not_take_capacity_a_reservation_holds() -> None:
    # later work of a higher priority may use what a reservation holds because it could
    # preempt the holder anyway; a Never pod could not, so it waits like any later work.
    # Queue a (no usage, its head's share 16/32) is walked before queue b (16/16): its gang
    # reserves first.
    s = Session(SessionSettings(gang_report_delay=0.0))
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    s.on_queues_listed([queue("a", 32), queue("b", 16)])
    c.pod(pod("run-0", 8, runtime="10m", queue="b"))
    c.pod(pod("run-1", 4, runtime="20m", queue="b"))
    assert len(c.step().binds) == 2
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("g").min_member(2).queue("a").build()])
    [c.pod(pod(f"g-{i}", 8, group="g", priority=5, queue="a")) for i in range(2)]
    never = c.pod(pod("never", 4, priority=100, never=True, queue="b"))
    d = c.step(after=1.0)
    plan = d.plan
    assert plan is not None and plan.results["x-k8s:default/g"].reason == RESERVED
    assert never not in {b.uid for b in d.binds}
    assert "is reserved for" in message(c, "default/never")


def test_a_never_gangs_min_resources_counts_no_preemptible_work() -> None:
    # minResources is weighed against what the gang could have: free capacity, plus what
    # it may preempt; with Never it may preempt nothing
    s = Session(SessionSettings(gang_report_delay=0.0))
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    [c.pod(pod(f"low-{i}", 8)) for i in range(2)]
    c.step()
    s.on_priority_classes_listed({"urgent-never": 1000}, ["urgent-never"])
    s.on_groups_listed("scheduling.x-k8s.io", [
        make_group("g").min_member(2).min_resources(gpu=16).priority_class("urgent-never").build()])
    [c.pod(pod(f"g-{i}", 8, group="g")) for i in range(2)]
    d = c.step(after=1.0)
    assert d.evictions == []
    assert message(c, "x-k8s:default/g").startswith(
        "gang default/g needs minResources the cluster does not have free: 16 nvidia.com/gpu (free: 0)")
