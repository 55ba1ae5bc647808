"""A stopped queue admits nothing, not even a preemptor whose victims are gone.

A pod preempts; while its victim terminates, its Queue is stopped. The capacity held for
it (its nomination) is given up at once, its ``nominatedNodeName`` cleared and the reason
told to it; when the victim is gone it stays pending like any other work of the queue, and
once the queue runs again it is placed. The same holds after a restart, when the
nomination is rebuilt from the pod's ``nominatedNodeName``.
"""

from __future__ import annotations

from typing import Any

from batchsched.core.decisions import Decisions
from batchsched.core.session import Session
from tests.builders import make_pod
from tests.unit.test_session import GPU, T0, Cluster, events

HELD = "queue team is stopped (stopPolicy {policy}): it admits no new work until its stopPolicy is None"


def queue(stop: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": [{"name": GPU, "nominal": "16"}]}
    if stop:
        spec["stopPolicy"] = stop
    return {"metadata": {"name": "team", "uid": "q-team", "resourceVersion": "1"}, "spec": spec}


def team_pod(name: str, gpus: int, *, priority: int = 0, created: float = T0 - 60) -> dict[str, Any]:
    return (make_pod(name).req(cpu="1", **{GPU: str(gpus)}).priority(priority).created(created)
            .label({"batchsched.io/queue": "team"}).obj())


def nominate(c: Cluster, d: Decisions) -> None:
    """Write the nominated nodes the step asked for, as the status writer does."""
    for ref, node in d.nominated:
        c.pods[ref.uid]["status"]["nominatedNodeName"] = node
        c._modified(ref.uid)


def condition(d: Decisions, uid: str) -> str:
    return next((u.message for u in d.unschedulable if u.ref.uid == uid), "")


def preempting(stop: str) -> tuple[Cluster, str, str]:
    """A preemptor of queue ``team`` waiting for its victim to terminate, when the queue
    is stopped with ``stop``: returns the cluster, the victim's uid and the preemptor's."""
    s = Session()
    c = Cluster(s)
    c.node("n0", 8)
    s.on_queues_listed([queue()])
    low = c.pod(team_pod("low", 8))
    assert [b.uid for b in c.step().binds] == [low]
    urgent = c.pod(team_pod("urgent", 8, priority=100))
    d = c.step(after=1.0)
    assert [e.uid for e in d.evictions] == [low]
    nominate(c, d)
    assert c.pods[urgent]["status"]["nominatedNodeName"] == "n0"
    s.on_queue("MODIFIED", queue(stop))
    return c, low, urgent


def test_a_stopped_queue_drops_its_preemptors_nomination_and_binds_it_only_when_it_runs_again() -> None:
    c, low, urgent = preempting("Hold")
    d = c.step(after=1.0)
    assert [(r.uid, node) for r, node in d.nominated] == [(urgent, "")]  # nominatedNodeName cleared
    nominate(c, d)
    assert events(d, "NominationDropped") == [
        "gave up the capacity held for it on node(s) n0: queue team is stopped (stopPolicy Hold); "
        "it is tried again once its queue admits work"
    ]
    assert condition(d, urgent) == HELD.format(policy="Hold")
    assert d.plan is not None and d.plan.nominations == []

    c.delete_pod(low)  # the victim is gone: the node is free, the queue still held
    late = c.pod(team_pod("late", 8, priority=100, created=c.now))
    for _ in range(3):
        d = c.step(after=1.0)
        assert d.binds == [] and d.nominated == []
    assert not c.node_of(urgent) and not c.node_of(late)

    c.session.on_queue("MODIFIED", queue())  # running again: the oldest first
    d = c.step(after=1.0)
    assert [(b.uid, b.node) for b in d.binds] == [(urgent, "n0")]


def test_hold_and_drain_drops_the_nomination_too() -> None:
    c, low, urgent = preempting("HoldAndDrain")
    d = c.step(after=1.0)
    assert [(r.uid, node) for r, node in d.nominated] == [(urgent, "")]
    assert condition(d, urgent) == HELD.format(policy="HoldAndDrain")
    c.delete_pod(low)
    d = c.step(after=1.0)
    assert d.binds == [] and not c.node_of(urgent)


def test_a_restart_does_not_revive_the_nomination_of_a_stopped_queue() -> None:
    # what a fresh replica lists: the victim gone, the preemptor still showing the node
    # it was nominated to, its queue stopped
    for victim_left in (False, True):
        s = Session()
        c = Cluster(s)
        c.node("n0", 8)
        s.on_queues_listed([queue("Hold")])
        if victim_left:
            victim = team_pod("low", 8)
            victim["spec"]["nodeName"] = "n0"
            victim["status"]["phase"] = "Running"
            victim["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
            c.pod(victim)
        obj = team_pod("urgent", 8, priority=100)
        obj["status"]["nominatedNodeName"] = "n0"
        urgent = c.pod(obj)
        d = c.step()
        assert d.binds == []
        assert [(r.uid, node) for r, node in d.nominated] == [(urgent, "")]
        assert condition(d, urgent) == HELD.format(policy="Hold")
        assert events(d, "NominationDropped") == [
            "gave up the capacity held for it on node(s) n0: queue team is stopped (stopPolicy Hold); "
            "it is tried again once its queue admits work"
        ]
        nominate(c, d)
        if victim_left:
            c.delete_pod(str(victim["metadata"]["uid"]))
        assert c.step(after=1.0).binds == []
        s.on_queue("MODIFIED", queue())
        assert [(b.uid, b.node) for b in c.step(after=1.0).binds] == [(urgent, "n0")]
