"""Pods Kueue manages: placed by batchsched, charged to none of its Queues, and (by default)
neither evicted by its preemption nor evicting others."""

from __future__ import annotations

from typing import Any

from batchsched.core.model import parse_pod
from batchsched.core.queues import QueueSettings
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_pod
from tests.unit.test_insight import GPU, World, _queue

KUEUE = {"kueue.x-k8s.io/managed": "true", "kueue.x-k8s.io/queue-name": "user-queue"}


def pod(w: World, name: str, gpus: int, *, labels: dict[str, str], priority: int = 0) -> str:
    obj: dict[str, Any] = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(w.now).priority(priority).label(labels).obj()
    w.pods[obj["metadata"]["uid"]] = obj
    w.session.on_pod("ADDED", parse_pod(obj))
    return str(obj["metadata"]["uid"])


def test_kueue_pods_are_placed_but_charged_to_no_queue_of_ours() -> None:
    w = World()
    w.node("n0", 8)
    w.session.on_queues_listed([_queue("team", 4)])
    ours = pod(w, "ours", 8, labels={"batchsched.io/queue": "team"})
    theirs = pod(w, "theirs", 8, labels={**KUEUE, "batchsched.io/queue": "team"})
    w.step()
    assert w.bound(theirs) and not w.bound(ours)  # ours is past team's 4 GPUs; theirs counts for none
    w.step(after=10)
    assert w.session.charged is not None and w.session.charged.report("team").used.get(GPU, 0) == 0


def _busy(w: World, *, running: dict[str, str], running_priority: int) -> str:
    w.node("n0", 8)
    uid = pod(w, "running", 8, labels=running, priority=running_priority)
    w.step()
    assert w.bound(uid)
    return uid


def test_our_preemption_leaves_kueue_pods_alone() -> None:
    w = World()
    _busy(w, running=KUEUE, running_priority=0)
    pod(w, "urgent", 8, labels={}, priority=1000)
    d = w.step(after=1)
    assert d.evictions == []


def test_kueue_pods_do_not_preempt_ours() -> None:
    w = World()
    _busy(w, running={}, running_priority=0)
    pod(w, "admitted", 8, labels=KUEUE, priority=1000)
    d = w.step(after=1)
    assert d.evictions == []


def test_configured_preemptible_they_take_part_as_unqueued_work() -> None:
    w = World()
    w.session = Session(SessionSettings(queues=QueueSettings(kueue_preemptible=True)))
    victim = _busy(w, running=KUEUE, running_priority=0)
    pod(w, "urgent", 8, labels={}, priority=1000)
    d = w.step(after=1)
    assert [e.uid for e in d.evictions] == [victim]


# -- Kueue's plain pod groups: a gang without a PodGroup object ----------------------------------

GROUP = {**KUEUE, "kueue.x-k8s.io/pod-group-name": "trainer"}


def member(w: World, name: str, gpus: int, *, total: str = "2") -> str:
    obj: dict[str, Any] = (make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(w.now).label(GROUP)
                           .annotate({"kueue.x-k8s.io/pod-group-total-count": total}).obj())
    w.pods[obj["metadata"]["uid"]] = obj
    w.session.on_pod("ADDED", parse_pod(obj))
    return str(obj["metadata"]["uid"])


def test_a_kueue_pod_group_is_placed_whole_once_all_its_members_are_there() -> None:
    w = World()
    w.node("n0", 8)
    w.node("n1", 8)
    first = member(w, "trainer-0", 8)
    d = w.step()
    assert d.binds == [] and not w.bound(first)  # one of two: it waits for the other
    second = member(w, "trainer-1", 8)
    d = w.step(after=1)
    assert sorted(b.uid for b in d.binds) == sorted([first, second])
    assert d.group_statuses == []  # no PodGroup object to write to


def test_a_kueue_pod_group_that_cannot_fit_whole_takes_nothing() -> None:
    w = World()
    w.node("n0", 8)
    uids = [member(w, f"trainer-{i}", 8) for i in range(2)]
    d = w.step()
    assert d.binds == [] and not any(w.bound(u) for u in uids)
    msgs = {c.message for c in d.unschedulable if c.ref.name.startswith("trainer-")}
    assert msgs and all("gang needs 2 pods" in m for m in msgs), msgs
    events = [e for e in d.events if e.ref.kind == "Workload"]
    assert all(e.ref.name == "trainer" and e.ref.api_version.startswith("kueue.x-k8s.io/") for e in events)


def test_an_unreadable_total_count_is_told_and_nothing_is_placed() -> None:
    w = World()
    w.node("n0", 8)
    uid = member(w, "trainer-0", 1, total="two")
    d = w.step()
    [event] = [e for e in d.events if e.reason == "InvalidPodGroup"]
    assert (event.ref.kind, event.ref.name) == ("Workload", "trainer")
    assert event.message == (
        "Kueue pod group default/trainer is invalid, its pods are not scheduled: annotation "
        "kueue.x-k8s.io/pod-group-total-count of pod trainer-0 must be a positive integer, got 'two'"
    )
    told = [c.message for s in range(3) for c in w.step(after=1).unschedulable if c.ref.name == "trainer-0"]
    assert told and told[0].startswith("Kueue pod group default/trainer is invalid: annotation"), told
    assert not w.bound(uid)
