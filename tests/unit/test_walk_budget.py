"""A cycle's walk budget: a cycle that has placed something stops walking once its budget
is spent, so its Bindings leave at once; the next cycle, run at once, tries the units left.
What users see in the end is what one whole walk gives: the same pods on the same nodes,
the same gang whole, the same head holding its reservation, nothing told twice."""

from __future__ import annotations

import random

from batchsched.core.decisions import Decisions
from batchsched.core.queues import QueueSettings
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_pod
from tests.unit.test_session import GPU, T0, Cluster

QUEUE = "batchsched.io/queue"


def queues(*names: str) -> list[dict[str, object]]:
    return [{"metadata": {"name": n}, "spec": {"resources": [{"name": GPU, "nominal": 16}]}} for n in names]


def world(budget: float | None, seed: int) -> tuple[Cluster, list[str]]:
    """Six 8-GPU nodes; in two queues, single pods of 1-4 GPUs, gangs of 2-4 members and one
    gang too large for what is free (it waits, holding a reservation at its queue's head)."""
    rng = random.Random(seed)
    s = Session(SessionSettings(queues=QueueSettings(), walk_budget=budget))
    s.on_queues_listed(queues("a", "b"))
    c = Cluster(s)
    for i in range(6):
        c.node(f"n{i}", 8)
    groups, uids = [], []
    for i in range(40):
        q = rng.choice("ab")
        created = T0 - 1000 + i
        if i % 7 == 3:
            size, gpus = rng.choice((2, 3, 4)), rng.choice((1, 2))
            groups.append(make_group(f"g{i}").min_member(size).created(created).build())
            for m in range(size):
                uids.append(c.pod(make_pod(f"g{i}-{m}").group(f"g{i}").label(**{QUEUE: q})
                                  .req(cpu="1", **{GPU: str(gpus)}).created(created).obj()))
        else:
            uids.append(c.pod(make_pod(f"p{i}").label(**{QUEUE: q}).req(cpu="1", **{GPU: str(rng.choice((1, 2, 4)))})
                              .created(created).obj()))
    groups.append(make_group("big").min_member(4).created(T0 - 2000).build())
    for m in range(4):
        uids.append(c.pod(make_pod(f"big-{m}").group("big").label(**{QUEUE: "a"}).req(cpu="1", **{GPU: "8"})
                          .created(T0 - 2000).obj()))
    s.on_groups_listed("scheduling.x-k8s.io", groups)
    return c, uids


def settle(c: Cluster) -> list[Decisions]:
    """Steps until the session owes no step at once (as the scheduler's loop runs them)."""
    steps = [c.step(after=1.0)]
    while steps[-1].again and len(steps) < 200:
        steps.append(c.step(after=0.01))
    return steps


def test_a_walk_that_stops_at_its_budget_places_what_one_whole_walk_places() -> None:
    for seed in range(6):
        whole, uids = world(None, seed)
        one = settle(whole)
        cut, _ = world(0.0, seed)  # stops after each unit that placed something
        many = settle(cut)
        assert len(many) > len(one)  # the walk did stop early
        assert any(d.plan is not None and d.plan.unfinished for d in many)
        assert {u: cut.node_of(u) for u in uids} == {u: whole.node_of(u) for u in uids}
        # the waiting gang holds room at its queue's head either way
        assert cut.session.holds_reservation("default/big") == whole.session.holds_reservation("default/big")
        # every pod that waits is told why, and told once
        for c, steps in ((whole, one), (cut, many)):
            told = [p.ref.uid for d in steps for p in d.unschedulable]
            assert sorted(set(told)) == sorted(u for u in uids if not c.node_of(u))
            assert len(told) == len(set(told))


def test_the_first_bindings_leave_before_the_rest_of_the_backlog_is_walked() -> None:
    c, _ = world(0.0, 1)
    first = c.step(after=1.0)
    assert first.binds and first.again and first.plan is not None and first.plan.unfinished
    rest = settle(c)
    assert len(first.binds) < sum(len(d.binds) for d in [first, *rest])
    # the cycle after one that stopped early walks to the end: the rest is not cut up again
    assert rest[0].plan is not None and not rest[0].plan.unfinished


def test_without_a_budget_one_step_tries_everything() -> None:
    c, _ = world(None, 2)
    d = c.step(after=1.0)
    assert d.plan is not None and not d.plan.unfinished
    assert not d.again or d.plan.deferred


def singles(budget: float | None) -> tuple[Cluster, list[str]]:
    """Fifty 8-GPU nodes, some partly taken by running pods of 1-4 GPUs, and a run of 450
    alike single pods of 2 GPUs, more than fits."""
    rng = random.Random(5)
    s = Session(SessionSettings(walk_budget=budget))
    c = Cluster(s)
    for i in range(50):
        c.node(f"n{i}", 8)
    for i in range(40):
        c.pod(make_pod(f"run{i}").req(cpu="1", **{GPU: str(rng.choice((1, 2, 4)))}).running(f"n{rng.randrange(50)}")
              .created(T0 - 5000).obj())
    uids = [c.pod(make_pod(f"p{i}").req(cpu="1", **{GPU: "2"}).created(T0 - 1000 + i).obj()) for i in range(450)]
    return c, uids


def test_a_long_run_of_alike_pods_is_placed_in_parts_and_the_first_part_leaves_at_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # one kernel call per run of alike pods: a first cycle over 20,000 of them sent nothing
    # for 7.5 s. Runs of at most SINGLES_RUN: the walk stops after the first once its budget
    # is spent, and in the end each pod is where one call for the whole run puts it.
    from batchsched.core import cycle

    monkeypatch.setattr(cycle, "SINGLES_RUN", 10**9)
    whole, uids = singles(None)
    one = settle(whole)
    monkeypatch.setattr(cycle, "SINGLES_RUN", 100)
    cut, _ = singles(0.0)
    first = cut.step(after=1.0)
    assert len(first.binds) == 100 and first.again and first.plan is not None and first.plan.unfinished
    rest = settle(cut)
    assert {u: cut.node_of(u) for u in uids} == {u: whole.node_of(u) for u in uids}
    placed = sum(1 for u in uids if whole.node_of(u))
    assert 100 < placed < len(uids)  # more than one run fits, not everything
    for c, steps in ((whole, one), (cut, [first, *rest])):
        told = [p.ref.uid for d in steps for p in d.unschedulable]
        assert sorted(set(told)) == sorted(u for u in uids if not c.node_of(u)) and len(told) == len(set(told))


def test_a_run_placed_in_parts_preempts_what_one_call_for_the_whole_run_preempts(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # the pods of a run that do not fit preempt one by one after the run's kernel call: cut
    # into parts, the same lower-priority pods are evicted and the same pods placed
    from batchsched.core import cycle

    def world() -> tuple[Cluster, list[str], list[str]]:
        rng = random.Random(9)
        c = Cluster(Session(SessionSettings()))
        for i in range(20):
            c.node(f"n{i}", 8)
        low = [c.pod(make_pod(f"low{i}").req(cpu="1", **{GPU: str(rng.choice((1, 2)))}).running(f"n{i % 20}")
                     .created(T0 - 5000 + i).obj()) for i in range(60)]
        high = [c.pod(make_pod(f"high{i}").priority(100).req(cpu="1", **{GPU: "2"}).created(T0 - 1000 + i).obj())
                for i in range(90)]
        return c, low, high

    def run(part: int) -> tuple[list[list[str]], dict[str, str]]:
        monkeypatch.setattr(cycle, "SINGLES_RUN", part)
        c, low, high = world()
        evicted: list[list[str]] = []
        for _ in range(30):
            d = c.step(after=1.0)
            evicted.append(sorted(e.uid for e in d.evictions))
            assert set(evicted[-1]) <= set(low)  # only the lower priority is evicted
            for e in d.evictions:
                c.delete_pod(e.uid)
        return evicted, {u: c.node_of(u) for u in high if u in c.pods}

    whole_evicted, whole_placed = run(10**9)
    parts_evicted, parts_placed = run(15)
    assert any(whole_evicted)  # preemption did act
    assert 15 < sum(1 for n in whole_placed.values() if n) < len(whole_placed)  # several parts, not all fit
    assert sorted(u for step in parts_evicted for u in step) == sorted(u for step in whole_evicted for u in step)
    assert parts_placed == whole_placed
