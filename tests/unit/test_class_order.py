"""Equivalence classes and arrival order, through the session on a fake clock.

* A class is decided once, so everything any rule reads of a pod must be in its class: a
  running pod's required anti-affinity reads the labels of pods with no rules of their own,
  and two such pods that differ only there must not share an outcome.
* Pods and gangs of equal priority are served first come, first served: by creation time,
  then by the order the watch delivered them (their resourceVersion), never by UID.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.gangs import XK8S, parse_podgroup
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.queues import QueueSettings
from batchsched.core.reservation import ReservationSettings
from batchsched.core.session import Session, SessionSettings
from batchsched.insight.views import jobs
from tests.builders import make_group, make_node, make_pod
from tests.unit.test_session import T0, Cluster

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
GPU = "nvidia.com/gpu"


def cluster(*nodes: tuple[str, str], cpu: str = "8", reserve: bool = False) -> Cluster:
    """Nodes (name, zone) of ``cpu`` CPUs labelled with hostname and zone; reservations off
    unless asked, so that the messages are the nodes' own."""
    c = Cluster(Session(SessionSettings(reservation=ReservationSettings(enabled=reserve))))
    for name, zone in nodes:
        obj = make_node(name).cap(cpu=cpu, memory="64Gi").label({HOST: name, ZONE: zone}).obj()
        c.nodes[name] = obj
        c.session.on_node("ADDED", parse_node(obj))
    return c


def pod(name: str, labels: dict[str, str], *, created: float = T0 - 60, group: str = "") -> dict[str, Any]:
    b = make_pod(name).uid(f"uid-{name}").req(cpu="1").created(created).label(labels)
    if group:
        b = b.group(group)
    obj: dict[str, Any] = b.obj()
    obj.setdefault("status", {})
    return obj


def anti(obj: dict[str, Any], selector: dict[str, Any], *, key: str = HOST) -> dict[str, Any]:
    aff = obj["spec"].setdefault("affinity", {}).setdefault("podAntiAffinity", {})
    aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {"labelSelector": selector, "topologyKey": key})
    return obj


def running(obj: dict[str, Any], node: str) -> dict[str, Any]:
    obj["spec"]["nodeName"] = node
    obj["status"]["phase"] = "Running"
    return obj


def told(c: Cluster, uid: str) -> str | None:
    """What the last step told the pod, None when it told it nothing."""
    return next((u.message for u in c.decisions[-1].unschedulable if u.ref.uid == uid), None)


EXISTING = "0/1 nodes fit: 1 node(s) didn't satisfy existing pods anti-affinity rules."


# -- classes: what a running pod's anti-affinity reads ---------------------------------------


def test_a_pod_is_not_held_back_by_a_classmate_a_running_pods_anti_affinity_selects() -> None:
    c = cluster(("n1", "z1"))
    c.pod(running(anti(pod("guard", {"app": "guard"}), {"matchLabels": {"app": "x"}}), "n1"))
    a = c.pod(pod("a", {"app": "x"}, created=T0 - 60))
    b = c.pod(pod("b", {"app": "y"}, created=T0 - 30))
    c.step()
    assert c.node_of(b) == "n1"
    assert not c.node_of(a) and told(c, a) == EXISTING


def test_a_pod_joining_a_sleeping_lookalike_is_tried_on_its_own() -> None:
    c = cluster(("n1", "z1"))
    c.pod(running(anti(pod("guard", {"app": "guard"}), {"matchLabels": {"app": "x"}}), "n1"))
    a = c.pod(pod("a", {"app": "x"}))
    c.step()
    assert told(c, a) == EXISTING
    b = c.pod(pod("b", {"app": "y"}))
    c.step(after=1)
    assert c.node_of(b) == "n1"
    assert not c.node_of(a)


def test_a_guard_arriving_after_its_victims_splits_their_class() -> None:
    """The guard's terms appear after the pods were indexed: the class is keyed anew."""
    c = cluster(("n1", "z1"), ("n2", "z1"))
    fillers = [c.pod(running(pod(f"fill-{n}", {"app": "fill"}), n)) for n in ("n1",)]
    assert fillers
    a = c.pod(pod("a", {"tier": "x"}, created=T0 - 60))
    b = c.pod(pod("b", {"tier": "y"}, created=T0 - 30))
    c.pod(running(anti(pod("guard", {"app": "guard"}), {"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["x"]}]}, key=ZONE), "n2"))
    c.step()
    assert c.node_of(b)
    assert not c.node_of(a)
    assert told(c, a) == "0/2 nodes fit: 2 node(s) didn't satisfy existing pods anti-affinity rules."


def test_a_guard_seen_first_in_a_relist_splits_the_class() -> None:
    c = cluster(("n1", "z1"))
    a = c.pod(pod("a", {"app": "x"}, created=T0 - 60))
    b = c.pod(pod("b", {"app": "y"}, created=T0 - 30))
    guard = running(anti(pod("guard", {"app": "guard"}), {"matchLabels": {"app": "x"}}), "n1")
    c.pods[guard["metadata"]["uid"]] = guard
    c.session.on_pods_listed([parse_pod(o) for o in c.pods.values()])
    c.step()
    assert c.node_of(b) == "n1"
    assert not c.node_of(a) and told(c, a) == EXISTING


def test_a_gang_is_not_held_back_by_a_lookalike_gang_a_running_pods_anti_affinity_selects() -> None:
    """Gangs of the same shape are one class; their members' labels make them two."""
    c = cluster(("n1", "z1"), ("n2", "z1"))
    c.pod(running(anti(pod("guard", {"app": "guard"}), {"matchLabels": {"app": "x"}}, key=ZONE), "n1"))
    c.session.on_groups_listed("scheduling.x-k8s.io", [
        make_group(name).min_member(2).build() for name in ("gx", "gy")])
    gx = [c.pod(pod(f"gx-{i}", {"app": "x"}, group="gx", created=T0 - 60)) for i in range(2)]
    gy = [c.pod(pod(f"gy-{i}", {"app": "y"}, group="gy", created=T0 - 30)) for i in range(2)]
    c.step()
    c.step(after=1)
    assert all(c.node_of(u) for u in gy)
    assert not any(c.node_of(u) for u in gx)


# -- property: a step decides what trying each pod alone decides ----------------------------

_VALUES = st.sampled_from(["x", "y", "z"])
_KEYS = st.sampled_from(["app", "tier"])


@st.composite
def _labels(draw: st.DrawFn) -> dict[str, str]:
    return draw(st.dictionaries(_KEYS, _VALUES, max_size=2))


@st.composite
def _selector(draw: st.DrawFn) -> dict[str, Any]:
    sel: dict[str, Any] = {}
    if draw(st.booleans()):
        sel["matchLabels"] = draw(st.dictionaries(_KEYS, _VALUES, min_size=1, max_size=2))
    else:
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        req: dict[str, Any] = {"key": draw(_KEYS), "operator": op}
        if op in ("In", "NotIn"):
            req["values"] = draw(st.lists(_VALUES, min_size=1, max_size=2, unique=True))
        sel["matchExpressions"] = [req]
    return sel


@st.composite
def _running_pod(draw: st.DrawFn, i: int, nodes: list[str]) -> dict[str, Any]:
    obj = running(pod(f"r{i}", draw(_labels())), draw(st.sampled_from(nodes)))
    for _ in range(draw(st.integers(1 if i == 0 else 0, 2))):  # the first always guards
        anti(obj, draw(_selector()), key=draw(st.sampled_from([HOST, ZONE])))
    if draw(st.booleans()):
        obj["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": draw(st.sampled_from([HOST, ZONE])),
            "whenUnsatisfiable": draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway"])),
            "labelSelector": draw(_selector())}]
    return obj


@st.composite
def _world(draw: st.DrawFn) -> tuple[list[tuple[str, str]], list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [(f"n{i}", f"z{i % 2}") for i in range(draw(st.integers(1, 3)))]
    names = [n for n, _ in nodes]
    runs = [draw(_running_pod(i, names)) for i in range(draw(st.integers(1, 4)))]
    pending = [pod(f"p{i}", draw(_labels()), created=T0 - 60 + i) for i in range(draw(st.integers(3, 5)))]
    return nodes, runs, pending


def _decide(nodes: list[tuple[str, str]], objs: list[dict[str, Any]], pending: list[dict[str, Any]],
            ) -> dict[str, tuple[bool, str | None]]:
    """Each pending pod: bound by the step, and what it was told. Every node has room for
    every pod (32 CPUs, at most 9 pods of 1): only the rules around the pods decide."""
    c = cluster(*nodes, cpu="32")
    for obj in objs:
        c.pod(obj)
    uids = [c.pod(obj) for obj in pending]
    c.step()
    return {u: (bool(c.node_of(u)), told(c, u)) for u in uids}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_world())
def test_a_step_decides_what_trying_each_pod_alone_decides(world: Any) -> None:
    nodes, runs, pending = world
    together = _decide(nodes, runs, pending)
    alone: dict[str, tuple[bool, str | None]] = {}
    for obj in pending:
        alone.update(_decide(nodes, runs, [obj]))
    assert together == alone


# -- arrival order: first come, first served within a second ---------------------------------

SECOND = T0 - 30  # both created in this very second


def gpu_cluster(gpus: int = 8) -> Cluster:
    c = Cluster(Session(SessionSettings(queues=QueueSettings())))
    c.node("g1", gpus)
    return c


def gpu_pod(name: str, uid: str, gpus: int, *, rv: int | None = None, queue: str = "",
            group: str = "") -> dict[str, Any]:
    b = make_pod(name).uid(uid).req({GPU: str(gpus)}).created(SECOND)
    if rv is not None:
        b = b.rv(rv)
    if queue:
        b = b.label({"batchsched.io/queue": queue})
    if group:
        b = b.group(group)
    obj: dict[str, Any] = b.obj()
    obj.setdefault("status", {})
    return obj


def test_of_two_pods_created_in_one_second_the_first_delivered_is_placed() -> None:
    # the UIDs sort the other way round: UID order would place the second
    c = gpu_cluster()
    first = c.pod(gpu_pod("first", "uid-z", 6, rv=100))
    second = c.pod(gpu_pod("second", "uid-a", 4, rv=101))
    c.step()
    assert c.node_of(first) == "g1"
    assert not c.node_of(second)


def test_without_integer_resource_versions_the_order_of_arrival_decides() -> None:
    c = gpu_cluster()
    first = c.pod(gpu_pod("first", "uid-z", 6))
    second = c.pod(gpu_pod("second", "uid-a", 4))
    c.step()
    assert c.node_of(first) == "g1"
    assert not c.node_of(second)


def test_a_status_write_does_not_send_a_pod_to_the_back() -> None:
    """Its place is the resourceVersion it was first seen with, not the current one."""
    c = gpu_cluster()
    blocker = c.pod(running(gpu_pod("blocker", "uid-0", 8), "g1"))
    first = c.pod(gpu_pod("first", "uid-z", 6, rv=100))
    second = c.pod(gpu_pod("second", "uid-a", 4, rv=101))
    c.step()
    assert not c.node_of(first) and not c.node_of(second)
    # our condition written on the first pod: a new resourceVersion, later than the second's
    c.pods[first]["metadata"]["resourceVersion"] = "300"
    c.pods[first]["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    c._modified(first)
    c.delete_pod(blocker)
    c.step(after=1)
    assert c.node_of(first) == "g1"
    assert not c.node_of(second)


def test_after_a_relist_the_first_seen_order_holds() -> None:
    c = gpu_cluster()
    blocker = c.pod(running(gpu_pod("blocker", "uid-0", 8), "g1"))
    first = c.pod(gpu_pod("first", "uid-z", 6, rv=100))
    second = c.pod(gpu_pod("second", "uid-a", 4, rv=101))
    c.step()
    c.pods[first]["metadata"]["resourceVersion"] = "300"
    del c.pods[blocker]
    c.session.on_pods_listed([parse_pod(o) for o in c.pods.values()])
    c.step(after=1)
    assert c.node_of(first) == "g1"
    assert not c.node_of(second)


def _group(c: Cluster, name: str, uid: str, rv: int, members: int, gpus: int) -> list[str]:
    obj = make_group(name).uid(uid).created(SECOND).min_member(members).obj()
    obj["metadata"]["resourceVersion"] = str(rv)
    c.session.on_podgroup("ADDED", parse_podgroup(XK8S, obj))
    return [c.pod(gpu_pod(f"{name}-{i}", f"{uid}-{i}", gpus, group=name)) for i in range(members)]


def test_of_two_gangs_created_in_one_second_the_first_is_placed() -> None:
    """The AppWrapper case: a 2x3-GPU gang and a 2x2-GPU gang on 8 GPUs, one fits."""
    c = gpu_cluster()
    first = _group(c, "first", "uid-pg-z", 200, 2, 3)
    second = _group(c, "second", "uid-pg-a", 201, 2, 2)
    c.step()
    c.step(after=1)
    assert all(c.node_of(u) == "g1" for u in first)
    assert not any(c.node_of(u) for u in second)


def _queue(name: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"},
            "spec": {"resources": [{"name": GPU, "nominal": str(gpus)}]}}


def test_between_two_queues_at_equal_share_the_first_arrival_goes_first() -> None:
    """Two queues, both empty (equal shares), each gets a job in the same second and room
    for one: the first delivered goes first, whatever the UIDs and the queues' names."""
    c = gpu_cluster()
    c.session.on_queues_listed([_queue("qa", 8), _queue("qb", 8)])
    first = c.pod(gpu_pod("first", "uid-z", 6, rv=100, queue="qb"))
    second = c.pod(gpu_pod("second", "uid-a", 6, rv=101, queue="qa"))
    c.step()
    assert c.node_of(first) == "g1"
    assert not c.node_of(second)


def test_a_later_arrival_of_the_same_second_does_not_preempt_the_earlier_as_newer() -> None:
    """``withinQueue: LowerOrNewerEqualPriority`` evicts only work that came after the
    preemptor: the pod served first (it came first) is not "newer" because of its UID."""
    c = gpu_cluster()
    queue = _queue("qa", 8)
    queue["spec"]["preemption"] = {"withinQueue": "LowerOrNewerEqualPriority"}
    c.session.on_queues_listed([queue])
    first = c.pod(gpu_pod("first", "uid-z", 6, rv=100, queue="qa"))
    c.step()
    assert c.node_of(first) == "g1"
    second = c.pod(gpu_pod("second", "uid-a", 6, rv=101, queue="qa"))
    d = c.step(after=1)
    assert not d.evictions
    assert not c.node_of(second)


def test_the_views_show_the_same_order_as_the_scheduler_serves() -> None:
    """``batchsched explain`` tells a job its place in line: the first delivered is first."""
    c = gpu_cluster()
    c.pod(running(gpu_pod("blocker", "uid-0", 8), "g1"))
    first = c.pod(gpu_pod("zz-first", "uid-z", 6, rv=100))
    second = c.pod(gpu_pod("aa-second", "uid-a", 4, rv=101))
    c.step()
    waiting = {j.pods[0].uid: j for j in jobs(c.session, c.now) if j.waiting}
    assert waiting[first].position == 1
    assert waiting[second].position == 2 and waiting[second].ahead == ["default/zz-first"]
