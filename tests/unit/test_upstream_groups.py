"""Kubernetes' own pod groups (``scheduling.k8s.io/v1beta1`` PodGroup, pods joining by
``spec.schedulingGroup``) are gangs with the guarantees of the other APIs, and where they
meet the other policies: preemption of whole gangs, ``preemptionPolicy: Never``,
topology, whole-job restart (``disruptionMode``), the conditions kube-scheduler writes,
a group mixing schedulers, and a restart of batchsched."""

from __future__ import annotations

from typing import Any

from batchsched.core.gangs import K8S, parse_podgroup
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.session import Session, SessionSettings
from tests.builders import GPU, make_node, make_pod
from tests.unit.test_insight import World

API = "scheduling.k8s.io/v1beta1"


def podgroup(name: str, min_count: int | None, *, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """A PodGroup as the 1.37 apiserver stores it (``disruptionMode`` defaulted to single);
    ``min_count`` None: the basic policy."""
    policy = {"basic": {}} if min_count is None else {"gang": {"minCount": min_count}}
    body: dict[str, Any] = {"schedulingPolicy": policy, "disruptionMode": {"single": {}}}
    body.update(spec)
    return {
        "apiVersion": API, "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1",
                     "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": body,
    }


class Upstream(World):
    """The world of :class:`~tests.unit.test_insight.World` with upstream pod groups."""

    def __init__(self, settings: SessionSettings | None = None) -> None:
        super().__init__()
        if settings is not None:
            self.session = Session(settings)
        self.groups: dict[str, dict[str, Any]] = {}

    def upstream(self, name: str, min_count: int | None, **spec: Any) -> None:
        obj = self.groups[name] = podgroup(name, min_count, **spec)
        self.session.on_podgroup("ADDED", parse_podgroup(K8S, obj))

    def member(self, name: str, gpus: int, group: str, *, priority: int = 0, scheduler: str = "batchsched",
               labels: dict[str, str] | None = None) -> str:
        b = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(self.now).priority(priority)
        if labels:
            b = b.label(labels)
        obj = b.obj()
        obj["spec"]["schedulingGroup"] = {"podGroupName": group}
        obj["spec"]["schedulerName"] = scheduler
        self.pods[obj["metadata"]["uid"]] = obj
        self.session.on_pod("ADDED", parse_pod(obj, frozenset({"batchsched"})))
        return str(obj["metadata"]["uid"])

    def rack_node(self, name: str, rack: str) -> None:
        node = make_node(name).cap(cpu="64", memory="512Gi", **{GPU: "8"}).label({"batchsched.io/rack": rack})
        self.session.on_node("ADDED", parse_node(node.obj()))

    def status_of(self, d: Any, name: str) -> Any:
        [status] = [s for g, s in d.group_statuses if g.name == name] or [None]
        return status

    def show(self, name: str, status: Any) -> None:
        """The apiserver now shows ``status`` on the group (the watch's event)."""
        conditions = [{"type": "PodGroupInitiallyScheduled", "status": "True" if status.scheduled else "False",
                       "reason": status.reason, "message": status.message}]
        if status.disruption:
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                               "message": status.disruption})
        self.groups[name]["status"] = {"conditions": conditions}
        self.session.on_podgroup("MODIFIED", parse_podgroup(K8S, self.groups[name]))


def test_a_gang_is_bound_whole_or_not_at_all_and_its_condition_says_why() -> None:
    w = Upstream()
    w.node("n0", 8)
    w.node("n1", 8)
    w.upstream("train", 3)
    members = [w.member(f"train-{i}", 8, "train") for i in range(3)]
    d = w.step()
    assert d.binds == []  # two of three fit: none is bound
    status = w.status_of(d, "train")
    assert (status.scheduled, status.reason) == (False, "Unschedulable")
    assert "3" in status.message and status.phase == ""  # batchsched's own words; no phase on this API
    w.node("n2", 8)
    d = w.step(after=5)
    assert sorted(b.uid for b in d.binds) == sorted(members)
    assert w.status_of(d, "train").scheduled


def test_members_beyond_min_count_are_elastic_and_the_basic_policy_places_what_fits() -> None:
    w = Upstream()
    w.node("n0", 8)
    w.node("n1", 8)
    w.upstream("elastic", 1)
    w.upstream("plain", None)
    elastic = [w.member(f"elastic-{i}", 8, "elastic") for i in range(2)]
    d = w.step()
    assert sorted(b.uid for b in d.binds) == sorted(elastic)
    plain = [w.member(f"plain-{i}", 4, "plain") for i in range(3)]
    w.node("n2", 8)
    d = w.step(after=1)
    assert len(d.binds) == 2 and {b.uid for b in d.binds} < set(plain)  # two fit; the third waits


def test_a_member_waits_for_its_podgroup_and_is_never_placed_alone() -> None:
    w = Upstream()
    w.node("n0", 8)
    uid = w.member("early-0", 1, "later")
    d = w.step()
    assert d.binds == []
    w.upstream("later", 1)
    assert [b.uid for b in w.step(after=1).binds] == [uid]


def test_a_higher_priority_gang_preempts_a_lower_one_whole_and_marks_it_as_a_disruption_target() -> None:
    w = Upstream()
    for n in ("n0", "n1"):
        w.node(n, 8)
    w.upstream("low", 2, priority=10)
    low = [w.member(f"low-{i}", 4, "low", priority=10) for i in range(2)]
    w.upstream("extra", 1, priority=10)
    w.member("extra-0", 8, "extra", priority=10)
    assert len(w.step().binds) == 3
    w.upstream("high", 2, priority=1000)
    [w.member(f"high-{i}", 8, "high", priority=1000) for i in range(2)]
    d = w.step(after=1)
    evicted = {e.uid for e in d.evictions}
    assert set(low) <= evicted  # the low gang goes whole, never one member of it
    status = w.status_of(d, "low") or w.status_of(w.step(after=1), "low")
    assert status is not None and "high" in status.disruption


def test_a_gang_whose_preemption_policy_is_never_waits_instead_of_evicting() -> None:
    w = Upstream()
    w.node("n0", 8)
    w.upstream("low", 1, priority=10)
    w.member("low-0", 8, "low", priority=10)
    w.step()
    w.upstream("polite", 1, priority=1000, preemptionPolicy="Never")
    w.member("polite-0", 8, "polite", priority=1000)
    d = w.step(after=1)
    assert d.evictions == [] and d.binds == []
    assert "preemptionPolicy is Never" in w.status_of(d, "polite").message


def test_a_topology_constraint_keeps_the_gang_in_one_rack_and_an_unknown_key_is_said() -> None:
    w = Upstream()
    w.rack_node("a0", "rack-a")
    w.rack_node("b0", "rack-b")
    w.rack_node("b1", "rack-b")
    w.member("filler", 4, "fill")
    w.upstream("fill", 1)
    w.step()  # rack b0 or a0 half used
    w.upstream("tight", 2, schedulingConstraints={"topology": [{"key": "batchsched.io/rack"}]})
    tight = [w.member(f"tight-{i}", 8, "tight") for i in range(2)]
    d = w.step(after=1)
    nodes = {b.node for b in d.binds if b.uid in tight}
    assert len({n[0] for n in nodes}) == 1 and len(nodes) == 2, nodes  # both in one rack
    w.upstream("zoned", 1, schedulingConstraints={"topology": [{"key": "topology.kubernetes.io/zone"}]})
    w.member("zoned-0", 1, "zoned")
    d = w.step(after=1)
    assert not [b for b in d.binds if b.name == "zoned-0"]
    assert "topology key 'topology.kubernetes.io/zone' is not one of the configured topology levels" in (
        w.status_of(d, "zoned").message)


def test_disruption_mode_all_restarts_the_whole_gang_when_a_member_is_lost_and_single_waits() -> None:
    for mode, restarts in (({"all": {}}, True), ({"single": {}}, False)):
        w = Upstream()
        for n in ("n0", "n1"):
            w.node(n, 8)
        w.upstream("train", 2, disruptionMode=mode)
        members = [w.member(f"train-{i}", 8, "train") for i in range(2)]
        w.step()
        w.pods[members[0]]["status"]["phase"] = "Failed"
        w.session.on_pod("MODIFIED", parse_pod(w.pods[members[0]]))
        d = w.step(after=1)
        assert [e.uid for e in d.evictions] == ([members[1]] if restarts else []), mode


def test_initially_scheduled_stays_true_after_the_gang_loses_its_quorum_and_after_a_restart() -> None:
    w = Upstream()
    for n in ("n0", "n1"):
        w.node(n, 8)
    w.upstream("train", 2)
    members = [w.member(f"train-{i}", 8, "train") for i in range(2)]
    d = w.step()
    placed = w.status_of(d, "train")
    assert (placed.scheduled, placed.reason) == (True, "Scheduled")
    w.show("train", placed)
    w.session.on_pod("DELETED", parse_pod(w.pods.pop(members[0])))
    d = w.step(after=1)
    after = w.status_of(d, "train")
    assert after is None or after.scheduled  # never False again
    # a restarted batchsched reads the condition the group shows
    fresh = Upstream()
    fresh.node("n0", 8)
    fresh.groups["train"] = w.groups["train"]
    fresh.session.on_podgroup("ADDED", parse_podgroup(K8S, w.groups["train"]))
    fresh.member("train-1", 8, "train")
    status = fresh.status_of(fresh.step(), "train")
    assert status is None or status.scheduled


def test_a_group_mixing_schedulers_is_refused_with_an_event_and_none_of_it_is_placed() -> None:
    w = Upstream()
    w.node("n0", 8)
    w.upstream("mixed", 2)
    w.member("mixed-0", 1, "mixed")
    w.member("mixed-1", 1, "mixed", scheduler="default-scheduler")
    d = w.step()
    assert d.binds == []
    [event] = [e for e in d.events if e.reason == "InvalidPodGroup"]
    assert "1 of its member(s) name another scheduler" in event.message
    status = w.status_of(d, "mixed")
    assert (status.scheduled, status.reason) == (False, "SchedulerError")
    assert w.step(after=60).binds == []


def test_a_group_only_another_scheduler_places_is_left_alone() -> None:
    w = Upstream()
    w.node("n0", 8)
    w.upstream("theirs", 1)
    w.member("theirs-0", 1, "theirs", scheduler="default-scheduler")
    d = w.step()
    assert d.binds == [] and w.status_of(d, "theirs") is None and not d.events


def test_what_batchsched_does_not_read_yet_is_refused_visibly() -> None:
    composite = parse_podgroup(K8S, podgroup("part", 2, parentCompositePodGroupName="whole"))
    assert "composite pod group whole" in composite.invalid
    claims = parse_podgroup(K8S, podgroup("dra", 2, resourceClaims=[{"name": "gpu", "resourceClaimName": "c"}]))
    assert "resourceClaims" in claims.invalid
    both = podgroup("both", 2)
    both["spec"]["schedulingPolicy"]["basic"] = {}
    assert "exactly one of basic and gang" in parse_podgroup(K8S, both).invalid
    zero = parse_podgroup(K8S, podgroup("zero", 0))
    assert "minCount must be a positive integer" in zero.invalid
    w = Upstream()
    w.node("n0", 8)
    w.upstream("part", 1, parentCompositePodGroupName="whole")
    w.member("part-0", 1, "part")
    d = w.step()
    assert d.binds == [] and [e.reason for e in d.events if e.reason == "InvalidPodGroup"]


# -- where they meet the other policies ------------------------------------------------------------


def test_a_gang_labelled_with_a_queue_is_held_by_its_quota_and_charged_to_it() -> None:
    w = Upstream()
    for n in ("n0", "n1"):
        w.node(n, 8)
    w.session.on_queues_listed([{"metadata": {"name": "team", "uid": "q-team", "resourceVersion": "1"},
                                 "spec": {"resources": [{"name": GPU, "nominal": "8"}]}}])
    w.upstream("big", 2)
    w.groups["big"]["metadata"]["labels"] = {"batchsched.io/queue": "team"}
    w.session.on_podgroup("MODIFIED", parse_podgroup(K8S, w.groups["big"]))
    [w.member(f"big-{i}", 8, "big") for i in range(2)]
    d = w.step()
    assert d.binds == []  # 16 GPUs asked of a queue of 8, though the cluster has them
    assert "team" in w.status_of(d, "big").message
    w.upstream("fits", 1)
    w.groups["fits"]["metadata"]["labels"] = {"batchsched.io/queue": "team"}
    w.session.on_podgroup("MODIFIED", parse_podgroup(K8S, w.groups["fits"]))
    fits = w.member("fits-0", 8, "fits")
    assert [b.uid for b in w.step(after=1).binds] == [fits]


def test_a_waiting_gang_reserves_the_nodes_it_needs_against_later_small_pods() -> None:
    w = Upstream()
    for n in ("n0", "n1"):
        w.node(n, 8)
    first = [w.pod(f"first-{i}", 4, runtime="60s") for i in range(2)]
    w.step()
    assert all(w.bound(u) for u in first)
    w.now += 1
    w.upstream("big", 2)
    big = [w.member(f"big-{i}", 8, "big") for i in range(2)]
    w.step()
    started = None
    for tick in range(30):
        w.now += 5
        if w.now >= 1_800_000_060.0:
            for u in first:
                if u in w.pods and w.pods[u]["status"]["phase"] == "Running":
                    w.finish(u)
        w.pod(f"small-{tick}", 1, runtime="60s")  # a stream of later small pods
        w.step()
        if all(w.bound(u) for u in big):
            started = w.now
            break
    assert started is not None, "the stream of small pods starved the gang"


def test_members_sharing_gpu_cards_are_placed_as_one_gang() -> None:
    from batchsched.core import devices

    w = Upstream()
    w.session.on_node("ADDED", parse_node(make_node("card-node").cap(
        {"cpu": "64", "memory": "256Gi", devices.ELASTIC_CORE: "100", devices.ELASTIC_MEMORY: "16384"}).obj()))
    w.upstream("halves", 3)
    uids = []
    for i in range(3):
        obj = make_pod(f"halves-{i}").req({"cpu": "1", devices.ELASTIC_CORE: "50"}).created(w.now).obj()
        obj["spec"]["schedulingGroup"] = {"podGroupName": "halves"}
        w.pods[obj["metadata"]["uid"]] = obj
        w.session.on_pod("ADDED", parse_pod(obj))
        uids.append(obj["metadata"]["uid"])
    assert w.step().binds == []  # three halves of one card: none, not two
    w.session.on_pod("DELETED", parse_pod(w.pods.pop(uids[2])))
    w.groups["halves"]["spec"]["schedulingPolicy"] = {"gang": {"minCount": 2}}
    w.session.on_podgroup("MODIFIED", parse_podgroup(K8S, w.groups["halves"]))
    d = w.step(after=1)
    assert sorted(b.uid for b in d.binds) == sorted(uids[:2]) and {b.cards for b in d.binds} == {((0,),)}
