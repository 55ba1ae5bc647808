"""Preemption and reclaim: who may be evicted, whole gangs or their extras, the cheapest set,
and, by hypothesis over random workloads, the invariants: no ping-pong, reclaim never
leaves a victim queue below its nominal, no queue above its limits, no node over-committed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings, target
from hypothesis import strategies as st

from batchsched.core.placement import kernels, reference
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import RunningPod, RunningUnit, VictimKind
from batchsched.core.preemption import NoPreemption, Preemption, Preemptor, select_victims
from batchsched.core.preemption.victims import EXHAUSTIVE_PIECES
from batchsched.core.queues import QueueName, QueueTree

COLUMNS = ("cpu", "memory", "pods", "nvidia.com/gpu")
GPU = "nvidia.com/gpu"
SCORING = ScoringConfig().arrays(COLUMNS)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = 10_000.0
IntArray = np.ndarray  # type: ignore[type-arg]


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    kernels.warm_up()


def vec(gpu: int = 0, cpu: int = 1000) -> IntArray:
    return np.array([cpu, 0, 1, gpu], dtype=np.int64)


def queue_obj(name: str, parent: str | None = None, *, within: str = "LowerPriority",
              reclaim: str = "Any", **gpu: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"preemption": {"withinQueue": within, "reclaimWithinCohort": reclaim}}
    if parent:
        spec["parent"] = parent
    if gpu:
        spec["resources"] = [{"name": GPU, **gpu}]
    return {"metadata": {"name": name}, "spec": spec}


@dataclass
class World:
    """Nodes, queues and running units, kept consistent (``used`` and the tree charged)."""

    gpus_per_node: Sequence[int]
    tree: QueueTree
    running: list[RunningUnit] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.gpus_per_node)
        self.alloc = np.array([[64_000, 2**40, 110, g] for g in self.gpus_per_node], dtype=np.int64)
        self.used = np.zeros((n, len(COLUMNS)), dtype=np.int64)

    def run(self, key: str, queue: str | None, nodes: Sequence[int], *, gpus: int | Sequence[int] = 1,
            priority: int = 0, created: float = 0.0, start: float = 0.0, extras: int = 0) -> RunningUnit:
        """A running unit with one pod per entry of ``nodes``; the last ``extras`` are elastic."""
        per_pod = [gpus] * len(nodes) if isinstance(gpus, int) else list(gpus)
        pods = tuple(
            RunningPod(uid=f"{key}-{i}", node=n, req=vec(g), gpus=g, elastic=i >= len(nodes) - extras)
            for i, (n, g) in enumerate(zip(nodes, per_pod, strict=True))
        )
        unit = RunningUnit(key=key, queue=QueueName(queue) if queue else None, priority=priority,
                           created=created, uid=f"uid-{key}", start=start, pods=pods)
        self.charge(unit)
        self.running.append(unit)
        return unit

    def charge(self, unit: RunningUnit, sign: int = 1, pods: Sequence[RunningPod] | None = None) -> None:
        total = np.zeros(len(COLUMNS), dtype=np.int64)
        for pod in unit.pods if pods is None else pods:
            self.used[pod.node] += sign * pod.req
            total += pod.req
        if unit.queue is not None:
            (self.tree.admit if sign > 0 else self.tree.release)(unit.queue, total)

    def select(self, p: Preemptor, *, place: Any = kernels.place) -> Preemption | NoPreemption:
        return select_victims(p, self.running, alloc=self.alloc, used=self.used, tree=self.tree,
                              scoring=SCORING, now=NOW, place=place)


def preemptor(key: str, queue: str | None, gpus: Sequence[int], *, nodes: int, priority: int = 0,
              created: float = 100.0, min_count: int | None = None) -> Preemptor:
    reqs = np.stack([vec(g) for g in gpus])
    return Preemptor(
        key=key, queue=QueueName(queue) if queue else None, priority=priority, created=created,
        uid=f"uid-{key}", reqs=reqs, sig=np.zeros(len(gpus), dtype=np.int64),
        masks=np.ones((1, nodes), dtype=np.bool_), static_score=np.zeros((1, nodes), dtype=np.int64),
        min_count=len(gpus) if min_count is None else min_count,
    )


def victims(result: Preemption | NoPreemption) -> list[tuple[str, int]]:
    assert isinstance(result, Preemption), result
    return [(v.unit.key, len(v.pods)) for v in result.victims]


def one_queue(within: str = "LowerPriority") -> QueueTree:
    return QueueTree.from_objects([queue_obj("q", within=within, nominal=100)], COLUMNS)


# -- within a queue -----------------------------------------------------------------------


@pytest.mark.parametrize("place", [kernels.place, reference.place], ids=["numba", "twin"])
def test_lower_priority_is_preempted_and_the_nodes_are_named(place: Any) -> None:
    w = World([8, 8], one_queue())
    w.run("low", "q", [0], gpus=8, priority=0)
    w.run("same", "q", [1], gpus=8, priority=5)
    result = w.select(preemptor("p", "q", [8], nodes=2, priority=5), place=place)
    assert victims(result) == [("low", 1)]
    assert isinstance(result, Preemption) and result.nodes == (0,)
    assert result.victims[0].kind is VictimKind.PRIORITY
    assert result.victims[0].message == "preempted by p in queue q (priority 5 > 0)"
    assert result.gpu_hours == pytest.approx(8 * NOW / 3600)


def test_lower_or_newer_equal_priority() -> None:
    w = World([8, 8], one_queue("LowerOrNewerEqualPriority"))
    w.run("older", "q", [0], gpus=8, priority=5, created=50.0)
    w.run("newer", "q", [1], gpus=8, priority=5, created=150.0)
    result = w.select(preemptor("p", "q", [8], nodes=2, priority=5, created=100.0))
    assert victims(result) == [("newer", 1)]
    assert isinstance(result, Preemption)
    assert result.victims[0].message == "preempted by p in queue q (same priority 5, older)"
    w2 = World([8], one_queue("LowerPriority"))
    w2.run("newer", "q", [0], gpus=8, priority=5, created=150.0)
    assert isinstance(w2.select(preemptor("p", "q", [8], nodes=1, priority=5)), NoPreemption)


def test_never_preempts_and_says_why() -> None:
    w = World([8], one_queue("Never"))
    w.run("low", "q", [0], gpus=8, priority=0)
    result = w.select(preemptor("p", "q", [8], nodes=1, priority=9))
    assert result == NoPreemption(
        "no running work may be preempted for it: queue q preempts Never within the queue and "
        "reclaims Any from borrowing queues of its cohort"
    )


def test_a_gang_is_evicted_whole() -> None:
    w = World([8, 8], one_queue())
    w.run("gang", "q", [0, 0, 1, 1], gpus=4, priority=0)
    result = w.select(preemptor("p", "q", [8], nodes=2, priority=5))
    assert victims(result) == [("gang", 4)]
    assert isinstance(result, Preemption) and result.pods == 4 and result.victims[0].whole


def test_elastic_extras_go_first_when_that_suffices() -> None:
    w = World([8, 8], one_queue())
    w.run("elastic", "q", [0, 0, 1, 1], gpus=4, priority=0, extras=2, start=NOW - 3600)
    w.run("cheap", "q", [1], gpus=0, priority=0, start=NOW)  # costs nothing but frees no GPU
    result = w.select(preemptor("p", "q", [8], nodes=2, priority=5))
    assert victims(result) == [("elastic", 2)]
    assert isinstance(result, Preemption)
    assert [p.uid for p in result.victims[0].pods] == ["elastic-2", "elastic-3"]
    assert not result.victims[0].whole and result.nodes == (1,)
    assert result.victims[0].message.endswith("; only its 2 elastic extra pod(s)")


def test_fewest_gpu_hours_then_fewest_pods() -> None:
    w = World([8, 8, 8], one_queue())
    w.run("long-running", "q", [0], gpus=8, start=0.0)
    w.run("just-started", "q", [1], gpus=8, start=NOW - 60)
    w.run("just-started-2-pods", "q", [2, 2], gpus=4, start=NOW - 60)
    assert victims(w.select(preemptor("p", "q", [8], nodes=3, priority=1))) == [("just-started", 1)]


def test_victims_that_are_not_needed_are_dropped() -> None:
    w = World([8, 8], one_queue())
    w.run("small", "q", [0], gpus=2, start=NOW - 10)  # cheapest, but alone frees too little
    w.run("kept", "q", [0], gpus=6, priority=9)
    w.run("big", "q", [1], gpus=8, start=NOW - 20)
    # greedy takes small, then big; big alone suffices, so small is dropped again
    assert victims(w.select(preemptor("p", "q", [8], nodes=2, priority=1))) == [("big", 1)]


def test_one_node_cheap_to_free_beats_many_pods_that_ran_long_elsewhere() -> None:
    # one 8-GPU pod started an hour ago (8 GPU-hours) against eight 1-GPU pods that ran
    # 7 hours each (56 GPU-hours): each of the eight is cheaper than the one alone
    w = World([8, 8], one_queue())
    w.run("fresh", "q", [0], gpus=8, start=NOW - 3600)
    for i in range(8):
        w.run(f"old-{i}", "q", [1], gpus=1, start=NOW - 7 * 3600)
    result = w.select(preemptor("p", "q", [8], nodes=2, priority=1))
    assert victims(result) == [("fresh", 1)]
    assert isinstance(result, Preemption) and result.nodes == (0,) and result.gpu_hours == pytest.approx(8.0)


def test_on_one_node_the_cheapest_set_is_not_the_cheapest_pieces_first() -> None:
    # 4 GPUs to free: cheapest first takes 1 GPU (1 h) then 3 GPUs (3.6 h): 4.6 GPU-hours;
    # the 4-GPU pod alone costs 3.8
    w = World([8], one_queue())
    w.run("four", "q", [0], gpus=4, start=NOW - 0.95 * 3600)
    w.run("one", "q", [0], gpus=1, start=NOW - 3600)
    w.run("three", "q", [0], gpus=3, start=NOW - 1.2 * 3600)
    assert victims(w.select(preemptor("p", "q", [4], nodes=1, priority=1))) == [("four", 1)]


def test_victims_on_nodes_it_cannot_use_are_not_taken() -> None:
    w = World([8, 8], one_queue())
    w.run("elsewhere", "q", [0], gpus=8, start=NOW)
    w.run("there", "q", [1], gpus=8, start=0.0)
    p = preemptor("p", "q", [8], nodes=2, priority=1)
    p = replace(p, masks=np.array([[False, True]]))
    assert victims(w.select(p)) == [("there", 1)]


def test_not_enough_victims_is_explained() -> None:
    w = World([8], one_queue())
    w.run("low", "q", [0], gpus=4)
    w.run("high", "q", [0], gpus=4, priority=9)
    result = w.select(preemptor("p", "q", [8], nodes=1, priority=5))
    assert result == NoPreemption(
        "evicting any of the 1 unit(s) it may preempt does not make room: "
        "the quorum of 1 pod(s) does not fit on the nodes"
    )


def test_quota_alone_can_call_for_preemption() -> None:
    tree = QueueTree.from_objects([queue_obj("q", nominal=8)], COLUMNS)
    w = World([16], tree)
    w.run("low", "q", [0], gpus=8)
    result = w.select(preemptor("p", "q", [4], nodes=1, priority=1))
    assert victims(result) == [("low", 1)]


# -- reclaim ----------------------------------------------------------------------------------


def two_teams(reclaim: str = "Any", b_nominal: int = 8) -> QueueTree:
    return QueueTree.from_objects(
        [queue_obj("org"), queue_obj("a", "org", reclaim=reclaim, nominal=8),
         queue_obj("b", "org", nominal=b_nominal), queue_obj("c", "org", nominal=0)],
        COLUMNS,
    )


def test_reclaim_restores_the_nominal_without_pushing_the_lender_below_its_own() -> None:
    w = World([8, 8], two_teams())
    # b uses 12 of its 8: it borrows 4 of a's, which now wants them back
    w.run("b-big", "b", [0], gpus=8, start=NOW - 10)  # cheapest, but b would drop to 4
    w.run("b-small", "b", [1], gpus=4, start=0.0)
    w.run("a-own", "a", [1], gpus=4)
    assert w.tree.admissible("a", vec(4)) is not None
    result = w.select(preemptor("p", "a", [4], nodes=2, priority=0))
    assert victims(result) == [("b-small", 1)]
    assert isinstance(result, Preemption)
    assert result.victims[0].kind is VictimKind.RECLAIM
    assert result.victims[0].message == "reclaimed by queue a for p: queue b was borrowing nvidia.com/gpu"


def test_reclaim_never_lets_the_preemptor_borrow() -> None:
    w = World([8, 8], two_teams())
    w.run("a-own", "a", [1], gpus=6)
    w.run("b-borrowing", "b", [0], gpus=8)  # b 8 of 8: not borrowing
    w.run("c-borrowing", "c", [1], gpus=2)  # c 2 of 0: borrowing
    result = w.select(preemptor("p", "a", [4], nodes=2))
    assert isinstance(result, NoPreemption)
    assert "reclaim only restores a queue's nominal" in result.reason


def test_reclaim_policy_lower_priority_and_never() -> None:
    for policy, expect in (("Any", [("c-high", 1)]), ("LowerPriority", None), ("Never", None)):
        w = World([8], two_teams(reclaim=policy))
        w.run("c-high", "c", [0], gpus=8, priority=9)
        result = w.select(preemptor("p", "a", [8], nodes=1, priority=1))
        if expect is None:
            assert isinstance(result, NoPreemption), policy
        else:
            assert victims(result) == expect


def test_reclaim_only_from_queues_that_borrow() -> None:
    w = World([8, 8], two_teams())
    w.run("b-own", "b", [0], gpus=8)  # b within its nominal
    result = w.select(preemptor("p", "a", [8], nodes=2, priority=9))
    # the only GPUs are b's own: nothing to reclaim (a is short of nodes, not of quota)
    w2 = World([8], two_teams())
    w2.run("b-own", "b", [0], gpus=8)
    assert isinstance(w2.select(preemptor("p", "a", [8], nodes=1, priority=9)), NoPreemption)
    assert isinstance(result, Preemption) and result.victims == ()  # node 1 was free


def test_unqueued_work_yields_to_higher_priority_but_never_evicts_queued_work() -> None:
    w = World([8], two_teams())
    w.run("loose", None, [0], gpus=8, priority=0)
    assert victims(w.select(preemptor("p", "a", [8], nodes=1, priority=1))) == [("loose", 1)]
    w2 = World([8], two_teams())
    w2.run("queued", "b", [0], gpus=8, priority=0)
    assert isinstance(w2.select(preemptor("u", None, [8], nodes=1, priority=9)), NoPreemption)


def test_invalid_preemptor_queue() -> None:
    w = World([8], two_teams())
    assert w.select(preemptor("p", "org", [8], nodes=1)) == NoPreemption("queue org is not a valid leaf queue")


# -- properties -------------------------------------------------------------------------------


def start_unit(draw: st.DrawFn, world: World, key: str, queue: str | None, gpus: list[int]) -> None:
    """Admit and place a running unit the way the cycle would, or leave it out."""
    extras = draw(st.integers(0, len(gpus) - 1))
    core = len(gpus) - extras
    reqs = np.stack([vec(g) for g in gpus])
    if queue is not None and world.tree.admissible_prefix(queue, reqs, core) < len(gpus):
        return
    n = len(world.gpus_per_node)
    out = np.full(len(gpus), -1, dtype=np.int64)
    placed = kernels.place_members(
        world.alloc, world.used.copy(), reqs, np.zeros(len(gpus), dtype=np.int64),
        np.ones((1, n), dtype=np.bool_), np.zeros((1, n), dtype=np.int64),
        SCORING.weights, SCORING.scalar, SCORING.shape_u, SCORING.shape_s, SCORING.strategy, len(gpus), out,
        SCORING.device,
    )
    if placed < len(gpus):
        return
    world.run(key, queue, [int(x) for x in out], gpus=gpus, priority=draw(st.integers(0, 3)),
              created=float(draw(st.integers(0, 50))), start=float(draw(st.integers(0, int(NOW)))),
              extras=extras)


POLICIES_WITHIN = st.sampled_from(["Never", "LowerPriority", "LowerOrNewerEqualPriority"])
POLICIES_RECLAIM = st.sampled_from(["Never", "LowerPriority", "Any", "Any"])
#: mostly above the running work's 0-3, so that most examples have someone to evict
PREEMPTOR_PRIORITY = st.sampled_from([0, 2, 3, 4, 4, 4])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[World, Preemptor]:
    """A full-ish cluster: three teams under one cohort, unqueued work, and a preemptor;
    running work is admitted and placed by the same rules the cycle uses."""
    objs = [queue_obj("org")]
    for name in ("a", "b", "c"):
        gpu: dict[str, int] = {"nominal": draw(st.integers(0, 8))}
        if draw(st.booleans()):
            gpu["borrowingLimit"] = draw(st.integers(0, 8))
        if draw(st.booleans()):
            gpu["lendingLimit"] = draw(st.integers(0, gpu["nominal"]))
        objs.append(queue_obj(name, "org", within=draw(POLICIES_WITHIN), reclaim=draw(POLICIES_RECLAIM), **gpu))
    world = World(draw(st.lists(st.sampled_from([4, 8]), min_size=1, max_size=3)), QueueTree.from_objects(objs, COLUMNS))
    queues = st.sampled_from(["a", "b", "b", "c", "c", None])
    for i in range(draw(st.integers(4, 16))):
        start_unit(draw, world, f"r{i}", draw(queues), draw(st.lists(st.integers(0, 4), min_size=1, max_size=4)))
    p = preemptor("p", draw(st.sampled_from(["a", "a", "a", "b", "c", None])),
                  draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)),
                  nodes=len(world.gpus_per_node), priority=draw(PREEMPTOR_PRIORITY),
                  created=float(draw(st.integers(0, 50))))
    return world, p


@st.composite
def reclaim_worlds(draw: st.DrawFn) -> tuple[World, Preemptor]:
    """Quotas that add up to the cluster; b and c borrow what a lends; a wants some back."""
    nodes = draw(st.lists(st.just(8), min_size=2, max_size=3))
    capacity = sum(nodes)
    na = draw(st.integers(2, capacity))
    nb = draw(st.integers(0, capacity - na))
    objs = [queue_obj("org")]
    for name, nominal in (("a", na), ("b", nb), ("c", capacity - na - nb)):
        gpu = {"nominal": nominal}
        if name != "a" and draw(st.booleans()):
            gpu["borrowingLimit"] = draw(st.integers(0, capacity))
        if name == "a" and draw(st.booleans()):
            gpu["lendingLimit"] = draw(st.integers(0, nominal))
        objs.append(queue_obj(name, "org", within=draw(POLICIES_WITHIN), reclaim=draw(POLICIES_RECLAIM), **gpu))
    world = World(nodes, QueueTree.from_objects(objs, COLUMNS))
    for i in range(draw(st.integers(6, 14))):
        start_unit(draw, world, f"r{i}", draw(st.sampled_from(["b", "c"])),
                   draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    for i in range(draw(st.integers(0, 2))):
        start_unit(draw, world, f"a{i}", "a", draw(st.lists(st.integers(1, 2), min_size=1, max_size=2)))
    room = max(1, na - int(world.tree.usage_vector("a")[3]))
    gpus = draw(st.lists(st.integers(1, min(4, room)), min_size=1, max_size=2))
    p = preemptor("p", "a", gpus, nodes=len(nodes), priority=draw(PREEMPTOR_PRIORITY),
                  created=float(draw(st.integers(0, 50))))
    return world, p


def as_preemptor(unit: RunningUnit, pods: Sequence[RunningPod], nodes: int) -> Preemptor:
    core = [pod for pod in pods if not pod.elastic] or list(pods)
    ordered = core + [pod for pod in pods if pod not in core]
    return Preemptor(
        key=unit.key, queue=unit.queue, priority=unit.priority, created=unit.created, uid=unit.uid,
        reqs=np.stack([pod.req for pod in ordered]), sig=np.zeros(len(ordered), dtype=np.int64),
        masks=np.ones((1, nodes), dtype=np.bool_), static_score=np.zeros((1, nodes), dtype=np.int64),
        min_count=len(core),
    )


#: the least share of a property run's examples in which victims are evicted: the
#: invariants below say nothing about the others, so a strategy that rarely preempts
#: tests little (it was 13% once, 21-25% with the strategies before they were steered; about
#: 55% now, 39% at the least seen in 20 runs, so 0.3 holds by a margin and still fails the old)
PREEMPTING_SHARE = 0.3


def run_invariants(strategy: st.SearchStrategy[tuple[World, Preemptor]]) -> None:
    """Check the invariants on every example of ``strategy``; then that enough of them
    evicted someone (a hypothesis run is one call of ``examples``)."""
    counts = {"examples": 0, "preempting": 0}

    @PROPERTY
    @given(case=strategy)
    def examples(case: tuple[World, Preemptor]) -> None:
        counts["examples"] += 1
        evicted = check_invariants(*case)
        counts["preempting"] += evicted
        target(float(evicted), label="evicts someone")

    examples()
    assert counts["preempting"] >= PREEMPTING_SHARE * counts["examples"], counts


def test_preemption_invariants() -> None:
    run_invariants(worlds())


def test_reclaim_invariants() -> None:
    run_invariants(reclaim_worlds())


def check_invariants(world: World, p: Preemptor) -> bool:
    """Carry out the preemption, then check the limits, reclaim's floor and no ping-pong.
    True when victims were evicted (so that the checks had something to check)."""
    result = world.select(p)
    if isinstance(result, NoPreemption):
        event("no preemption")
        return False
    kinds = sorted({v.kind.value for v in result.victims} | {"extras" for v in result.victims if not v.whole})
    event(f"victims: {'+'.join(kinds) or 'none needed'}")
    tree = world.tree
    before = {q: (tree.usage_vector(q), tree.nominal_vector(q)) for q in ("a", "b", "c")}
    # carry it out: victims gone, the quorum placed where it was promised and charged
    remaining = list(world.running)
    for v in result.victims:
        world.charge(v.unit, -1, v.pods)
        remaining.remove(v.unit)
        if not v.whole:
            remaining.append(replace(v.unit, pods=tuple(pod for pod in v.unit.pods if pod not in v.pods)))
    core = p.reqs[: p.min_count]
    if p.queue is not None:
        assert tree.admissible(p.queue, core.sum(axis=0)) is None
    p_pods = tuple(
        RunningPod(uid=f"p-{m}", node=n, req=core[m], gpus=int(core[m][3])) for m, n in enumerate(result.nodes)
    )
    p_unit = RunningUnit(key=p.key, queue=p.queue, priority=p.priority, created=p.created, uid=p.uid,
                         start=NOW, pods=p_pods)
    world.charge(p_unit)
    remaining.append(p_unit)
    world.running = remaining
    tree.check()  # no queue above nominal + borrowing, no root above its nominal
    assert np.all(world.used <= world.alloc)  # no node over-committed

    # reclaim never leaves a victim queue below its nominal where it was borrowing
    for v in result.victims:
        if v.kind is VictimKind.RECLAIM:
            assert v.unit.queue is not None
            used_before, nominal = before[v.unit.queue]
            borrowing = used_before > nominal
            assert np.all(~borrowing | (tree.usage_vector(v.unit.queue) >= nominal)), v.unit.queue

    # no ping-pong: no victim, preempting in this state, evicts its preemptor
    for v in result.victims:
        back = world.select(as_preemptor(v.unit, v.pods, len(world.gpus_per_node)))
        if isinstance(back, Preemption):
            assert p.key not in {x.unit.key for x in back.victims}, (v.unit.key, back)
    return bool(result.victims)


# -- the cheapest set, against a brute-force twin -------------------------------------------


def pieces_of(unit: RunningUnit) -> list[tuple[RunningPod, ...]]:
    """What may be evicted of ``unit``: all of it, or its elastic extras alone."""
    extras = tuple(pod for pod in unit.pods if pod.elastic)
    return [unit.pods, extras] if extras and len(extras) < len(unit.pods) else [unit.pods]


def brute_force(world: World, p: Preemptor) -> tuple[float, int] | None:
    """The cheapest valid set (GPU-hours, pods), by trying every set of what ``p`` may evict
    (a world of one queue whose quota never binds: only priority decides who may be
    evicted, only the nodes whether the quorum fits); sets of extras alone first."""
    allowed = [w for w in world.running
               if w.priority < p.priority and (w.queue is None or w.queue == p.queue)]
    core = np.ascontiguousarray(p.reqs[: p.min_count])
    best: dict[bool, tuple[float, int]] = {}
    for combo in itertools.product(*([None, *pieces_of(w)] for w in allowed)):
        chosen = [(w, pods) for w, pods in zip(allowed, combo, strict=True) if pods is not None]
        if not chosen:
            continue
        scratch = world.used.copy()
        for _, pods in chosen:
            for pod in pods:
                scratch[pod.node] -= pod.req
        out = np.full(p.min_count, -1, dtype=np.int64)
        placed = kernels.place_members(
            world.alloc, scratch, core, np.ascontiguousarray(p.sig[: p.min_count]), p.masks, p.static_score,
            SCORING.weights, SCORING.scalar, SCORING.shape_u, SCORING.shape_s, SCORING.strategy, p.min_count,
            out, SCORING.device,
        )
        if placed < p.min_count:
            continue
        hours = round(math.fsum(sum(pod.gpus for pod in pods) * (NOW - w.start) / 3600 for w, pods in chosen), 9)
        cost = (hours, sum(len(pods) for _, pods in chosen))
        extras_only = all(len(pods) < len(w.pods) for w, pods in chosen)
        for key in {extras_only, False}:
            if key not in best or cost < best[key]:
                best[key] = cost
    return best.get(True) or best.get(False)


@st.composite
def priority_worlds(draw: st.DrawFn) -> tuple[World, Preemptor]:
    """Two or three full-ish nodes, work of one queue (whose quota never binds) and
    unqueued work with various ages, and a preemptor of a higher priority than some."""
    tree = QueueTree.from_objects([queue_obj("q", nominal=100)], COLUMNS)
    world = World(draw(st.lists(st.sampled_from([4, 8, 8]), min_size=2, max_size=3)), tree)
    small = draw(st.sampled_from([2, 4]))  # many small pods (many candidates) or fewer larger
    for i in range(draw(st.integers(4, 16))):
        start_unit(draw, world, f"r{i}", draw(st.sampled_from(["q", "q", None])),
                   draw(st.lists(st.integers(1, small), min_size=1, max_size=3)))
    members = draw(st.lists(st.integers(2, 4), min_size=1, max_size=3))
    p = preemptor("p", draw(st.sampled_from(["q", "q", None])), members, nodes=len(world.gpus_per_node),
                  priority=draw(st.sampled_from([2, 4, 4])))
    return world, p


def seven_small_and_one_two_gpu_pod() -> tuple[World, Preemptor]:
    """Full nodes of 4, 4 and 8 GPUs, all work started together: on the 8-GPU node six
    1-GPU pods and one 2-GPU pod. A 2-GPU pod costs as many GPU-hours as two 1-GPU pods,
    and one pod fewer."""
    w = World([4, 4, 8], one_queue())
    for i in range(3):
        w.run(f"r{i}", "q", [0])
    w.run("r3", "q", [0, 1, 1], gpus=[1, 2, 2])
    for i in range(4, 10):
        w.run(f"r{i}", "q", [2])
    w.run("r10", "q", [2], gpus=2)
    return w, preemptor("p", "q", [2], nodes=3, priority=2)


def more_room_places_less() -> tuple[World, Preemptor]:
    """A gang of 2+4+4 GPUs that may evict r0 (1 GPU on node 1), r1 (2 GPUs on each of
    nodes 1 and 0) and r4 (1 GPU on node 0). Evicting all three frees 4, 3 and 6 GPUs and
    its 2-GPU member, placed first, takes room a 4-GPU member needed; without r0 (4, 2
    and 6 free) it lands on node 1 and the quorum fits."""
    w = World([8, 4, 8], one_queue())
    w.run("r0", "q", [1])
    w.run("r1", "q", [1, 0], gpus=2)
    w.run("r2", "q", [1], priority=2)
    w.run("r3", "q", [0, 0, 0], gpus=[1, 1, 2], priority=2)
    w.run("r4", "q", [0])
    w.run("r5", "q", [2], gpus=2, priority=2)
    return w, preemptor("p", "q", [2, 4, 4], nodes=3, priority=2)


def test_one_pod_of_two_gpus_is_evicted_rather_than_two_of_one() -> None:
    world, p = seven_small_and_one_two_gpu_pod()
    assert victims(world.select(p)) == [("r10", 1)]


def test_a_gang_is_placed_when_evicting_everything_would_not_place_it() -> None:
    world, p = more_room_places_less()
    result = world.select(p)
    assert sorted(victims(result)) == [("r1", 2), ("r4", 1)]
    assert isinstance(result, Preemption) and sorted(result.nodes) == [0, 1, 2]


@settings(PROPERTY, max_examples=200)
@given(case=priority_worlds())
@example(case=seven_small_and_one_two_gpu_pod())
@example(case=more_room_places_less())
def test_the_search_finds_the_cheapest_set(case: tuple[World, Preemptor]) -> None:
    """Exact for a single pod and for few candidates; for a gang among many, a valid set
    whenever there is one."""
    world, p = case
    result = world.select(p)
    twin = brute_force(world, p)
    if twin is None:
        assert isinstance(result, NoPreemption) or not result.victims
        return
    assert isinstance(result, Preemption)
    if not result.victims:
        return  # it fits as it is
    event("preemption")
    allowed = [w for w in world.running if w.priority < p.priority and (w.queue is None or w.queue == p.queue)]
    pieces = sum(len(pieces_of(w)) for w in allowed)
    exact = p.min_count == 1 or pieces <= EXHAUSTIVE_PIECES
    event("exact" if exact else "gang among many")
    event("few candidates" if pieces <= EXHAUSTIVE_PIECES else "many candidates")
    got = (round(math.fsum(v.gpu_hours for v in result.victims), 9), sum(len(v.pods) for v in result.victims))
    if exact:
        assert got == twin, (got, twin, [(v.unit.key, len(v.pods)) for v in result.victims])
