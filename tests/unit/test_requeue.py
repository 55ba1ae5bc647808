"""Large backlogs: equivalence classes and event-driven requeue, on a fake clock.

What a user sees: every waiting pod is told why, the oldest of alike pods goes first when
room frees, a step with nothing new does nothing, and the outcome is the one a cycle that
tried every pod would reach.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchsched.core.cycle import Cycle
from batchsched.core.devices import ELASTIC_CORE, ELASTIC_MEMORY
from batchsched.core.equivalence import SingleIndex, pod_class
from batchsched.core.gangs import GroupBook
from batchsched.core.gangs.podgroup import SUSPEND_ANNOTATION
from batchsched.core.mirror import ClusterState
from batchsched.core.model import GPU, Node, NodeName, Pod, PodUID, parse_pod
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import single_unit
from batchsched.core.queues import QueueSettings
from batchsched.core.queues.running import RunningBook
from batchsched.core.queues.spec import QUEUE_STOPPED
from batchsched.core.queues.tree import QueueTree
from batchsched.core.reservation import (
    NEVER,
    RESERVED,
    RUNTIME_ANNOTATION,
    ReservationSettings,
    _Ends,
    _EndsCache,
    expected_end,
)
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_node, make_pod
from tests.unit.test_session import T0, Cluster, gpu_pod


def _full_cluster(pods: int = 300) -> tuple[Cluster, list[str], list[str]]:
    """Two 8-GPU nodes full of 1-GPU pods, and ``pods`` more 1-GPU pods waiting."""
    c = Cluster(Session())
    c.node("n0", 8)
    c.node("n1", 8)
    running = [c.pod(gpu_pod(f"run-{i}", 1)) for i in range(16)]
    assert len(c.step().binds) == 16
    waiting = []
    for i in range(pods):
        waiting.append(c.pod(make_pod(f"wait-{i:03d}").req(cpu="1", **{GPU: "1"}).created(T0 + i).obj()))
    return c, running, waiting


def test_every_waiting_pod_of_a_class_is_told_why_while_the_cycle_tries_one() -> None:
    c, _, waiting = _full_cluster()
    d = c.step(after=1.0)
    told = {x.ref.uid: x for x in d.unschedulable}
    assert set(told) == set(waiting)
    assert told[waiting[0]].message.startswith(
        "0/2 nodes fit: 2 insufficient nvidia.com/gpu; holds a reservation on node(s) n0")
    assert {told[uid].message for uid in waiting[1:]} == {"0/2 nodes fit: 2 insufficient nvidia.com/gpu."}
    # the oldest (it holds the reservation) and the next were tried, for 300 alike
    assert d.plan is not None and len(d.plan.tried) == 2


def test_a_step_with_nothing_new_does_nothing_and_tells_nobody_again() -> None:
    c, _, _ = _full_cluster()
    c.step(after=1.0)
    for _ in range(3):
        d = c.step(after=1.0)
        assert d.plan is None and d.unschedulable == [] and d.binds == []
    assert not c.session.wants_step


def test_room_freed_on_a_node_goes_to_the_oldest_of_the_class() -> None:
    c, running, waiting = _full_cluster()
    c.step(after=1.0)
    c.delete_pod(running[3])
    assert c.session.wants_step
    d = c.step(after=1.0)
    assert [b.uid for b in d.binds] == [waiting[0]]
    c.delete_pod(running[4])
    c.delete_pod(running[5])
    d = c.step(after=5.0)  # past the back-off the first wake started
    assert [b.uid for b in d.binds] == waiting[1:3]


def test_a_new_pod_of_a_sleeping_class_waits_with_it_and_is_told_why() -> None:
    c, _, _ = _full_cluster(20)
    c.step(after=1.0)
    late = c.pod(make_pod("late").req(cpu="1", **{GPU: "1"}).created(T0 + 100).obj())
    assert not c.session.wants_step
    d = c.step(after=1.0)
    assert d.plan is None
    assert [(x.ref.uid, x.message) for x in d.unschedulable] == [
        (late, "0/2 nodes fit: 2 insufficient nvidia.com/gpu.")
    ]


def test_a_pod_joining_a_class_whose_first_holds_a_reservation_is_told_it_waits_behind_it() -> None:
    c, _, _ = _full_cluster(0)
    first = c.pod(make_pod("first").req(cpu="1", **{GPU: "1"}).created(T0 + 1).obj())
    d = c.step(after=1.0)
    [(uid, message)] = [(x.ref.uid, x.message) for x in d.unschedulable]
    assert uid == first and "holds a reservation" in message
    later = c.pod(make_pod("later").req(cpu="1", **{GPU: "1"}).created(T0 + 2).obj())
    d = c.step(after=1.0)
    assert [(x.ref.uid, x.message) for x in d.unschedulable] == [
        (later, "same shape as pod default/first, which holds a reservation and goes first")]


def test_a_different_pod_is_tried_at_once_while_its_neighbours_sleep() -> None:
    c, _, _ = _full_cluster(20)
    c.step(after=1.0)
    small = c.pod(make_pod("cpu-only").req(cpu="1").created(T0 + 100).obj())
    assert c.session.wants_step
    d = c.step(after=1.0)
    assert [b.uid for b in d.binds] == [small]


def test_a_new_node_wakes_every_sleeper_and_the_retry_timer_tries_them_anyway() -> None:
    c, _, waiting = _full_cluster(20)
    c.step(after=1.0)
    c.node("n2", 2)
    assert c.session.wants_step
    d = c.step(after=1.0)
    assert [b.uid for b in d.binds] == waiting[:2]
    assert c.step(after=1.0).plan is None
    d = c.step(after=c.session.settings.retry_unschedulable)
    assert d.plan is not None and d.binds == []  # tried again on the timer, still no room


def test_woken_sleepers_wait_out_their_back_off() -> None:
    c, running, _ = _full_cluster(20)
    c.step(after=1.0)
    c.node("n2", 1)  # wakes the class, one pod fits
    c.step(after=0.1)
    big = c.pod(make_pod("big").req(cpu="1", **{GPU: "4"}).created(T0 + 200).obj())
    d = c.step(after=0.1)
    assert big in {x.ref.uid for x in d.unschedulable}
    c.delete_pod(running[0])  # one GPU frees: the 1-GPU class may fit, the 4-GPU pod not
    d = c.step(after=0.1)
    assert d.binds == []  # the 1-GPU class failed 0.2 s ago: its 1 s back-off is not over
    d = c.step(after=1.0)
    assert len(d.binds) == 1


def test_alike_gangs_are_tried_once_and_the_oldest_binds_when_room_frees() -> None:
    c = Cluster(Session())
    c.node("n0", 8)
    c.node("n1", 8)
    blocker = c.pod(gpu_pod("blocker", 8))
    assert [b.uid for b in c.step().binds] == [blocker]
    groups = [make_group(f"job-{i:02d}").min_member(2).created(T0 + i).build() for i in range(20)]
    c.session.on_groups_listed("scheduling.x-k8s.io", groups)
    members = {}
    for i in range(20):
        members[i] = [c.pod(make_pod(f"job-{i:02d}-{m}").req(cpu="1", **{GPU: "8"}).group(f"job-{i:02d}")
                            .created(T0 + i).obj()) for m in range(2)]
    d = c.step(after=1.0)
    assert d.binds == []
    assert d.plan is not None and len(d.plan.tried) <= 2
    statuses = {g.name: st for g, st in d.group_statuses}
    assert set(statuses) == {g.name for g in groups}
    assert statuses["job-00"].message.startswith(
        "gang needs 2 pods (2 cpu, 16 nvidia.com/gpu) placed together; only 1 fit now. Member job-00-")
    assert statuses["job-07"].message == "same shape as gang default/job-00, which holds a reservation and goes first"
    told = {x.ref.uid for x in d.unschedulable}
    assert told == {uid for ms in members.values() for uid in ms}
    c.delete_pod(blocker)
    d = c.step(after=1.0)
    assert sorted(b.uid for b in d.binds) == sorted(members[0])


def test_class_index_follows_pods_coming_and_going() -> None:
    index = SingleIndex()
    a = make_pod("a").req(cpu="1").created(T0 + 2).build()
    b = make_pod("b").req(cpu="1").created(T0 + 1).build()
    other = make_pod("c").req(cpu="2").build()
    for p in (a, b, other):
        index.put(p.uid, p)
    assert index.class_of(a.uid) == index.class_of(b.uid) != index.class_of(other.uid)
    assert [p.name for p in index.classes[pod_class(a)]] == ["b", "a"]  # oldest first
    moved = replace(a, requests={**a.requests, "cpu": 2000})
    index.put(a.uid, moved)
    assert index.class_of(a.uid) == index.class_of(other.uid)
    index.put(b.uid, None)
    assert len(index) == 2 and pod_class(b) not in index.classes


def test_pods_differing_only_in_what_placement_ignores_share_a_class() -> None:
    a = make_pod("a").req(cpu="1").label(**{"batch.kubernetes.io/job-completion-index": "0"}).build()
    b = make_pod("b").req(cpu="1").label(**{"batch.kubernetes.io/job-completion-index": "1"}).build()
    assert pod_class(a) == pod_class(b)
    assert pod_class(a) != pod_class(make_pod("c").req(cpu="1").annotate(**{RUNTIME_ANNOTATION: "1h"}).build())
    assert pod_class(a) != pod_class(make_pod("d").req(cpu="1").selector(zone="a").build())
    assert pod_class(a) != pod_class(make_pod("e").req(cpu="1").priority(5).build())


# -- the class cut and the in-cycle skip change nothing the cycle decides -------------------

SHAPES = [{"cpu": 1000, GPU: 1}, {"cpu": 1000, GPU: 2}, {"cpu": 4000}, {"cpu": 1000, GPU: 8}]


@settings(max_examples=40, deadline=None)
@given(
    nodes=st.lists(st.integers(0, 8), min_size=1, max_size=5),
    pods=st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from((0, 5))), min_size=1, max_size=40),
)
def test_a_step_binds_what_a_cycle_trying_every_pod_binds(nodes: list[int], pods: list[tuple[int, int]]) -> None:
    session = Session(SessionSettings())
    state = ClusterState()
    for i, gpus in enumerate(nodes):
        node = Node(name=NodeName(f"n{i}"), uid=f"n{i}", allocatable={"cpu": 8000, "pods": 110, GPU: gpus})
        session.on_node("ADDED", node)
        state.node_event("ADDED", node)
    for k, (shape, priority) in enumerate(pods):
        pod = Pod(uid=PodUID(f"p{k}"), namespace="default", name=f"p{k:02d}", priority=priority,
                  created=T0 + k, requests=dict(SHAPES[shape]))
        session.on_pod("ADDED", pod)
        state.pod_event("ADDED", pod)
    got = session.step(T0 + 100)
    units = [single_unit(p) for p in state.pending.values()]
    every = Cycle(ScoringConfig()).run(state.snapshot(), units, classes=lambda u: u.key)
    assert sorted((b.uid, b.node) for b in got.binds) == sorted((b.uid, b.node) for b in every.bindings)
    told = {x.ref.uid: x.message for x in got.unschedulable}
    assert told == {u.pod.uid: u.message for u in every.unschedulable}


@settings(max_examples=40, deadline=None)
@given(
    nodes=st.lists(st.integers(0, 8), min_size=1, max_size=5),
    pods=st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from((0, 5)), st.sampled_from(("", "qa", "qb"))),
                  min_size=1, max_size=40),
    gang=st.integers(0, 4),
    queues=st.booleans(),
    reserve=st.booleans(),
)
@example(nodes=[8], pods=[(3, 5, ""), (0, 0, "")], gang=1, queues=False, reserve=True)
def test_a_first_cycle_that_stops_at_its_first_placement_binds_in_its_steps_what_one_walk_binds(
    nodes: list[int], pods: list[tuple[int, int, str]], gang: int, queues: bool, reserve: bool,
) -> None:
    """A start's first cycle stops at the first unit placed (``first_walk_budget`` 0): its
    Bindings are one unit's (a gang whole, or one run of alike pods), and the steps that
    follow at once bind, all told, what one walk over every pod binds, with queues sharing a
    cohort or without (a pod naming a queue that does not exist waits), with reservations
    or without. A unit that waits reserves alike in both: against the pods placed earlier
    in its own walk as against those bound by an earlier step (running, no declared end).
    The example: the gang's pod placed first, the 8-GPU pod reserves the node behind it, so
    the last pod may not take a GPU (a walk that saw the gang's pod as never ending bound it)."""
    policy = ReservationSettings(enabled=reserve)
    quick = Session(SessionSettings(first_walk_budget=0.0, reservation=policy))
    whole = Session(SessionSettings(walk_budget=None, reservation=policy))
    members = [parse_pod(make_pod(f"g{m}").uid(f"g{m}").group("g").priority(9).req(cpu="1", **{GPU: "1"}).obj())
               for m in range(gang)]
    singles = [Pod(uid=PodUID(f"p{k}"), namespace="default", name=f"p{k:02d}", priority=priority,
                   created=T0 + k, requests=dict(SHAPES[shape]), labels={"batchsched.io/queue": q} if q else {})
               for k, (shape, priority, q) in enumerate(pods)]
    for session in (quick, whole):
        if queues:  # two queues of 4 GPUs each, in one cohort: each may borrow what the other leaves
            session.on_queues_listed([{"metadata": {"name": "c", "uid": "q-c", "resourceVersion": "1"}, "spec": {}}] + [
                {"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"},
                 "spec": {"parent": "c", "resources": [{"name": GPU, "nominal": "4"}]}} for name in ("qa", "qb")
            ])
        for i, gpus in enumerate(nodes):
            session.on_node("ADDED", Node(name=NodeName(f"n{i}"), uid=f"n{i}",
                                          allocatable={"cpu": 8000, "pods": 110, GPU: gpus}))
        if gang:
            session.on_podgroup("ADDED", make_group("g").min_member(gang).build())
        for pod in members + singles:
            session.on_pod("ADDED", pod)
    steps = [quick.step(T0 + 100)]
    while steps[-1].again and len(steps) < 50:
        steps.append(quick.step(T0 + 100 + 0.01 * len(steps)))
    first = {b.uid for b in steps[0].binds}
    # the single pods here ask for no constraint: alike, one run (of at most SINGLES_RUN)
    assert not first or first <= {p.uid for p in members} or first <= {p.uid for p in singles}, \
        "the first step binds one unit, or one run of alike pods"
    got = sorted((b.uid, b.node) for s in steps for b in s.binds)
    assert got == sorted((b.uid, b.node) for b in whole.step(T0 + 100).binds)


def _queues_c_qa_qb_qs(session: Session) -> None:
    """qa and qb (4 GPUs nominal each) share a cohort; qs (8) is stopped (``Hold``)."""
    session.on_queues_listed([
        {"metadata": {"name": "c", "uid": "q-c", "resourceVersion": "1"}, "spec": {}},
        {"metadata": {"name": "qa", "uid": "q-qa", "resourceVersion": "1"},
         "spec": {"parent": "c", "resources": [{"name": GPU, "nominal": "4"}]}},
        {"metadata": {"name": "qb", "uid": "q-qb", "resourceVersion": "1"},
         "spec": {"parent": "c", "resources": [{"name": GPU, "nominal": "4"}]}},
        {"metadata": {"name": "qs", "uid": "q-qs", "resourceVersion": "1"},
         "spec": {"stopPolicy": "Hold", "resources": [{"name": GPU, "nominal": "8"}]}},
    ])


def _nodes_running(session: Session, nodes: list[int], running: list[tuple[int, int, int, str]]) -> None:
    """Nodes of ``nodes`` GPUs; each running pod ``(node, gpus, priority, queue)`` that fits."""
    for i, gpus in enumerate(nodes):
        session.on_node("ADDED", Node(name=NodeName(f"n{i}"), uid=f"n{i}", allocatable={"cpu": 8000, "pods": 110, GPU: gpus}))
    free = list(nodes)
    for k, (node, gpus, priority, q) in enumerate(running):
        if node >= len(nodes) or free[node] < gpus:
            continue
        free[node] -= gpus
        session.on_pod("ADDED", Pod(uid=PodUID(f"r{k}"), namespace="default", name=f"r{k:02d}", priority=priority,
                                    created=T0 - 100, requests={"cpu": 1000, GPU: gpus}, node_name=f"n{node}",
                                    phase="Running", started=T0 - 90, labels={"batchsched.io/queue": q} if q else {}))


@settings(max_examples=60, deadline=None)
@given(
    cards=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    gangs=st.lists(st.tuples(st.integers(1, 3), st.sampled_from((30, 50, 100)), st.sampled_from((0, 5))),
                   min_size=1, max_size=8),
    pods=st.lists(st.tuples(st.sampled_from((10, 50, 100)), st.sampled_from((0, 5))), max_size=6),
    heads=st.integers(1, 2),
    reserve=st.booleans(),
)
def test_a_first_cycle_handed_the_heads_puts_gpu_shares_on_the_cards_one_walk_does(
    cards: list[int], gangs: list[tuple[int, int, int]], pods: list[tuple[int, int]], heads: int, reserve: bool,
) -> None:
    """Gangs whose members ask shares of GPU cards (elastic cores, 100 a card), more of them
    than the first cycle is handed (one or two), beside single pods asking shares: the steps
    after a start bind each pod to the node and the cards one walk over everything does."""
    policy = ReservationSettings(enabled=reserve)
    quick = Session(SessionSettings(first_walk_budget=0.0, first_walk_heads=heads, reservation=policy))
    whole = Session(SessionSettings(walk_budget=None, reservation=policy))
    for session in (quick, whole):
        for i, n in enumerate(cards):
            session.on_node("ADDED", make_node(f"n{i}").cap({"cpu": "64", "memory": "256Gi", ELASTIC_CORE: str(100 * n),
                                                              ELASTIC_MEMORY: str(16384 * n)}).build())
        for j, (size, core, priority) in enumerate(gangs):
            session.on_podgroup("ADDED", make_group(f"g{j}").min_member(size).created(T0 + j).build())
            for m in range(size):
                session.on_pod("ADDED", parse_pod(make_pod(f"g{j}-{m}").uid(f"g{j}-{m}").group(f"g{j}")
                                                  .priority(priority).created(T0 + j)
                                                  .req({"cpu": f"{1000 + j}m", ELASTIC_CORE: str(core)}).obj()))
        for k, (core, priority) in enumerate(pods):
            # each pod a class of its own (see the tests above)
            session.on_pod("ADDED", make_pod(f"p{k:02d}").uid(f"p{k}").priority(priority).created(T0 + 20 + k)
                           .req({"cpu": f"{2000 + k}m", ELASTIC_CORE: str(core)}).build())
    steps = [quick.step(T0 + 100)]
    while steps[-1].again and len(steps) < 60:
        steps.append(quick.step(T0 + 100))
    ones = [whole.step(T0 + 100) for _ in range(2)]
    steps += [quick.step(T0 + 100)]
    got = sorted((b.uid, b.node, b.cards) for s in steps for b in s.binds)
    assert got == sorted((b.uid, b.node, b.cards) for s in ones for b in s.binds)
    assert all(b.cards for s in ones for b in s.binds)  # each placed on cards, not on the node alone


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    running=st.lists(st.tuples(st.integers(0, 3), st.sampled_from((1, 2, 4)), st.sampled_from((0, 5)),
                               st.sampled_from(("", "qa", "qb", "qs"))), max_size=10),
    pods=st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from((0, 5, 9)),
                            st.sampled_from(("", "qa", "qb", "qs"))), min_size=1, max_size=30),
    gang=st.integers(0, 3),
)
# the pod bound before the stop, the cheapest victim after it (spared, as in one walk)
@example(nodes=[1, 1], running=[(0, 1, 0, "qa")], pods=[(0, 0, "")], gang=1)
@example(nodes=[1, 1], running=[(0, 1, 0, "qa")], pods=[(0, 0, ""), (2, 0, "qa")], gang=2)
# a nomination made before the stop, tried again after it on room one walk gave the gang
@example(nodes=[8, 2], running=[(0, 2, 0, "qa"), (0, 2, 0, "qa"), (0, 4, 0, "qb")],
         pods=[(0, 0, "qb"), (0, 5, "qb")], gang=2)
# a reservation made before the stop, made again after it with more room counted as freed
@example(nodes=[2], running=[(0, 1, 0, "qb")], pods=[(2, 0, ""), (2, 5, "qb")], gang=2)
# two nominations of one walk, tried again in the order the walk made them
@example(nodes=[4, 2, 4], running=[(0, 4, 0, "qb"), (1, 1, 0, "qb"), (1, 1, 0, "qb")],
         pods=[(0, 0, ""), (0, 0, "qa")], gang=3)
# a holder of a reservation carried over is still known as one in the cycles after
@example(nodes=[3, 1, 1], running=[(0, 2, 0, "qa"), (1, 1, 0, "qb")], pods=[(0, 0, ""), (1, 5, "")], gang=2)
def test_a_first_cycle_cut_short_preempts_and_holds_queues_as_one_walk_does(
    nodes: list[int], running: list[tuple[int, int, int, str]], pods: list[tuple[int, int, str]], gang: int,
) -> None:
    """The first cycle stopped at its first placement, where it meets the other policies:
    running pods (some of them lower priorities a waiting pod may preempt, some of them
    borrowing from the other queue of the cohort, which may reclaim them), a queue that is
    stopped (``Hold``: what waits there is told, what runs goes on), a gang, and
    reservations. The steps that follow at once bind and evict, all told, what one walk over
    every pod does (no budget anywhere: the searches are bounded alike in both). The walks
    that take up a stopped one spare what it placed from their victim searches and hold
    the nominations and reservations it made, as the one walk would (the cycles after try
    the nominees in the order the walk made them)."""
    no_budget = QueueSettings(max_search_seconds=math.inf)
    quick = Session(SessionSettings(first_walk_budget=0.0, queues=no_budget))
    whole = Session(SessionSettings(walk_budget=None, queues=no_budget))
    members = [parse_pod(make_pod(f"g{m}").uid(f"g{m}").group("g").priority(9).label({"batchsched.io/queue": "qa"}).req(cpu="1", **{GPU: "1"})
                         .created(T0).obj()) for m in range(gang)]
    for session in (quick, whole):
        _queues_c_qa_qb_qs(session)
        _nodes_running(session, nodes, running)
        if gang:
            session.on_podgroup("ADDED", make_group("g").min_member(gang).build())
        for pod in members:
            session.on_pod("ADDED", pod)
        for k, (shape, priority, q) in enumerate(pods):
            # each pod a class of its own (a millicore more than the one before): a class is
            # handed over cut to what fits now, and after a stop less fits than before it
            asks = {**SHAPES[shape], "cpu": SHAPES[shape]["cpu"] + k}
            session.on_pod("ADDED", Pod(uid=PodUID(f"p{k}"), namespace="default", name=f"p{k:02d}", priority=priority,
                                        created=T0 + k, requests=asks, labels={"batchsched.io/queue": q} if q else {}))
    steps = [quick.step(T0 + 100)]
    while steps[-1].again and len(steps) < 60:
        steps.append(quick.step(T0 + 100 + 0.01 * len(steps)))
    # as many steps of the other, at the same times, and two more of each (a preemptor
    # placed on what its victims free is bound in a step after the one that chose them)
    ones = [whole.step(T0 + 100 + 0.01 * k) for k in range(len(steps) + 2)]
    steps += [quick.step(T0 + 100 + 0.01 * k) for k in range(len(steps), len(steps) + 2)]
    assert sorted((b.uid, b.node) for s in steps for b in s.binds) == sorted((b.uid, b.node) for s in ones for b in s.binds)
    assert sorted(e.uid for s in steps for e in s.evictions) == sorted(e.uid for s in ones for e in s.evictions)
    # the stopped queue's pods wait in both
    held = {f"p{k}" for k, (_, _, q) in enumerate(pods) if q == "qs"}
    assert not held & {b.uid for s in steps for b in s.binds}



@settings(max_examples=60, deadline=None)
@given(
    cards=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    pods=st.lists(st.tuples(st.sampled_from((10, 30, 50, 100, 200)), st.sampled_from((0, 5))), min_size=1,
                  max_size=25),
    gang=st.integers(0, 3),
    reserve=st.booleans(),
)
def test_a_first_cycle_cut_short_puts_gpu_shares_on_the_cards_one_walk_does(
    cards: list[int], pods: list[tuple[int, int]], gang: int, reserve: bool,
) -> None:
    """Shares of GPU cards (elastic GPU cores, 100 a card) on nodes of one to four cards:
    the first cycle stopped at its first placement, and the steps after it, bind each pod
    to the node and the cards one walk over every pod does; a gang of 50-core members too,
    with reservations or without."""
    policy = ReservationSettings(enabled=reserve)
    quick = Session(SessionSettings(first_walk_budget=0.0, reservation=policy))
    whole = Session(SessionSettings(walk_budget=None, reservation=policy))
    members = [parse_pod(make_pod(f"g{m}").uid(f"g{m}").group("g").priority(9)
                         .req({"cpu": "1", ELASTIC_CORE: "50"}).created(T0).obj()) for m in range(gang)]
    for session in (quick, whole):
        for i, n in enumerate(cards):
            session.on_node("ADDED", make_node(f"n{i}").cap({"cpu": "64", "memory": "256Gi", ELASTIC_CORE: str(100 * n),
                                                              ELASTIC_MEMORY: str(16384 * n)}).build())
        if gang:
            session.on_podgroup("ADDED", make_group("g").min_member(gang).build())
        for pod in members:
            session.on_pod("ADDED", pod)
        for k, (core, priority) in enumerate(pods):
            # each pod a class of its own (see the test above)
            session.on_pod("ADDED", make_pod(f"p{k:02d}").uid(f"p{k}").priority(priority).created(T0 + k)
                           .req({"cpu": f"{1000 + k}m", ELASTIC_CORE: str(core)}).build())
    steps = [quick.step(T0 + 100)]
    while steps[-1].again and len(steps) < 60:
        steps.append(quick.step(T0 + 100 + 0.01 * len(steps)))
    one = whole.step(T0 + 100)
    got = sorted((b.uid, b.node, b.cards) for s in steps for b in s.binds)
    assert got == sorted((b.uid, b.node, b.cards) for b in one.binds)
    assert all(b.cards for b in one.binds)  # each placed on cards, not on the node alone

@settings(max_examples=150, deadline=None)
@given(
    nodes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    running=st.lists(st.tuples(st.integers(0, 3), st.sampled_from((1, 2, 4)), st.sampled_from((0, 5)),
                               st.sampled_from(("", "qa", "qb"))), max_size=8),
    gangs=st.lists(st.tuples(st.integers(1, 3), st.sampled_from((1, 2, 4)), st.sampled_from((0, 5, 9)),
                             st.sampled_from(("", "qa", "qb", "qs")), st.integers(0, 90), st.booleans()),
                   min_size=1, max_size=12),
    pods=st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from((0, 5, 9)),
                            st.sampled_from(("", "qa", "qb")), st.integers(1, 2)), max_size=6),
    heads=st.integers(1, 3),
    aging=st.booleans(),
    reserve=st.booleans(),
)
# qa's third gang (not built in the first step) fits where qb's would go (qa's share the lower)
@example(nodes=[2], running=[(0, 1, 0, "qb")], gangs=[(2, 2, 0, "qa", 0, False), (2, 2, 0, "qa", 1, False),
                                                      (1, 1, 0, "qa", 10, False), (1, 1, 0, "qb", 5, False)],
         pods=[], heads=2, aging=False, reserve=False)
# a class of qa cut at its first member, which reclaims a GPU of qb; its second takes the
# free one (handed over, or with the walk stopped at the cut, at the next step)
@example(nodes=[4, 5], running=[(0, 4, 0, "qb"), (1, 4, 0, "qb")],
         gangs=[(1, 1, 0, "", 0, True), (1, 1, 0, "", 0, True), (1, 1, 0, "", 0, True), (1, 2, 0, "", 0, False)],
         pods=[(0, 0, "qa", 2)], heads=1, aging=False, reserve=False)
def test_a_first_cycle_handed_the_heads_of_its_queues_binds_and_evicts_what_one_walk_does(
    nodes: list[int], running: list[tuple[int, int, int, str]], gangs: list[tuple[int, int, int, str, int, bool]],
    pods: list[tuple[int, int, str, int]], heads: int, aging: bool, reserve: bool,
) -> None:
    """A start's first cycle is handed, of each queue's gangs, only the first ``heads`` in
    the queue's order (priority, age; with aging on, those waiting past ``maxWait`` first),
    of each class of alike single pods its first ``heads`` members, and stops before a
    queue's next unit would come after the last one handed over. Where it meets the other
    policies (gangs of several queues and unqueued ones, priorities, gangs short of
    members, a stopped queue, classes of single pods, running pods a gang may preempt or
    reclaim, reservations): the steps that follow at once bind and evict, all told, what
    one walk over every unit does."""
    no_budget = QueueSettings(max_search_seconds=math.inf, max_wait=50.0 if aging else 0.0)
    policy = ReservationSettings(enabled=reserve)
    quick = Session(SessionSettings(first_walk_budget=0.0, first_walk_heads=heads, queues=no_budget, reservation=policy))
    whole = Session(SessionSettings(walk_budget=None, queues=no_budget, reservation=policy))
    for session in (quick, whole):
        _queues_c_qa_qb_qs(session)
        _nodes_running(session, nodes, running)
        for j, (size, gpus, priority, q, age, short) in enumerate(gangs):
            session.on_podgroup("ADDED", make_group(f"g{j}").min_member(size).created(T0 + age).build())
            for m in range(size - 1 if short else size):  # short: a member still to come
                pod = make_pod(f"g{j}-{m}").uid(f"g{j}-{m}").group(f"g{j}").priority(priority).created(T0 + age)
                session.on_pod("ADDED", parse_pod(pod.label({"batchsched.io/queue": q} if q else {})
                                                  .req(cpu="1", **{GPU: str(gpus)}).obj()))
        for k, (shape, priority, q, alike) in enumerate(pods):
            # each entry a class of its own, of two members at most: a class of more is also
            # cut to what fits when it is handed over, and after a stop less fits than before
            asks = {**SHAPES[shape], "cpu": SHAPES[shape]["cpu"] + k}
            for c in range(alike):
                session.on_pod("ADDED", Pod(uid=PodUID(f"p{k}-{c}"), namespace="default", name=f"p{k:02d}-{c}",
                                            priority=priority, created=T0 + 30 + k + 7 * c, requests=dict(asks),
                                            labels={"batchsched.io/queue": q} if q else {}))
    # the steps that run at once share their time (a pod bound a moment later than its
    # twin of the one walk would be a cheaper victim of the next search); after the steps
    # that stand for the one walk, as many more of each (a preemptor is placed on what its
    # victims free in a later step)
    steps = [quick.step(T0 + 100)]
    while steps[-1].again and len(steps) < 60:
        steps.append(quick.step(T0 + 100))
    ones = [whole.step(T0 + 100) for _ in range(4)]
    steps += [quick.step(T0 + 100) for _ in range(3)]
    assert sorted((b.uid, b.node) for s in steps for b in s.binds) == sorted((b.uid, b.node) for s in ones for b in s.binds)
    assert sorted(e.uid for s in steps for e in s.evictions) == sorted(e.uid for s in ones for e in s.evictions)


def _gang_of(session: Session, name: str, *, members: int, gpus: int, queue: str, created: float) -> None:
    session.on_podgroup("ADDED", make_group(name).min_member(members).created(created).build())
    for m in range(members):
        session.on_pod("ADDED", parse_pod(make_pod(f"{name}-{m}").uid(f"{name}-{m}").group(name).created(created)
                                          .label({"batchsched.io/queue": queue}).req(cpu="1", **{GPU: str(gpus)}).obj()))


def test_a_first_step_handed_only_its_queues_heads_stops_where_the_first_left_out_gang_would_go() -> None:
    """One node of 2 GPUs, one of them taken by a pod of queue qb; queue qa waits with five
    gangs of two 2-GPU members (they do not fit), then a gang of one 1-GPU member; qb with a
    gang of one 1-GPU member, older than it. With the first walk handed two gangs of each
    queue, qa's sixth gang is not built in the first step; qa's share is the lower, so its
    gangs go before qb's, and the sixth takes the free GPU. The first step stops once qa's two heads failed, though qb's
    gang could be placed (it binds nothing); the next, at once, builds every gang and binds
    qa's sixth, and qb's gang waits, told why; so does every member of qa's five. (No
    reservations: qa's first would hold the room.)"""
    s = Session(SessionSettings(first_walk_budget=0.0, first_walk_heads=2,
                                reservation=ReservationSettings(enabled=False)))
    _queues_c_qa_qb_qs(s)
    s.on_node("ADDED", Node(name=NodeName("n0"), uid="n0", allocatable={"cpu": 8000, "pods": 110, GPU: 2}))
    s.on_pod("ADDED", Pod(uid=PodUID("busy"), namespace="default", name="busy", created=T0 - 100,
                          requests={"cpu": 1000, GPU: 1}, node_name="n0", phase="Running", started=T0 - 90,
                          labels={"batchsched.io/queue": "qb"}))
    for j in range(5):
        _gang_of(s, f"big{j}", members=2, gpus=2, queue="qa", created=T0 + j)
    _gang_of(s, "late", members=1, gpus=1, queue="qa", created=T0 + 10)
    _gang_of(s, "other", members=1, gpus=1, queue="qb", created=T0 + 5)
    first = s.step(T0 + 100)
    assert not first.binds and first.again
    second = s.step(T0 + 100.01)
    assert [b.uid for b in second.binds] == ["late-0"]
    later = s.step(T0 + 102)
    assert not later.binds
    assert s.last_word("x-k8s:default/other") is not None
    assert all(s.last_word(f"x-k8s:default/big{j}") is not None for j in range(5))


def test_what_a_stopped_walk_spared_is_spared_by_the_cycle_that_takes_it_up_soon_not_later() -> None:
    """Two 1-GPU nodes; queue qa runs r0 (priority 0, 90 s in); waiting: a gang of one
    1-GPU pod of qa (priority 9) and an unqueued 1-GPU pod p0. The first cycle, stopped at
    its first placement, binds p0 (the unqueued turn comes first) and the gang goes next.
    Taken up at once, the cycle evicts r0 for the gang, as one walk would (p0 was placed
    in it); taken up only 15 s later, p0 is running work like any other, and the cheapest
    victim (the least work lost)."""
    def world() -> Session:
        s = Session(SessionSettings(first_walk_budget=0.0))
        s.on_queues_listed([{"metadata": {"name": "qa", "uid": "q-qa", "resourceVersion": "1"},
                             "spec": {"resources": [{"name": GPU, "nominal": "2"}]}}])
        for i in range(2):
            s.on_node("ADDED", Node(name=NodeName(f"n{i}"), uid=f"n{i}", allocatable={"cpu": 8000, "pods": 110, GPU: 1}))
        s.on_pod("ADDED", Pod(uid=PodUID("r0"), namespace="default", name="r0", created=T0 - 100,
                              requests={"cpu": 1000, GPU: 1}, node_name="n0", phase="Running", started=T0 - 90,
                              labels={"batchsched.io/queue": "qa"}))
        s.on_podgroup("ADDED", make_group("g").min_member(1).build())
        s.on_pod("ADDED", parse_pod(make_pod("g0").uid("g0").group("g").priority(9).label({"batchsched.io/queue": "qa"})
                                    .req(cpu="1", **{GPU: "1"}).created(T0).obj()))
        s.on_pod("ADDED", Pod(uid=PodUID("p0"), namespace="default", name="p0", created=T0 + 1,
                              requests={"cpu": 1000, GPU: 1}))
        return s

    for later, victim in ((0.01, "r0"), (15.0, "p0")):
        s = world()
        first = s.step(T0 + 100)
        assert [b.uid for b in first.binds] == ["p0"] and first.again and not first.evictions
        taken_up = s.step(T0 + 100 + later)
        assert [e.uid for e in taken_up.evictions] == [victim], (later, taken_up.evictions)


def _stopped_over_gang(*, reserve: bool) -> tuple[Cluster, Session, dict[str, str]]:
    """Queue qa on an 8-GPU node n0 and a 1-GPU node n1; r0 (qa) runs 8 GPUs on n0 at
    priority 0, or (``reserve``) 4 GPUs at priority 100 for a declared hour. Waiting in qa:
    a gang of one 8-GPU pod (priority 9), p0 of 1 GPU (priority 5), p1 of 1 GPU (priority
    0). The first cycle, stopped at its first placement, has the gang preempt r0 (or hold a
    reservation on n0 behind it), binds p0 on n1 and stops before p1. Returns the cluster,
    its session and the pods' uids by name."""
    s = Session(SessionSettings(first_walk_budget=0.0))
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 1)
    s.on_queues_listed([_queue("qa")])
    running = (make_pod("r0").req(cpu="1", **{GPU: "4" if reserve else "8"}).priority(100 if reserve else 0)
               .label({"batchsched.io/queue": "qa"}).created(T0 - 3600).running("n0"))
    if reserve:
        running = running.annotate(**{RUNTIME_ANNOTATION: "2h"})
    uids = {"r0": c.pod(running.obj())}
    s.on_podgroup("ADDED", make_group("g").min_member(1).build())
    uids["g0"] = gang = c.pod(make_pod("g0").group("g").priority(9).label({"batchsched.io/queue": "qa"})
                 .req(cpu="1", **{GPU: "8"}).created(T0).obj())
    for name, priority in (("p0", 5), ("p1", 0)):
        uids[name] = c.pod(make_pod(name).priority(priority).label({"batchsched.io/queue": "qa"})
              .req(cpu="1", **{GPU: "1"}).created(T0).obj())
    first = c.step()
    assert [b.uid for b in first.binds] == [uids["p0"]] and first.again
    told = {u.ref.uid: u.reason for u in first.unschedulable}
    if reserve:
        assert told.get(gang) == RESERVED and not first.evictions, told
    else:
        assert [e.uid for e in first.evictions] == [uids["r0"]], first.evictions
    assert uids["p1"] not in told  # not tried: the walk stopped before it
    return c, s, uids


def _queue(name: str, stop: str = "") -> dict[str, object]:
    spec: dict[str, object] = {"resources": [{"name": GPU, "nominal": "16"}]}
    if stop:
        spec["stopPolicy"] = stop
    return {"metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"}, "spec": spec}


@pytest.mark.parametrize("reserve", [False, True], ids=["nominated", "reserving"])
def test_a_gang_the_stopped_walk_settled_that_is_suspended_before_the_walk_is_taken_up_is_told_so(
        reserve: bool) -> None:
    """What the stopped walk settled for a gang (its nomination, or its reservation) is
    held as made only while the gang may still be placed: suspended in between, it goes its
    turn in the cycle that takes the walk up (a reservation is not held for it, so p1 takes
    room beside r0), and its pods are told it is suspended once it has been held back for
    the report delay (1 s) counted from that cycle, not from a cycle later."""
    c, s, uids = _stopped_over_gang(reserve=reserve)
    s.on_podgroup("MODIFIED", make_group("g").min_member(1).annotate(**{SUSPEND_ANNOTATION: "true"}).build())
    taken_up = c.step(after=0.01)
    assert [b.uid for b in taken_up.binds] == ([uids["p1"]] if reserve else [])
    later = c.step(after=1.0)
    told = {u.ref.uid: u.reason for u in later.unschedulable}
    assert told.get(uids["g0"]) == "Suspended", told


@pytest.mark.parametrize("stop", ["Hold", "HoldAndDrain"])
def test_a_reservation_the_stopped_walk_made_is_not_held_again_once_its_queue_is_stopped(stop: str) -> None:
    """Queue qa stopped between the stop and the cycle that takes the walk up: the gang
    holding a reservation from the stopped walk is told its queue is stopped, as the other
    pods of the queue are, and nothing is placed; drained, what the queue runs (r0, and p0
    bound by the stopped walk) is evicted at the next check of the holds, still with
    nothing placed."""
    c, s, uids = _stopped_over_gang(reserve=True)
    s.on_queue("MODIFIED", _queue("qa", stop=stop))
    taken_up = c.step(after=0.01)
    told = {u.ref.uid: u.reason for u in taken_up.unschedulable}
    assert told.get(uids["g0"]) == told.get(uids["p1"]) == QUEUE_STOPPED, told
    later = [c.step(after=1.0) for _ in range(2)]
    assert not [b for d in (taken_up, *later) for b in d.binds]
    evicted = sorted(e.uid for d in (taken_up, *later) for e in d.evictions)
    assert evicted == (sorted([uids["p0"], uids["r0"]]) if stop == "HoldAndDrain" else [])


def test_a_gang_backing_off_behind_its_reservation_is_told_soon_that_its_podgroup_is_suspended() -> None:
    """A gang holding a reservation backs off like a failed one; its PodGroup suspended
    wakes it (what decides its placement changed): its pods are told it is suspended once
    the report delay (1 s) has passed, not when its back-off runs out a minute later."""
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    s.on_queues_listed([_queue("qa")])
    c.pod(make_pod("r0").req(cpu="1", **{GPU: "4"}).priority(100).label({"batchsched.io/queue": "qa"})
          .created(T0 - 3600).running("n0").annotate(**{RUNTIME_ANNOTATION: "2h"}).obj())
    s.on_podgroup("ADDED", make_group("g").min_member(1).build())
    g0 = c.pod(make_pod("g0").group("g").priority(9).label({"batchsched.io/queue": "qa"})
               .req(cpu="1", **{GPU: "8"}).created(T0).obj())
    assert [u.reason for u in c.step().unschedulable if u.ref.uid == g0] == [RESERVED]
    s.on_podgroup("MODIFIED", make_group("g").min_member(1).annotate(**{SUSPEND_ANNOTATION: "true"}).build())
    told = [u.reason for _ in range(3) for u in c.step(after=0.6).unschedulable if u.ref.uid == g0]
    assert told == ["Suspended"]

# -- kept books equal rebuilt ones -----------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("add", "bind", "end", "delete")), st.integers(0, 11)), max_size=60))
def test_running_units_kept_as_pods_change_equal_units_built_anew(ops: list[tuple[str, int]]) -> None:
    state = ClusterState()
    groups = GroupBook()
    for i in range(3):
        state.node_event("ADDED", Node(name=NodeName(f"n{i}"), allocatable={"cpu": 64000, "pods": 110, GPU: 8}))
    groups.group_event("ADDED", make_group("g").min_member(2).build())
    kept = RunningBook()

    def get(book: RunningBook) -> list[object]:
        snap = state.snapshot()
        return book.get(state=state, groups=groups, snap=snap, tree=QueueTree((), snap.columns), now=T0,
                        basis=(1,), queue_of=lambda pods, group, tree: None, protecting=lambda pods: "")

    rng = random.Random(len(ops))
    for op, k in ops:
        b = make_pod(f"p{k}").uid(f"u{k}").req(cpu="1", **{GPU: str(1 + k % 2)})
        if k % 3 == 0:
            b = b.group("g")
        if op == "add":
            pod = parse_pod(b.obj())
        elif op == "bind":
            pod = parse_pod(b.running(f"n{rng.randrange(3)}").obj())
        elif op == "end":
            pod = parse_pod(b.running("n0").phase("Succeeded").obj())
        else:
            pod = parse_pod(b.obj())
            state.pod_event("DELETED", pod)
            groups.pod_event("DELETED", pod)
            assert get(kept) == get(RunningBook())
            continue
        state.pod_event("MODIFIED", pod)
        groups.pod_event("MODIFIED", pod)
        assert get(kept) == get(RunningBook())
    assert {q: list(v) for q, v in kept.usage.items()} == {q: list(v) for q, v in RunningBook().usage.items()}


def test_expected_ends_kept_across_cycles_are_each_pods_expected_end() -> None:
    state = ClusterState()
    state.node_event("ADDED", make_node("n0").cap(cpu="64", memory="64Gi").build())
    pods = [
        make_pod("a").req(cpu="1").running("n0").annotate(**{RUNTIME_ANNOTATION: "10m"}).obj(),
        make_pod("b").req(cpu="1").running("n0").obj(),
        make_pod("c").req(cpu="1").running("n0").deleting(T0).obj(),
        make_pod("d").req(cpu="1").node("n0").annotate(**{RUNTIME_ANNOTATION: "90s"}).obj(),
    ]
    for p in pods:
        state.pod_event("ADDED", parse_pod(p))
    cache = _EndsCache()

    def check() -> None:
        snap = state.snapshot()
        charged = cache.get(state, snap, {"n0": 0})
        for now in (T0, T0 + 100, T0 + 10_000):
            ends = charged.at(now, 1)
            want = sorted(expected_end(state.pods[uid], now) for uid in state.charges)
            assert sorted(ends.ends) == want
            assert ends.until(NEVER)[0].tolist() == ends.reqs[ends.ends < NEVER].sum(axis=0).tolist()

    check()
    # kept as pods come, go and change: the same as read afresh
    state.pod_event("DELETED", parse_pod(pods[1]))
    state.pod_event("ADDED", parse_pod(make_pod("e").req(cpu="2").running("n0")
                                       .annotate(**{RUNTIME_ANNOTATION: "1h"}).obj()))
    state.pod_event("MODIFIED", parse_pod(make_pod("a").req(cpu="1").running("n0").deleting(T0).obj()))
    check()
    assert len(cache.get(state, state.snapshot(), {"n0": 0}).rows) == 4


def test_a_pod_whose_binding_is_refused_waits_out_a_back_off_and_takes_no_room_meanwhile() -> None:
    c = Cluster(Session())
    c.node("n0", 8)
    doomed = c.pod(make_pod("doomed").req(cpu="1", **{GPU: "1"}).obj())
    d = c.session.step(T0 + 1)
    [b] = d.binds
    assert b.uid == doomed
    # the apiserver refuses the binding (its namespace is being deleted)
    c.session.on_bind_result(b, "failed", now=T0 + 1)
    d = c.session.step(T0 + 1.1)
    assert d.binds == []  # not bound again at once
    gang = [c.pod(make_pod(f"big-{i}").req(cpu="1", **{GPU: "4"}).group("big").obj()) for i in range(2)]
    c.session.on_groups_listed("scheduling.x-k8s.io", [make_group("big").min_member(2).build()])
    d = c.session.step(T0 + 1.2)
    assert sorted(x.uid for x in d.binds) == sorted(gang)  # all 8 GPUs were free for it
    d = c.session.step(T0 + 3.0)
    assert d.binds == []  # the back-off passed: tried again, no room left


def test_a_status_write_on_a_waiting_gang_member_does_not_wake_its_gang() -> None:
    c = Cluster(Session())
    c.node("n0", 8)
    blocker = c.pod(gpu_pod("blocker", 8))
    assert [b.uid for b in c.step().binds] == [blocker]
    c.session.on_groups_listed("scheduling.x-k8s.io", [make_group("job").min_member(2).build()])
    members = [c.pod(make_pod(f"job-{m}").req(cpu="1", **{GPU: "8"}).group("job").obj()) for m in range(2)]
    assert c.step(after=1.0).binds == []
    cycles = c.session.cycles
    # what the watch shows after the scheduler wrote the PodScheduled condition
    obj = c.pods[members[0]]
    obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    obj["metadata"]["resourceVersion"] = "99"
    c._modified(members[0])
    assert not c.session.wants_step
    c.step(after=1.0)
    assert c.session.cycles == cycles
    # a change to what placement reads does wake it
    obj["spec"]["containers"][0]["resources"]["requests"][GPU] = "4"
    c._modified(members[0])
    assert c.session.wants_step


@settings(max_examples=60, deadline=None)
@given(
    pods=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.sampled_from([0.0, 5.0, 10.0, 10.0, 30.0, NEVER])),
                  max_size=30),
    times=st.lists(st.sampled_from([-1.0, 0.0, 5.0, 7.0, 10.0, 29.0, 30.0, 1e9, NEVER]), min_size=1, max_size=12),
)
def test_what_ends_by_a_time_summed_from_the_nearest_time_is_the_direct_sum(
    pods: list[tuple[int, int, float]], times: list[float],
) -> None:
    """Each time's per-node sum, got from the nearest one summed before (adding or taking
    away the pods between), in any order of asking, equals the sum of the pods that end by
    then; ``NEVER`` sums every pod with an end, and the endless ones are the rest."""
    rows = np.array([p[0] for p in pods], dtype=np.intp)
    reqs = np.array([[p[1], 1000 * p[1]] for p in pods], dtype=np.int64).reshape(len(pods), 2)
    ends_at = np.array([p[2] for p in pods], dtype=np.float64)
    ends = _Ends(rows, reqs, ends_at, 4)

    def direct(which: list[bool]) -> list[list[int]]:
        out = [[0, 0] for _ in range(4)]
        for (row, req, _), w in zip(pods, which, strict=True):
            if w:
                out[row][0] += req
                out[row][1] += 1000 * req
        return out

    for t in times:
        want = direct([end < NEVER if t >= NEVER else end <= t for _, _, end in pods])
        assert ends.until(t).tolist() == want
    assert ends.endless().tolist() == direct([end >= NEVER for _, _, end in pods])
