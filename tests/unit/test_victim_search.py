"""The victim search gives the answer of its plain twin (:mod:`batchsched.core.preemption.reference`):
the same victims, nodes and reason, on random worlds of every kind the preemption tests
draw, on crowded ones (many candidates, quotas that rule reclaim out, room that no set
frees: the bounds and the fallback at work), and along a cycle's searches that share one
:class:`~batchsched.core.preemption.victims.PieceCache` while earlier victims go.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batchsched.core.placement import kernels
from batchsched.core.plan import RunningUnit
from batchsched.core.preemption import (
    NoPreemption,
    Preemption,
    Preemptor,
    reference,
    select_victims,
)
from batchsched.core.preemption.victims import EXHAUSTIVE_PIECES, Offers, PieceCache
from batchsched.core.queues import QueueTree
from batchsched.core.queues.running import RunningBook
from tests.unit.test_preemption import (
    COLUMNS,
    NOW,
    POLICIES_RECLAIM,
    POLICIES_WITHIN,
    SCORING,
    World,
    preemptor,
    priority_worlds,
    queue_obj,
    reclaim_worlds,
    start_unit,
    worlds,
)

SAME = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    kernels.warm_up()


def answer(result: Preemption | NoPreemption) -> Any:
    """What a user of the search reads of its result, as plain values."""
    if isinstance(result, NoPreemption):
        return result.reason
    return (
        [(v.unit.key, [pod.uid for pod in v.pods], v.kind, v.gpu_hours, v.message, v.borrowed) for v in result.victims],
        result.nodes, result.gpu_hours, result.pods, None if result.placed is None else result.placed.tolist(),
    )


def twin(world: World, p: Preemptor, now: float = NOW) -> Preemption | NoPreemption:
    return reference.select_victims(p, world.running, alloc=world.alloc, used=world.used, tree=world.tree,
                                    scoring=SCORING, now=now)


def same_answer(world: World, p: Preemptor, cache: PieceCache | None = None,
                now: float = NOW) -> Preemption | NoPreemption:
    got = select_victims(p, world.running, alloc=world.alloc, used=world.used, tree=world.tree,
                         scoring=SCORING, now=now, cache=cache)
    want = twin(world, p, now)
    assert answer(got) == answer(want)
    return got


def outcome(result: Preemption | NoPreemption) -> str:
    return "preempts" if isinstance(result, Preemption) and result.victims else "no victims"


@SAME
@given(case=st.one_of(worlds(), reclaim_worlds(), priority_worlds()))
def test_the_same_answer_as_the_twin(case: tuple[World, Preemptor]) -> None:
    event(outcome(same_answer(*case)))


@st.composite
def crowded_worlds(draw: st.DrawFn) -> tuple[World, list[Preemptor]]:
    """Full nodes with many small units of three teams of one cohort and unqueued work
    (more candidates than are weighed exhaustively), teams that borrow or not, and a few
    preemptors, single pods and gangs, some of them asking more than any set frees."""
    nodes = draw(st.lists(st.sampled_from([4, 8]), min_size=2, max_size=4))
    capacity = sum(nodes)
    objs = [queue_obj("org")]
    left = capacity
    for name in ("a", "b", "c"):
        nominal = draw(st.integers(0, left))
        left -= nominal
        gpu = {"nominal": nominal}
        if draw(st.booleans()):
            gpu["borrowingLimit"] = draw(st.integers(0, capacity))
        objs.append(queue_obj(name, "org", within=draw(POLICIES_WITHIN), reclaim=draw(POLICIES_RECLAIM), **gpu))
    world = World(nodes, QueueTree.from_objects(objs, COLUMNS))
    queues = st.sampled_from(["a", "b", "b", "c", "c", None])
    for i in range(draw(st.integers(8, 24))):
        start_unit(draw, world, f"r{i}", draw(queues), draw(st.lists(st.integers(1, 2), min_size=1, max_size=3)))
    ps = [
        preemptor(f"p{k}", draw(st.sampled_from(["a", "a", "b", None])),
                  draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)), nodes=len(nodes),
                  priority=draw(st.sampled_from([2, 4, 4])), created=float(draw(st.integers(0, 50))))
        for k in range(draw(st.integers(1, 3)))
    ]
    return world, ps


def evict(world: World, result: Preemption, p: Preemptor) -> None:
    """Carry out ``result`` as the cycle does: the victims (or their evicted pods) leave
    the candidates, the quorum is charged where it was placed."""
    for v in result.victims:
        world.charge(v.unit, -1, v.pods)
        world.running.remove(v.unit)
        if not v.whole:
            world.running.append(replace(v.unit, pods=tuple(pod for pod in v.unit.pods if pod not in v.pods)))
    core = p.reqs[: p.min_count]
    for m, n in enumerate(result.nodes):
        world.used[n] += core[m]
    if p.queue is not None:
        world.tree.admit(p.queue, core.sum(axis=0))


@SAME
@given(case=crowded_worlds())
def test_a_cycle_of_searches_sharing_pieces_gives_the_twins_answers(case: tuple[World, list[Preemptor]]) -> None:
    """One cache across the searches, as a cycle keeps it, while earlier victims go."""
    world, ps = case
    book = RunningBook()  # keeps what the units running from the start hold
    for w in world.running:
        book.units[w.key] = w
    cache = PieceCache(book)
    for p in ps:
        pieces = sum(len(w.pods) > 0 for w in world.running)
        event("many candidates" if pieces > EXHAUSTIVE_PIECES else "few candidates")
        result = same_answer(world, p, cache)
        event(outcome(result))
        if isinstance(result, Preemption) and result.victims:
            evict(world, result, p)


@SAME
@given(case=crowded_worlds(), hours=st.lists(st.sampled_from([0.0, 0.5, 3.0, 50.0]), min_size=2, max_size=4))
def test_cycles_of_searches_keeping_what_units_offer_give_the_twins_answers(
    case: tuple[World, list[Preemptor]], hours: list[float],
) -> None:
    """What each unit offers kept across cycles (:class:`Offers`), as the scheduler keeps
    it: each cycle later (the GPU-hours done, so the order of cost, move on), with its own
    cache, the same preemptors asking again, earlier victims gone."""
    world, ps = case
    book = RunningBook()
    for w in world.running:
        book.units[w.key] = w
    offers = Offers()
    for n, h in enumerate(hours):
        cache = PieceCache(book, offers)
        for p in ps:
            result = same_answer(world, replace(p, key=f"{p.key}-{n}", uid=f"{p.uid}-{n}"), cache,
                                 now=NOW + h * 3600 + n)
            event(outcome(result))
            if isinstance(result, Preemption) and result.victims:
                evict(world, result, p)


def test_the_cache_gives_a_new_unit_its_own_pieces() -> None:
    """A unit left with fewer pods after its extras went is weighed as it is now."""
    world = World([8], QueueTree.from_objects([queue_obj("q", nominal=100)], COLUMNS))
    unit = world.run("r0", "q", [0, 0, 0, 0], gpus=2, extras=2)
    cache = PieceCache()
    p = preemptor("p", "q", [4], nodes=1, priority=2)
    first = same_answer(world, p, cache)
    assert isinstance(first, Preemption) and [len(v.pods) for v in first.victims] == [2]
    evict(world, first, p)
    rest = world.running[-1]
    assert isinstance(rest, RunningUnit) and rest is not unit and len(rest.pods) == 2
    second = same_answer(world, preemptor("p2", "q", [4], nodes=1, priority=2), cache)
    assert isinstance(second, Preemption) and [len(v.pods) for v in second.victims] == [2]


@st.composite
def borrowers_near_nominal(draw: st.DrawFn) -> tuple[World, Preemptor]:
    """Queues of one cohort that borrow a little: many one-pod units of ``b`` and ``c``,
    each queue's nominal a few GPUs below its use, and a preemptor of ``a`` (within its
    nominal) asking more than they borrow: evicting every candidate takes a victim queue
    below its nominal, and the search drops pieces until no queue is (or none places)."""
    nodes = draw(st.lists(st.sampled_from([4, 8]), min_size=2, max_size=4))
    used = {"b": draw(st.integers(5, 12)), "c": draw(st.integers(0, 8))}
    over = {q: draw(st.integers(0, 3)) for q in used}
    objs = [queue_obj("org"), queue_obj("a", "org", nominal=sum(nodes))]
    objs += [queue_obj(q, "org", nominal=max(0, used[q] - over[q])) for q in used]
    world = World(nodes, QueueTree.from_objects(objs, COLUMNS))
    k = 0
    for q, count in used.items():
        for _ in range(count):
            start_unit(draw, world, f"r{k}", q, [1])
            k += 1
    p = preemptor("p", "a", draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)), nodes=len(nodes),
                  priority=draw(st.sampled_from([2, 4])))
    return world, p


@SAME
@given(case=borrowers_near_nominal())
def test_reclaim_from_queues_just_above_their_nominal_gives_the_twins_answer(case: tuple[World, Preemptor]) -> None:
    event(outcome(same_answer(*case)))


def test_the_bounds_leave_the_reason_of_the_full_search() -> None:
    """A queue over its nominal even with all its own work gone cannot reclaim: no set
    works, and the reason names what the full search ends with."""
    tree = QueueTree.from_objects(
        [queue_obj("org"), queue_obj("a", "org", nominal=4), queue_obj("b", "org", nominal=4)], COLUMNS)
    world = World([8, 8], tree)
    for i in range(4):
        world.run(f"a{i}", "a", [0], gpus=2, priority=5)
    for i in range(4):
        world.run(f"b{i}", "b", [1], gpus=2)
    result = same_answer(world, preemptor("p", "a", [2], nodes=2, priority=4))
    assert isinstance(result, NoPreemption)
    assert "reclaim only restores a queue's nominal" in result.reason, result.reason
    assert np.all(world.used[:, 3] == 8)


def test_the_running_book_keeps_what_its_units_hold() -> None:
    """Across cycles: the same answer for the same unit, a new one once its members change,
    none for a unit the book does not keep."""
    world = World([8], QueueTree.from_objects([queue_obj("q", nominal=100)], COLUMNS))
    unit = world.run("r0", "q", [0, 0], gpus=2, extras=1)
    book = RunningBook()
    assert book.held(unit, len(COLUMNS)) is None
    book.units[unit.key] = unit
    first = book.held(unit, len(COLUMNS))
    assert first is not None
    assert [(len(h.pods), h.whole, h.gpus, h.vec.tolist()) for h in first] == [
        (2, True, 4, [2000, 0, 2, 4]), (1, False, 2, [1000, 0, 1, 2])]
    assert book.held(unit, len(COLUMNS)) is first
    smaller = replace(unit, pods=unit.pods[:1])
    book.units[unit.key] = smaller
    again = book.held(smaller, len(COLUMNS))
    assert again is not None and [(len(h.pods), h.whole) for h in again] == [(1, True)]
