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
