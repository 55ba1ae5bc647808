"""Queues, quotas, fair share, preemption and reclaim through the real cycle.

The declarative scenarios of ``tests/scenarios/queue-*.yaml`` (the format is in
:mod:`tests.queue_scenarios`) run here with their pods, PodGroups, queues, namespaces and
PodDisruptionBudgets as objects in the mirror, through
:class:`~batchsched.core.queues.QueueBook` and :meth:`Cycle.run`: each must give the
admissions, nominations, evictions, reasons and order it expects, decide every pending
unit exactly once, and leave no queue over its limits and no node over-committed once its
decisions are carried out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from batchsched.core.placement import kernels
from batchsched.core.queues import QueueSettings
from tests.queue_scenarios import SCENARIOS, pdb_object, pod_specs, queue_object
from tests.unit.queue_world import Outcome, QueueWorld


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    kernels.warm_up()


def world_of(sc: dict[str, Any]) -> QueueWorld:
    w = QueueWorld(QueueSettings(default_queue=sc.get("defaultQueue", ""), max_wait=float(sc.get("maxWait", 0))))
    for n in sc["nodes"]:
        w.node(n["name"], gpu=n.get("gpu", 0), cpu=str(n.get("cpu", 64)), memory=str(n.get("memory", "256Gi")))
    w.queues(queue_object(q) for q in sc.get("queues", []))
    w.namespaces(sc.get("namespaces", {}))
    w.pdbs(pdb_object(b) for b in sc.get("pdbs", []))
    for r in sc.get("running", []):
        specs = pod_specs(r)
        w.unit(r["name"], specs, namespace=r.get("namespace", "default"), queue=r.get("queue"),
               priority=int(r.get("priority", 0)), created=float(r.get("created", 0)),
               volcano_queue=r.get("podGroupQueue"), labels=r.get("labels"),
               nodes=[p["node"] for p in specs], start=float(r.get("start", 0)))
    for u in sc.get("pending", []):
        specs = pod_specs(u)
        w.unit(u["name"], specs, namespace=u.get("namespace", "default"), queue=u.get("queue"),
               priority=int(u.get("priority", 0)), created=float(u.get("created", 0)),
               min_member=u.get("minMember"), volcano_queue=u.get("podGroupQueue"), labels=u.get("labels"))
    return w


def run_cycle_scenario(sc: dict[str, Any]) -> Outcome:
    w = world_of(sc)
    now = float(sc.get("now", 0))
    before = w.state.snapshot()
    assert np.all(before.used <= before.alloc), "running work over-commits a node"
    plan = w.step(now, apply=False)
    # whatever happened, the limits hold: the queues (running work, nominations and this
    # cycle's admissions) ...
    assert w.last_input is not None
    w.last_input.tree.check()
    got = w.outcome(plan)
    # ... and the nodes, once the decisions are carried out: the victims gone, the admitted
    # pods bound where they were placed and the nominated ones where they are held
    for b in plan.bindings:
        w.bind(b.uid, b.node, now)
    for rec in plan.preemptions:
        for v in rec.victims:
            for p in v.pods:
                assert w.delete(p.uid) is not None, p.uid
    for n in plan.nominations:
        for uid, node in zip(n.pods, n.nodes, strict=True):
            w.bind(uid, node, now)
    w.state.check()
    after = w.state.snapshot()
    assert np.all(after.used <= after.alloc), "the decisions over-commit a node"
    return got


def test_there_are_scenarios() -> None:
    assert len(SCENARIOS) >= 6


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_through_the_cycle(path: Path) -> None:
    sc = yaml.safe_load(path.read_text())
    expect = sc["expect"]
    got = run_cycle_scenario(sc)
    assert got.admitted == expect.get("admitted", {})
    assert got.nominated == expect.get("nominated", {})
    assert got.evicted == expect.get("evicted", {})
    assert sorted(got.pending) == sorted(expect.get("pending", {})), got.pending
    for key, text in expect.get("pending", {}).items():
        assert text in got.pending[key], (key, got.pending[key])
    assert sorted(got.problems) == sorted(expect.get("problems", {})), got.problems
    for key, text in expect.get("problems", {}).items():
        assert text in got.problems[key], (key, got.problems[key])
    if "order" in expect:
        assert got.order == expect["order"]
    # every pending unit is decided, exactly once
    names = [u["name"] for u in sc.get("pending", [])]
    decided = [*got.admitted, *got.nominated, *got.pending, *got.problems]
    assert sorted(decided) == sorted(names)


# -- across cycles ----------------------------------------------------------------------------

GPU8 = [{"gpu": 8}]


def research(within: str = "LowerPriority") -> dict[str, Any]:
    return queue_object({"name": "research", "resources": {"nvidia.com/gpu": {"nominal": 16}},
                         "preemption": {"withinQueue": within}})


def test_a_nomination_holds_the_freed_nodes_until_the_victims_are_gone() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.node("n2", gpu=8)
    w.queues([research()])
    w.unit("low", [{"gpu": 4}] * 4, queue="research", priority=-1, nodes=["n1", "n1", "n2", "n2"], start=1000)
    w.unit("urgent", GPU8, queue="research", priority=10, created=9000)
    plan = w.step(10_000)
    [rec] = plan.preemptions
    assert rec.preemptor.key == "default/urgent" and rec.nodes == ("n1",)
    assert [v.unit.key for v in rec.victims] == ["x-k8s:default/low"] and rec.victims[0].whole
    assert rec.messages[0] == (
        "Preempted by default/urgent (priority 10) to make room on node(s) n1: "
        "its priority -1 is lower in queue research"
    )
    assert not plan.bindings and "default/urgent" in plan.nominated
    # the victims terminate slowly; a small job arrives meanwhile and may not take n1
    for i in range(4):
        pod = w.state.pods[f"default-low-{i}"]  # type: ignore[index]
        obj = {"metadata": {"name": pod.name, "namespace": "default", "uid": pod.uid,
                            "labels": dict(pod.labels), "deletionTimestamp": "2024-01-01T00:00:00Z"},
               "spec": {"schedulerName": "batchsched", "nodeName": pod.node_name, "priority": -1,
                        "containers": [{"name": "m", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
               "status": {"phase": "Running"}}
        w.pod(obj)
    w.unit("small", [{"gpu": 4}], queue="research", priority=20, created=9500)
    plan = w.step(10_001)
    assert not plan.bindings and not plan.preemptions
    assert plan.nominated["default/urgent"].startswith("waiting for 4 preempted pod(s) to terminate")
    # the small job may not take n1 (held for the nominee); it goes where the victims' pods
    # still terminate, so it is held there too, not bound
    [held] = [n for n in plan.nominations if n.unit == "default/small"]
    assert held.nodes == ("n2",) and len(held.victims) == 2
    # the victims are gone: the nominee goes first, on its node
    for i in range(4):
        w.delete(f"default-low-{i}")
    plan = w.step(10_002)
    assert sorted((b.name, b.node) for b in plan.bindings) == [("small", "n2"), ("urgent", "n1")]
    assert not plan.nominations and not w.nominations


def test_a_nomination_expires() -> None:
    w = QueueWorld(QueueSettings(nomination_timeout=60))
    w.node("n1", gpu=8)
    w.queues([research()])
    w.unit("low", GPU8, queue="research", priority=-1, nodes=["n1"], start=1000)
    w.unit("urgent", GPU8, queue="research", priority=10, created=9000)
    assert w.step(10_000).preemptions
    assert w.step(10_030).nominated
    assert w.nominations.expired(w.state, 10_061) and w.nominations.expired(w.state, 10_061)[0].unit == "default/urgent"
    plan = w.step(10_061)
    # given up: the victim is still there (an eviction never happened), so it preempts again
    [rec] = plan.preemptions
    assert rec.preemptor.key == "default/urgent"


def test_units_admitted_in_this_cycle_are_never_victims() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.queues([research()])
    w.unit("first-low", GPU8, queue="research", priority=-1, created=1)
    w.unit("later-high", GPU8, queue="research", priority=10, created=2)
    plan = w.step(10_000)
    # the high one goes first; the low one does not fit and cannot evict the newcomer
    assert [b.name for b in plan.bindings] == ["later-high"]
    assert not plan.preemptions
    # it waits, holding the node for when later-high ends
    assert plan.results["default/first-low"].reason == "Reserved"


def test_unqueued_work_preempts_lower_priority_unqueued_work_only() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.queues([research()])
    w.unit("queued", [{"gpu": 4}], queue="research", priority=-5, nodes=["n1"], start=1)
    w.unit("loose", [{"gpu": 4}], priority=0, nodes=["n1"], start=1)
    w.unit("urgent", [{"gpu": 4}], priority=100, created=5)
    plan = w.step(10_000)
    [rec] = plan.preemptions
    assert [v.unit.key for v in rec.victims] == ["default/loose-0"]
    assert rec.messages[0].endswith("its priority 0 is lower")


def test_preemption_can_be_turned_off() -> None:
    w = QueueWorld(QueueSettings(preemption=False))
    w.node("n1", gpu=8)
    w.unit("low", GPU8, priority=-1, nodes=["n1"], start=1)
    w.unit("urgent", GPU8, priority=10, created=5)
    plan = w.step(10_000)
    assert not plan.preemptions and plan.failed_units["default/urgent"] == "0/1 nodes fit: 1 insufficient nvidia.com/gpu."


def test_without_queues_the_messages_are_unchanged_when_nobody_may_be_preempted() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.unit("a", GPU8, nodes=["n1"], start=1)
    w.unit("b", GPU8, created=5)
    plan = w.step(10_000)
    assert plan.failed_units == {"default/b": "0/1 nodes fit: 1 insufficient nvidia.com/gpu."}


def test_protected_work_is_never_a_victim() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.node("n2", gpu=8)
    w.queues([research()])
    w.pdbs([pdb_object({"name": "keep", "selector": {"app": "keep"}})])
    w.unit("low", GPU8, queue="research", priority=-1, nodes=["n1"], start=1, labels={"app": "keep"})
    w.unit("low2", GPU8, queue="research", priority=-1, nodes=["n2"], start=1, labels={"app": "keep"})
    w.unit("u", [{"gpu": 2}], queue="research", priority=5, created=10)
    plan = w.step(10_000)
    assert not plan.preemptions and plan.searches == 0
    assert plan.failed_units["default/u"].startswith("queue research: needs 2 nvidia.com/gpu")


def test_a_failed_search_says_why_and_is_not_repeated_for_alike_units() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.unit("low", GPU8, priority=-1, nodes=["n1"], start=1)
    for i in range(5):
        w.unit(f"big{i}", [{"gpu": 12}], priority=5, created=10 + i)
    plan = w.step(10_000)
    assert not plan.preemptions and plan.searches == 1
    assert plan.failed_units["default/big3"] == (
        "0/1 nodes fit: 1 insufficient nvidia.com/gpu; preemption does not help: evicting any of the 1 unit(s) "
        "it may preempt does not make room: the quorum of 1 pod(s) does not fit on the nodes"
    )


def test_queue_status_counts() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.queues([research(), queue_object({"name": "org"}),
              queue_object({"name": "team", "parent": "org", "resources": {"nvidia.com/gpu": {"nominal": 4}}})])
    w.unit("r", GPU8, queue="research", nodes=["n1"], start=1)
    w.unit("p", GPU8, queue="research", created=3)
    w.unit("wrong", GPU8, queue="org", created=4)
    w.step(10_000)
    assert w.last_input is not None
    status = w.book.statuses(w.last_input.tree, lambda key: True)
    assert status["research"]["used"] == {"nvidia.com/gpu": "8"}
    assert (status["research"]["pending"], status["research"]["admitted"]) == (1, 1)
    assert status["org"]["conditions"][-1]["reason"] == "QueueNotLeaf"


def test_a_nomination_is_kept_while_its_unit_is_not_handed_in() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.unit("low", GPU8, priority=-1, nodes=["n1"], start=1)
    w.unit("urgent", GPU8, priority=10, created=5)
    w.step(10_000)
    assert list(w.nominations) == ["default/urgent"]
    w.unit("other", [{"gpu": 1}], priority=50, created=6)
    snap = w.state.snapshot()
    others = [u for u in w.units() if u.key != "default/urgent"]
    qi = w.book.prepare(state=w.state, groups=w.groups, snap=snap, units=others, now=10_001, nominations=w.live(10_001))
    plan = w.cycle.run(snap, others, queues=qi)
    # the held node stays held: "other" may not take it
    assert [n.unit for n in plan.nominations] == ["default/urgent"]
    assert not plan.bindings and "default/other" in plan.failed_units


def test_a_queue_named_where_no_queue_exists_is_reported() -> None:
    w = QueueWorld()
    w.node("n1", gpu=8)
    w.unit("lost", [{"gpu": 1}], queue="ghost")
    plan = w.step(10_000)
    assert not plan.bindings
    assert plan.failed_units == {"default/lost": "queue ghost does not exist (named by label batchsched.io/queue)"}
    assert plan.reasons == {"default/lost": "QueueNotFound"}
    assert [u.reason for u in plan.unschedulable] == ["QueueNotFound"]


def test_more_hands_out_the_run_of_alike_unqueued_units() -> None:
    from batchsched.core.queues import FairOrder, QueueName, QueueTree

    @dataclass(frozen=True)
    class Job:
        key: str
        priority: int
        created: float
        uid: str
        arrival: int = 0

    tree = QueueTree.from_objects([queue_object({"name": "q", "resources": {"nvidia.com/gpu": {"nominal": 8}}})],
                                  ("cpu", "memory", "pods", "nvidia.com/gpu"))
    loose = [Job(f"u{i}", 5 if i < 3 else 0, float(i), f"u{i}") for i in range(5)]
    queued = [Job("q0", 1, 0.0, "q0")]
    order = FairOrder(tree, {None: loose, QueueName("q"): queued}, now=0.0)
    seen = []
    for _q, job in order:
        more = order.more(lambda j: True)
        seen.append([job.key, *(j.key for j in more)])
        for j in [job, *more]:
            order.admitted(j)
    # the unqueued run stops where the queued head (priority 1) goes first
    assert seen == [["u0", "u1", "u2"], ["q0"], ["u3", "u4"]]
