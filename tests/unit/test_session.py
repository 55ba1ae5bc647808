"""The scheduling session on a fake clock, with no apiserver.

A small in-memory cluster (:class:`Cluster`) plays the apiserver's part: it applies the
session's bindings and evictions the way Kubernetes would (a bound pod appears with its
``nodeName``; an evicted pod first terminates, then is gone, when the test says so) and
feeds the resulting watch events back. Time moves only when a test moves it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchsched.core.decisions import Decisions
from batchsched.core.mirror import StateError
from batchsched.core.model import PodUID, parse_node, parse_pod
from batchsched.core.plan import UnitStatus
from batchsched.core.queues import QueueSettings
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_node, make_pod

T0 = 1_800_000_000.0
GPU = "nvidia.com/gpu"


class Cluster:
    """The apiserver's side of the session's decisions, applied at once."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.now = T0
        self.pods: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.decisions: list[Decisions] = []

    def node(self, name: str, gpus: int) -> None:
        obj = make_node(name).cap(cpu="64", memory="512Gi", **{GPU: str(gpus)}).obj()
        self.nodes[name] = obj
        self.session.on_node("ADDED", parse_node(obj))

    def delete_node(self, name: str) -> None:
        self.session.on_node("DELETED", parse_node(self.nodes.pop(name)))

    def pod(self, obj: dict[str, Any]) -> str:
        uid = str(obj["metadata"]["uid"])
        self.pods[uid] = obj
        self.session.on_pod("ADDED", parse_pod(obj))
        return uid

    def _modified(self, uid: str) -> None:
        self.session.on_pod("MODIFIED", parse_pod(self.pods[uid]))

    def delete_pod(self, uid: str) -> None:
        self.session.on_pod("DELETED", parse_pod(self.pods.pop(uid)))

    def node_of(self, uid: str) -> str:
        return str(self.pods[uid]["spec"].get("nodeName", ""))

    def step(self, *, after: float = 0.0) -> Decisions:
        """Move the clock, run a step, apply its bindings and evictions."""
        self.now += after
        d = self.session.step(self.now)
        self.decisions.append(d)
        for b in d.binds:
            obj = self.pods[b.uid]
            obj["spec"]["nodeName"] = b.node
            obj["status"]["phase"] = "Running"
            obj["status"]["startTime"] = "2027-01-15T08:00:00Z"
            self.session.on_bind_result(b, "bound", now=self.now)
            self._modified(b.uid)
        for e in d.evictions:
            if e.uid not in self.pods:
                continue
            # the Eviction API sets the deletion timestamp; the pod terminates until the test deletes it
            self.pods[e.uid]["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
            self.session.on_evict_result(e, "evicted")
            self._modified(e.uid)
        return d


def gpu_pod(name: str, gpus: int, *, priority: int = 0, group: str = "") -> dict[str, Any]:
    b = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).priority(priority).created(T0 - 60)
    if group:
        b = b.group(group)
    return b.obj()


def events(d: Decisions, reason: str) -> list[str]:
    return [e.message for e in d.events if e.reason == reason]


def test_a_gang_left_below_quorum_is_evicted_whole_when_its_timeout_runs_out() -> None:
    s = Session(SessionSettings(gang_default_timeout=10.0, gang_initial_backoff=5.0))
    c = Cluster(s)
    c.node("n0", 4)
    c.node("n1", 4)
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("train").min_member(2).build()])
    a = c.pod(gpu_pod("train-0", 4, group="train"))
    b = c.pod(gpu_pod("train-1", 4, group="train"))
    d = c.step()
    assert sorted(x.uid for x in d.binds) == sorted([a, b])
    assert {c.node_of(a), c.node_of(b)} == {"n0", "n1"}

    # the node under one member vanishes; its pod is recreated and has nowhere to go
    lost = a if c.node_of(a) == "n1" else b
    kept = b if lost == a else a
    c.delete_node("n1")
    c.delete_pod(lost)
    c.pod(gpu_pod("train-1b", 4, group="train"))
    d = c.step(after=1.0)
    assert d.binds == []
    assert events(d, "GangIncomplete") == [
        "1 of 2 required members are placed; retrying the other 1 as one gang"
    ]
    d = c.step(after=5.0)
    assert d.evictions == []  # still within its 10 s
    d = c.step(after=6.0)
    assert [e.uid for e in d.evictions] == [kept]
    assert d.evictions[0].preemptor == ""
    assert events(d, "GangTimeout") == [
        "only 1 of 2 required members were placed within 10 s; evicting the 1 bound member(s) "
        "to release their resources and retrying the whole gang after 5 s"
    ]
    statuses = {g.name: st for g, st in d.group_statuses}
    assert statuses["train"].reason == "GangBackoff"
    assert statuses["train"].message == (
        "gang default/train timed out after 10 s with 1 of 2 required members placed; its bound "
        "members were evicted and it is retried after 5 s"
    )


def _preemption_world(timeout: float = 300.0) -> tuple[Cluster, str, str]:
    s = Session(SessionSettings(queues=QueueSettings(nomination_timeout=timeout)))
    c = Cluster(s)
    c.node("n0", 8)
    low = c.pod(gpu_pod("low", 8, priority=0))
    assert [b.uid for b in c.step().binds] == [low]
    high = c.pod(gpu_pod("urgent", 8, priority=100))
    return c, low, high


def test_a_preemptor_gets_the_capacity_it_freed_and_nobody_else_takes_it() -> None:
    c, low, high = _preemption_world()
    d = c.step(after=1.0)
    assert d.binds == []
    assert [(e.uid, e.preemptor) for e in d.evictions] == [(low, "default/urgent")]
    assert events(d, "Preempting") == ["preempting 1 pod(s) of default/low to place its 1 pod(s) on node(s) n0"]
    assert d.plan is not None and d.plan.results["default/urgent"].status is UnitStatus.PREEMPTING
    assert [e.reason for e in c.decisions[-1].events].count("Preempting") == 1

    # while the victim terminates, a newer pod of middle priority arrives: the node is held
    mid = c.pod(gpu_pod("mid", 8, priority=50))
    d = c.step(after=1.0)
    assert d.binds == [] and d.evictions == []
    assert d.plan is not None
    waiting = d.plan.results["default/urgent"]
    assert waiting.status is UnitStatus.WAITING
    assert waiting.message == "waiting for 1 preempted pod(s) to terminate; node(s) n0 are held for it"

    c.delete_pod(low)
    d = c.step(after=1.0)
    assert [(b.uid, b.node) for b in d.binds] == [(high, "n0")]
    assert c.node_of(mid) == ""


def test_a_nomination_expires_when_its_victims_never_leave() -> None:
    c, low, _ = _preemption_world(timeout=60.0)
    d = c.step(after=1.0)
    assert [e.uid for e in d.evictions] == [low]
    d = c.step(after=30.0)
    assert events(d, "NominationExpired") == []
    d = c.step(after=31.0)
    assert events(d, "NominationExpired") == [
        "gave up the capacity held for it on node(s) n0 after 60 s; it is tried again as usual"
    ]
    assert [e.ref.name for e in d.events if e.reason == "NominationExpired"] == ["urgent"]
    # the terminating victim may not be preempted twice: the preemptor now simply waits,
    # holding a reservation on the victim's node (batchsched.core.reservation)
    assert d.evictions == [] and d.binds == []
    assert d.plan is not None and d.plan.results["default/urgent"].reason == "Reserved"


def test_a_unit_that_did_not_fit_is_not_retried_until_something_changes() -> None:
    s = Session(SessionSettings(retry_unschedulable=30.0))
    c = Cluster(s)
    c.node("n0", 4)
    big = c.pod(gpu_pod("big", 8))
    d = c.step()
    assert [u.ref.uid for u in d.unschedulable] == [big]
    assert not s.wants_step
    d = c.step(after=10.0)
    assert d.plan is None  # nothing changed: not tried again
    c.node("n1", 8)
    assert s.wants_step
    d = c.step(after=1.0)
    assert [(b.uid, b.node) for b in d.binds] == [(big, "n1")]


def test_a_failed_unit_is_retried_after_the_retry_interval_even_if_nothing_changed() -> None:
    s = Session(SessionSettings(retry_unschedulable=30.0))
    c = Cluster(s)
    c.node("n0", 4)
    c.pod(gpu_pod("big", 8))
    c.step()
    assert c.step(after=29.0).plan is None
    d = c.step(after=2.0)
    assert d.plan is not None and d.plan.results["default/big"].status is UnitStatus.UNSCHEDULABLE


def test_a_gang_blocked_before_placement_is_told_only_after_the_report_delay() -> None:
    s = Session(SessionSettings(gang_report_delay=2.0))
    c = Cluster(s)
    c.node("n0", 8)
    c.pod(gpu_pod("w-0", 1, group="late"))
    d = c.step()
    assert d.unschedulable == []  # its PodGroup usually arrives with it
    d = c.step(after=3.0)
    assert [(u.reason, u.message) for u in d.unschedulable] == [
        ("PodGroupNotFound", "waiting for PodGroup default/late to exist")
    ]


def test_a_binding_the_watch_never_confirms_is_read_again() -> None:
    s = Session(SessionSettings(assumed_timeout=30.0))
    c = Cluster(s)
    c.node("n0", 8)
    uid = c.pod(gpu_pod("p", 1))
    d = s.step(c.now)  # bound by the session, but no watch event ever comes
    assert [b.uid for b in d.binds] == [uid]
    s.on_bind_result(d.binds[0], "bound", now=c.now)
    assert s.step(c.now + 10.0).resyncs == []
    assert [r.uid for r in s.step(c.now + 31.0).resyncs] == [uid]


def test_a_binding_still_waiting_in_the_binders_queue_is_not_read_again() -> None:
    # at 5,000 nodes x 40,000 pods the first steps handed the binder over 10,000 Bindings,
    # which it sends a few hundred a second: every one not yet answered when the assumed
    # timeout ran out (timed from the step) was read again, 14,119 GETs of pods over the
    # bind window, loading the apiserver the Bindings waited for
    s = Session(SessionSettings(assumed_timeout=30.0))
    c = Cluster(s)
    c.node("n0", 8)
    for i in range(4):
        c.pod(gpu_pod(f"p{i}", 1))
    d = s.step(c.now)
    first, *rest = d.binds
    assert len(rest) == 3
    s.on_bind_result(first, "bound", now=c.now + 20.0)  # the others still wait their turn
    assert s.step(c.now + 45.0).resyncs == []  # 45 s after the step, 25 s after the first was accepted
    assert [r.uid for r in s.step(c.now + 51.0).resyncs] == [first.uid]
    for b in rest:
        s.on_bind_result(b, "bound", now=c.now + 60.0)
    assert s.step(c.now + 80.0).resyncs == []
    assert {r.uid for r in s.step(c.now + 91.0).resyncs} == {b.uid for b in d.binds}
    # the watch shows one bound before its answer arrives: nothing left to read of it
    c.pods[rest[0].uid]["spec"]["nodeName"] = "n0"
    c._modified(rest[0].uid)
    s.on_bind_result(rest[0], "bound", now=c.now + 92.0)
    assert rest[0].uid not in {r.uid for r in s.step(c.now + 200.0).resyncs}


def test_a_bind_conflict_asks_for_a_resync_and_forgets_the_pod_once_read_unbound() -> None:
    s = Session()
    c = Cluster(s)
    c.node("n0", 8)
    uid = c.pod(gpu_pod("p", 8))
    d = s.step(c.now)
    out = s.on_bind_result(d.binds[0], "conflict", now=c.now)
    assert [r.uid for r in out.resyncs] == [uid]
    assert uid in {str(u) for u in s.state.assumed}  # held until read: it may be bound
    c._modified(uid)  # read again: not bound
    s.on_pod_read(PodUID(uid), now=c.now)
    assert uid not in {str(u) for u in s.state.assumed}
    assert s.wants_step


def test_steps_are_deterministic_for_the_same_events() -> None:
    def run() -> list[tuple[str, str]]:
        s = Session()
        c = Cluster(s)
        for i in range(4):
            c.node(f"n{i}", 8)
        for i in range(12):
            c.pod(gpu_pod(f"p{i}", 1 + i % 4))
        return [(b.name, b.node) for b in c.step().binds]

    first = run()
    assert len(first) == 12
    assert run() == first
    assert copy.deepcopy(first) == run()


def test_a_broken_mirror_stops_the_step_loudly() -> None:
    s = Session()
    c = Cluster(s)
    c.node("n0", 8)
    c.pod(gpu_pod("p", 2))
    c.step()
    s.state.used[s.state.node_row["n0"]] -= s.state.vector({GPU: 4000})  # usage below zero
    with pytest.raises(StateError, match="usage below zero on nodes \\['n0'\\]"):
        s.step(c.now + 1.0)


def test_the_full_usage_check_runs_on_its_interval() -> None:
    s = Session()
    c = Cluster(s)
    c.node("n0", 8)
    c.pod(gpu_pod("p", 2))
    c.step()
    s.state.used[s.state.node_row["n0"]] += s.state.vector({GPU: 1000})  # more than is charged
    s.step(c.now + 1.0)  # the cheap books still hold
    with pytest.raises(StateError, match="usage bookkeeping is off on nodes \\['n0'\\]"):
        s.step(c.now + 61.0)


def test_an_invalid_pod_among_alike_pods_is_told_why() -> None:
    s = Session()
    c = Cluster(s)
    c.node("n0", 8)
    ok = [c.pod(gpu_pod(f"ok{i}", 1)) for i in range(3)]
    bad = make_pod("bad").req(cpu="1", **{GPU: "1e30"}).created(T0 - 60).obj()
    c.pod(bad)
    d = c.step()
    assert sorted(b.uid for b in d.binds) == sorted(ok)
    [cond] = d.unschedulable
    assert cond.ref.name == "bad"
    assert cond.message == (
        "pod default/bad cannot be scheduled: unreadable resource request: quantity '1e30' of "
        "nvidia.com/gpu is beyond what batchsched counts (at most 1125899906842623)"
    )
    assert d.plan is not None and d.plan.results["default/bad"].status is UnitStatus.UNRESOLVABLE


def test_a_node_whose_allocatable_cannot_be_read_is_told_once() -> None:
    s = Session()
    odd = make_node("odd").cap(cpu="8", memory="64Gi", **{GPU: "8", "example.com/widget": "1e30"}).obj()
    s.on_node("ADDED", parse_node(odd))
    s.on_node("MODIFIED", parse_node(odd))
    d = s.step(T0)
    [ev] = [e for e in d.events if e.reason == "UnreadableAllocatable"]
    assert (ev.ref.kind, ev.ref.name, ev.type) == ("Node", "odd", "Warning")
    assert ev.message == (
        "node odd: example.com/widget treated as unusable, its allocatable cannot be read: quantity "
        "'1e30' of example.com/widget is beyond what batchsched counts (at most 1125899906842623)"
    )
    s.on_node("MODIFIED", parse_node(odd))
    assert [e for e in s.step(T0 + 1).events if e.reason == "UnreadableAllocatable"] == []
    assert s.state.nodes["odd"].allocatable[GPU] == 8


def test_a_preemption_writes_the_nominated_node_and_clears_it_when_given_up() -> None:
    c, _, high = _preemption_world(timeout=60.0)
    d = c.step(after=1.0)
    assert [(r.uid, node) for r, node in d.nominated] == [(high, "n0")]
    c.pods[high]["status"]["nominatedNodeName"] = "n0"
    c._modified(high)
    d = c.step(after=61.0)
    assert [(r.uid, node) for r, node in d.nominated] == [(high, "")]


def test_after_a_restart_the_nominated_preemptor_still_gets_the_capacity_it_freed() -> None:
    # what a restarted replica lists: of the two 4-GPU victims one is gone and one still
    # terminating, the preemptor nominated to their node, and smaller work that arrived
    s = Session()
    c = Cluster(s)
    c.node("n0", 8)
    staying = gpu_pod("victim-1", 4)
    staying["spec"]["nodeName"] = "n0"
    staying["status"]["phase"] = "Running"
    staying["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    preemptor = gpu_pod("urgent", 8, priority=100)
    preemptor["status"]["nominatedNodeName"] = "n0"
    small = gpu_pod("small", 1)
    c.pod(staying)
    high = c.pod(preemptor)
    c.pod(small)
    d = c.step()
    assert d.binds == []  # the 4 free GPUs are held for the preemptor
    assert d.plan is not None
    held = d.plan.results["default/urgent"]
    assert (held.status, held.reason) == (UnitStatus.WAITING, "WaitingForPreemption")
    assert held.message == "waiting for 1 preempted pod(s) to terminate; node(s) n0 are held for it"
    c.delete_pod(str(staying["metadata"]["uid"]))
    d = c.step(after=1.0)
    assert [(b.uid, b.node) for b in d.binds] == [(high, "n0")]


def test_a_gang_with_min_resources_preempts_what_it_may_and_only_that() -> None:
    s = Session(SessionSettings(gang_report_delay=0.0))
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    low = c.pod(gpu_pod("low", 8, priority=0))
    same = c.pod(gpu_pod("same", 8, priority=50))
    assert len(c.step().binds) == 2
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("g").min_member(2).min_resources(gpu=16).build()])
    members = [c.pod(gpu_pod(f"g-{i}", 8, priority=50, group="g")) for i in range(2)]
    d = c.step(after=1.0)
    # it may evict "low" (lower priority), not "same" (equal): 16 GPUs are out of its reach;
    # it evicts nothing, and holds the nodes it waits for
    assert d.evictions == []
    assert {u.message for u in d.unschedulable} == {
        "gang default/g needs minResources the cluster cannot free for it: 16 nvidia.com/gpu "
        "(free: 0, preemptible for it: 8); holds a reservation on node(s) n0, n1; start time unknown "
        "(running work on those nodes declares no end)"
    }
    # "same" ends: free and preemptible now cover minResources, and the gang preempts "low"
    c.delete_pod(same)
    d = c.step(after=1.0)
    assert [(e.uid, e.preemptor) for e in d.evictions] == [(low, "x-k8s:default/g")]
    c.delete_pod(low)
    d = c.step(after=1.0)
    assert sorted(b.uid for b in d.binds) == sorted(members)


def test_a_gangs_pods_are_told_a_new_reason_at_once_with_its_message() -> None:
    from batchsched.core.books.statuses import GroupReports

    reports = GroupReports(Session().groups, Session().settings.levels)
    assert reports.pod_message("g", "Unschedulable", "only 1 fit now", T0) == "only 1 fit now"
    # the same reason, a new message within the interval: the pods keep the last one
    assert reports.pod_message("g", "Unschedulable", "only 0 fit now", T0 + 5) == "only 1 fit now"
    # a new reason: told at once, never under the old message
    assert reports.pod_message("g", "Reserved", "holds a reservation", T0 + 6) == "holds a reservation"


def test_a_pod_read_again_after_the_watch_showed_it_bound_does_not_undo_the_binding() -> None:
    # at 5,000 nodes x 40,000 pods the binder's queue outlasted the assumed timeout: the pod
    # was read again, its Binding landed and the watch showed it bound while the read was
    # under way, then the read's older answer (unbound) arrived: the pod was pending and
    # charged at once, and the scheduler stopped on its broken books
    s = Session(SessionSettings(assumed_timeout=30.0))
    c = Cluster(s)
    c.node("n0", 8)
    obj = gpu_pod("p", 8)
    obj["metadata"]["resourceVersion"] = "100"
    uid = c.pod(obj)
    d = s.step(c.now)
    s.on_bind_result(d.binds[0], "bound", now=c.now)  # accepted; the watch lags behind
    assert [r.uid for r in s.step(c.now + 31.0).resyncs] == [uid]  # read again: its GET starts
    read = copy.deepcopy(c.pods[uid])  # what the GET sees: unbound, at 100
    bound = c.pods[uid]
    bound["spec"]["nodeName"] = d.binds[0].node
    bound["status"]["phase"] = "Running"
    bound["metadata"]["resourceVersion"] = "105"
    c._modified(uid)  # the watch: bound, at 105
    s.on_pod("MODIFIED", parse_pod(read), read=True)  # then the GET's answer
    s.on_pod_read(PodUID(uid), now=c.now + 33.0)
    s.check(c.now + 33.0)
    assert uid not in s.state.pending and s.state.charges[PodUID(uid)][0] == "n0"
    assert s.state.pods[PodUID(uid)].node_name == "n0"
    # a read as new as the mirror's version (or newer) is applied
    newer = copy.deepcopy(bound)
    newer["metadata"]["resourceVersion"] = "110"
    newer["metadata"]["labels"] = {"seen": "again"}
    s.on_pod("MODIFIED", parse_pod(newer), read=True)
    assert s.state.pods[PodUID(uid)].labels == {"seen": "again"}
