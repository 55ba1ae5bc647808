"""GPU cards as devices: what pods ask, how the kernels place shares on cards (equal to
their twin), the assignment written on the Binding, and what a restart reads back."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsched.core import devices
from batchsched.core.cycle import Cycle
from batchsched.core.mirror import ClusterState
from batchsched.core.model import Node, Pod, PodUID
from batchsched.core.placement import cards as D
from batchsched.core.placement import kernels, reference
from batchsched.core.placement.cards import CardPolicy
from batchsched.core.placement.problem import PlacementProblem
from batchsched.core.placement.scoring import ScoringConfig
from batchsched.core.plan import single_unit
from batchsched.core.session import Session
from batchsched.core.settings import SessionSettings
from tests.builders import make_node, make_pod

CORE, MEM = devices.ELASTIC_CORE, devices.ELASTIC_MEMORY


def elastic_node(name: str, cards: int = 4, card_mib: int = 16384) -> Node:
    return make_node(name).cap(
        {"cpu": "64", "memory": "256Gi", CORE: str(100 * cards), MEM: str(card_mib * cards)}
    ).build()


def share(name: str, core: int, memory: int = 0, **annotations: str) -> Pod:
    req = {"cpu": "1", CORE: str(core)}
    if memory:
        req[MEM] = str(memory)
    return make_pod(name).uid(name).req(req).annotate(annotations).build()


def mirror(*objs: Node | Pod) -> ClusterState:
    state = ClusterState()
    for o in objs:
        if isinstance(o, Node):
            state.node_event("ADDED", o)
        else:
            state.pod_event("ADDED", o)
    return state


def run(state: ClusterState, policy: str = "binpack", use_jit: bool = True):  # type: ignore[no-untyped-def]
    cycle = Cycle(ScoringConfig(), use_jit=use_jit, cards=CardPolicy(policy=policy))
    units = [single_unit(p) for p in sorted(state.pending.values(), key=lambda p: p.name) if not p.gated]
    return cycle.run(state.snapshot(), units)


def card_usage(state: ClusterState, node: str) -> list[int]:
    row = state.node_row[node]
    n, _ = devices.node_cards(state.nodes[node].allocatable, state.nodes[node].labels)
    return [int(state.used[row, state.column(devices.card_compute(i))]) for i in range(n)]


# -- what a pod may ask --------------------------------------------------------------------


def test_asks_are_read_from_elasticgpu_requests_and_kai_annotations() -> None:
    assert share("a", 50).card_asks == (devices.CardAsk("main", share=500, elastic=True),)
    whole = make_pod("w").req({CORE: "200"}).build()
    assert whole.card_asks == (devices.CardAsk("main", whole=2, elastic=True),)
    kai = make_pod("k").annotate({"gpu-fraction": "0.25", "gpu-memory": "2048"}).build()
    assert kai.card_asks == (devices.CardAsk("main", share=250, memory=2048, kai=True),)
    named = make_pod("n").container(cpu="1").annotate({"gpu-fraction": "0.5", "gpu-fraction-container-name": "c1"}).build()
    assert [a.container for a in named.card_asks] == ["c1"]  # KAI's container choice is honoured
    gpu = make_pod("g").req(gpu=2).build()
    assert gpu.card_asks[0].anywhere and gpu.requests[devices.ASK_ANY] == 2


@pytest.mark.parametrize(("req", "annotations", "why"), [
    ({CORE: "150"}, {}, "above 100 only whole cards"),
    ({CORE: "50", "nvidia.com/gpu": "1"}, {}, "asks for both"),
    ({}, {"gpu-fraction": "1.5"}, "between 0 and 1"),
    ({"nvidia.com/gpu": "1"}, {"gpu-fraction": "0.5"}, "use one or the other"),
    ({}, {"batchsched.io/gpu-placement": "tightest"}, "not one of"),
    ({}, {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, "one card only"),
    ({}, {"gpu-fraction": "0.5", "gpu-fraction-container-name": "sidecar"}, "names no container"),
])
def test_requests_it_cannot_honour_make_the_pod_invalid_with_the_reason(
    req: dict[str, str], annotations: dict[str, str], why: str,
) -> None:
    annotations = {**annotations}
    if "batchsched.io/gpu-placement" in annotations:
        req = {CORE: "50"}
    pod = make_pod("bad").req(req).annotate(annotations).build()
    assert pod.invalid.startswith("GPU request refused") and why in pod.invalid


# -- placement ----------------------------------------------------------------------------


@pytest.mark.parametrize("use_jit", [True, False])
def test_binpack_shares_cards_and_writes_the_assignment(use_jit: bool) -> None:
    state = mirror(elastic_node("n0"), elastic_node("n1"),
                   *(share(f"p{i}", c) for i, c in enumerate((50, 50, 30, 70, 40))))
    plan = run(state, "binpack", use_jit)
    by_name = {b.name: b for b in plan.bindings}
    assert len(by_name) == 5 and {b.node for b in plan.bindings} == {"n0"}
    for b in plan.bindings:
        assert dict(b.labels) == {devices.ELASTIC_ASSUMED: "true"}
        assert set(dict(b.annotations)) == {"elasticgpu.io/container-main"}
        state.assume(PodUID(b.uid), b.node, b.cards)
    # 50+50 fill one card, 30+70 another, 40 a third: no card over 100%
    assert sorted(card_usage(state, "n0")) == [0, 400, 1000, 1000]
    assert by_name["p0"].annotations == (("elasticgpu.io/container-main", "0"),)


@pytest.mark.parametrize("use_jit", [True, False])
def test_spread_takes_the_emptiest_card(use_jit: bool) -> None:
    state = mirror(elastic_node("n0"), *(share(f"p{i}", 20) for i in range(4)))
    plan = run(state, "spread", use_jit)
    for b in plan.bindings:
        state.assume(PodUID(b.uid), b.node, b.cards)
    assert card_usage(state, "n0") == [200, 200, 200, 200]


def test_whole_cards_are_distinct_and_never_shared() -> None:
    state = mirror(elastic_node("n0"), share("s", 30),
                   make_pod("w").uid("w").req({CORE: "300"}).build())
    plan = run(state, "binpack")
    w = next(b for b in plan.bindings if b.name == "w")
    s = next(b for b in plan.bindings if b.name == "s")
    assert w.cards is not None and s.cards is not None
    assert len(set(w.cards[0])) == 3 and not set(w.cards[0]) & set(s.cards[0])


def test_a_share_that_fits_no_card_says_so() -> None:
    # 280 of the node's 300 gpu-core is free enough, but no one card has 70
    state = mirror(elastic_node("n0", cards=3), *(share(f"p{i}", 70) for i in range(4)))
    plan = run(state, "binpack")
    [u] = plan.unschedulable
    assert u.pod.name == "p3" and u.message.startswith("0/1 nodes fit: 1 no card with 70% free; holds a reservation")
    mem = mirror(elastic_node("n0", cards=2, card_mib=1024), share("big", 10, memory=4096))
    [u] = run(mem).unschedulable
    assert "insufficient gpu-memory on any card" in u.message or "insufficient elasticgpu.io/gpu-memory" in u.message


def test_fragmentation_keeps_whole_cards_for_the_mix() -> None:
    # the mix: whole-card pods are common; a share should go to the card already shared
    state = mirror(elastic_node("n0"), elastic_node("n1"))
    state.pod_event("ADDED", share("old", 50))
    plan = run(state, "fragmentation")
    [old] = plan.bindings
    state.assume(PodUID(old.uid), old.node, old.cards)
    for i in range(3):
        state.pod_event("ADDED", make_pod(f"w{i}").uid(f"w{i}").req({"cpu": "1", CORE: "100"}).gate().build())
    state.pod_event("ADDED", share("new", 40))
    plan = run(state, "fragmentation")
    [new] = plan.bindings
    assert new.node == old.node and new.cards == old.cards


def test_restart_rebuilds_cards_from_annotations() -> None:
    state = mirror(elastic_node("n0"), share("a", 60), share("b", 30))
    plan = run(state, "binpack")
    notes = {b.name: dict(b.annotations) for b in plan.bindings}
    rebuilt = mirror(elastic_node("n0"), *(
        make_pod(n).uid(n).req({"cpu": "1", CORE: str(c)}).annotate(notes[n]).running("n0").build()
        for n, c in (("a", 60), ("b", 30))
    ))
    assert sorted(card_usage(rebuilt, "n0")) == [0, 0, 0, 900]
    rebuilt.check()


def test_unbound_pod_with_a_stale_assignment_is_cleaned_before_it_is_placed() -> None:
    session = Session(SessionSettings(cards=CardPolicy(policy="binpack")))
    session.on_node("ADDED", elastic_node("n0"))
    stale = make_pod("s").uid("s").req({CORE: "50"}).annotate(
        {"elasticgpu.io/container-main": "2"}).label({devices.ELASTIC_ASSUMED: "true"}).build()
    session.on_pod("ADDED", stale)
    d = session.step(100.0)
    assert d.binds == []
    assert [(ref.name, notes, labels) for ref, notes, labels in d.cleanups] == [
        ("s", ("elasticgpu.io/container-main",), (devices.ELASTIC_ASSUMED,))
    ]
    clean = make_pod("s").uid("s").req({CORE: "50"}).build()
    session.on_pod("MODIFIED", clean)
    d = session.step(101.0)
    assert [b.name for b in d.binds] == ["s"] and d.cleanups == []


# -- the kernel equals its twin -----------------------------------------------------------

N_CARDS = 4
COLUMNS = ("cpu", "memory", "pods", devices.GPU_SHARES, devices.CARDS_ANY, *devices.ASK_COLUMNS,
           *(devices.card_compute(i) for i in range(N_CARDS)),
           *(devices.card_memory(i) for i in range(N_CARDS)))
COL = {c: i for i, c in enumerate(COLUMNS)}


@st.composite
def card_problems(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    n_nodes = draw(st.integers(1, 4))
    alloc = np.zeros((n_nodes, len(COLUMNS)), dtype=np.int64)
    used = np.zeros_like(alloc)
    for n in range(n_nodes):
        cards = draw(st.integers(0, N_CARDS))
        for c, v in devices.card_columns(cards, 8192).items():
            alloc[n, COL[c]] = v
        alloc[n, COL["cpu"]] = 8000
        used[n, COL["cpu"]] = draw(st.sampled_from([0, 4000, 7500]))
        for i in range(cards):
            used[n, COL[devices.card_compute(i)]] = draw(st.sampled_from([0, 0, 200, 500, 900, 1000]))
            used[n, COL[devices.card_memory(i)]] = draw(st.sampled_from([0, 1024, 4096]))
        empty = sum(1 for i in range(cards) if used[n, COL[devices.card_compute(i)]] == 0
                    and used[n, COL[devices.card_memory(i)]] == 0)
        used[n, COL[devices.CARDS_ANY]] = draw(st.integers(0, empty))
    n_members = draw(st.integers(1, 5))
    reqs = np.zeros((n_members, len(COLUMNS)), dtype=np.int64)
    for m in range(n_members):
        reqs[m, COL["cpu"]] = draw(st.sampled_from([500, 2000]))
        kind = draw(st.sampled_from(["share", "share", "whole", "any", "two", "cpu"]))
        if kind in ("share", "two"):
            reqs[m, COL[devices.ask_share(0)]] = draw(st.sampled_from([100, 250, 500, 700]))
            reqs[m, COL[devices.ask_memory(0)]] = draw(st.sampled_from([0, 0, 2048, 6000]))
        if kind == "two":
            reqs[m, COL[devices.ask_share(1)]] = draw(st.sampled_from([0, 300]))
            reqs[m, COL[devices.ask_memory(1)]] = draw(st.sampled_from([0, 1024]))
        if kind == "whole":
            reqs[m, COL[devices.ASK_WHOLE]] = draw(st.integers(1, 2))
        if kind == "any":
            reqs[m, COL[devices.ASK_ANY]] = draw(st.integers(1, 2))
        reqs[m, COL[devices.ASK_POLICY]] = draw(st.integers(0, len(devices.POLICIES)))
    policy = draw(st.integers(1, len(devices.POLICIES)))
    return alloc, used, reqs, np.zeros(n_members, dtype=np.int64), policy, draw(st.integers(0, n_members))


@settings(max_examples=300, deadline=None)
@given(card_problems(), st.sampled_from(["sharing", "all"]), st.sampled_from([0, 1, 40, 400]),
       st.sampled_from([0, 50, 100]))
def test_card_placement_kernel_equals_its_twin_and_never_overfills_a_card(
    problem: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int], scope: str, band: int,
    cpu_short: int,
) -> None:
    alloc, used, reqs, sig, policy, min_count = problem
    # a whole-card kind, two share kinds and a CPU-only kind; every band width, 0 (exact)
    # too, and every weight of the shares the CPU cannot host
    mix = ((400, 1000, 1, 1000), (200, 500, 0, 500), (200, 4000, 0, 250), (200, 1000, 0, 0))
    policy_ = CardPolicy(policy=devices.POLICIES[policy - 1], scope=scope, band=band, cpu_short=cpu_short)
    device = D.descriptor(COLUMNS, policy_, mix)
    arrays = replace(ScoringConfig().arrays(COLUMNS), device=device)
    masks = np.ones((1, alloc.shape[0]), dtype=np.bool_)
    static = np.zeros((1, alloc.shape[0]), dtype=np.int64)
    given_problem = PlacementProblem(alloc, used, reqs, sig, masks, static, arrays, min_count)
    results = []
    for impl in (kernels, reference):
        mine = given_problem.copy()
        u, r = mine.used, mine.reqs
        out = np.full(len(reqs), -2, dtype=np.int64)
        placed = impl.place(mine, out)
        results.append((int(placed), out.tolist(), u.tolist(), r.tolist()))
        for i in range(N_CARDS):
            assert (u[:, COL[devices.card_compute(i)]] <= 1000).all()
            grew = u[:, COL[devices.card_memory(i)]] > used[:, COL[devices.card_memory(i)]]
            assert (u[grew, COL[devices.card_memory(i)]] <= alloc[grew, COL[devices.card_memory(i)]]).all()
        assert ((u - used)[:, COL[devices.CARDS_ANY]] + used[:, COL[devices.CARDS_ANY]] >= 0).all()
    assert results[0] == results[1]


@pytest.mark.parametrize("policy", ["fragmentation", "binpack", "random"])
def test_a_mixed_queue_is_placed_as_the_twin_places_it(policy: str) -> None:
    # a queue of mixed kinds breaks into many kernel calls; the kinds' views of the nodes
    # kept between calls must give the placements the twin gives looking at every node
    from perf.cyclebench import card_state

    plans = []
    for use_jit in (True, False):
        state = card_state(30, 150, seed=7)
        cycle = Cycle(ScoringConfig(), use_jit=use_jit, cards=CardPolicy(policy=policy))
        units = [single_unit(p) for p in state.pending.values()]
        plan = cycle.run(state.snapshot(), units)
        plans.append(sorted((b.name, b.node, b.cards) for b in plan.bindings))
    assert plans[0] == plans[1] and len(plans[0]) > 50


def test_a_queue_limits_and_reports_gpu_in_card_shares() -> None:
    session = Session(SessionSettings(cards=CardPolicy(policy="binpack")))
    session.on_node("ADDED", elastic_node("n0"))
    session.on_queue("ADDED", {
        "apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team"},
        "spec": {"resources": [{"name": "batchsched.io/gpu", "nominal": "1"}]},
    })
    for i in range(3):
        session.on_pod("ADDED", make_pod(f"s{i}").uid(f"s{i}").created(i).label({"batchsched.io/queue": "team"})
                       .req({"cpu": "1", CORE: "50"}).build())
    d = session.step(100.0)
    assert sorted(b.name for b in d.binds) == ["s0", "s1"]  # two halves make the one card
    [why] = [c for c in d.unschedulable if c.ref.name == "s2"]
    assert "batchsched.io/gpu" in why.message
    for b in d.binds:
        session.on_bind_result(b, "bound", now=100.0)
    d = session.step(200.0)
    status = dict(d.queue_statuses)["team"]
    assert "batchsched.io/gpu" in str(status) and "'1'" in str(status)
    cards, held, free = session.state.card_usage()
    assert (cards, free) == (4, 3) and held == 1000
    session.on_pod("DELETED", session.state.pods[PodUID("s0")])
    assert session.state.card_usage() == (4, 500, 3)  # counted again after a change


def test_a_preemptor_holds_the_card_share_its_victim_frees() -> None:
    session = Session(SessionSettings(cards=CardPolicy(policy="binpack")))
    session.on_node("ADDED", elastic_node("n0", cards=1))
    session.on_pod("ADDED", make_pod("low").uid("low").priority(0).req({"cpu": "1", CORE: "80"})
                   .annotate({"elasticgpu.io/container-main": "0"}).running("n0").build())
    session.on_pod("ADDED", make_pod("high").uid("high").priority(100).req({"cpu": "1", CORE: "50"}).build())
    d = session.step(100.0)
    assert [e.name for e in d.evictions] == ["low"] and d.binds == []
    assert d.plan is not None
    [n] = d.plan.nominations
    assert n.requests[0].get(devices.card_compute(0)) == 500  # card 0's share is held for it


def test_more_kinds_in_one_call_than_views_never_share_a_view() -> None:
    from batchsched.core.placement.views import NodeViews

    views = NodeViews(4, kinds=2)
    pods = [share(f"p{i}", 10 + i) for i in range(4)]
    rows = views.kinds(pods).tolist()
    assert rows[:2] == [0, 1] and rows[2:] == [-1, -1]  # no row is handed to a second kind
    again = views.kinds([share("q", 50), pods[0]]).tolist()
    assert again[1] != again[0] and again[1] in (0, 1, -1)


def test_a_call_with_more_kinds_than_views_places_as_the_twin() -> None:
    # without reservations a run of single pods shares one call whatever they ask: here
    # far more kinds than the views kept, in one call (a view reused across kinds was a bug)
    from batchsched.core.reservation import ReservationSettings

    plans = []
    for use_jit in (True, False):
        state = mirror(*(make_node(f"n{i}").cap({"cpu": str(c), "memory": "256Gi", CORE: "400", MEM: "65536"}).build()
                         for i, c in enumerate((8, 16, 32, 64, 96, 12))))
        for i in range(80):
            state.pod_event("ADDED", make_pod(f"p{i:03d}").uid(f"p{i}").created(i)
                            .req({"cpu": str(1 + i % 40), CORE: str((10, 30, 50, 100)[i % 4])}).build())
        cycle = Cycle(ScoringConfig(), use_jit=use_jit, cards=CardPolicy(policy="fragmentation"),
                      reservation=ReservationSettings(enabled=False))
        units = [single_unit(p) for p in sorted(state.pending.values(), key=lambda p: p.name)]
        plan = cycle.run(state.snapshot(), units)
        plans.append(sorted((b.name, b.node, b.cards) for b in plan.bindings))
    assert plans[0] == plans[1] and len(plans[0]) > 20


def test_whole_elasticgpu_cards_are_packed_like_whole_nvidia_gpus() -> None:
    # whole gpu-core cards request no nvidia.com/gpu: the default scoring packs them by the
    # card compute (batchsched.io/gpu); before, every node scored 0 and the first one won
    busy = [make_pod(f"b{i}").uid(f"b{i}").req({"cpu": "1", CORE: "100"})
            .annotate({"elasticgpu.io/container-main": str(i)}).running("n2").build() for i in range(4)]
    state = mirror(*(elastic_node(f"n{i}", cards=8) for i in range(4)), *busy,
                   *(make_pod(f"w{i}").uid(f"w{i}").req({"cpu": "1", CORE: "100"}).build() for i in range(3)))
    plan = run(state, "binpack")
    assert sorted(b.node for b in plan.bindings) == ["n2", "n2", "n2"]


@settings(max_examples=300, deadline=None)
@given(st.integers(-20_000_000, 20_000_000), st.integers(-20_000_000, 20_000_000),
       st.sampled_from([0, 1, 40, 400]), st.integers(0, 16), st.integers(0, 16_000), st.integers(0, 16_000))
def test_fragmentation_bands_rank_as_their_twin_and_never_reverse_the_change(
    change: int, other: int, band: int, cards: int, used: int, asked: int,
) -> None:
    mix = ((500, 1000, 1, 1000), (300, 500, 0, 500), (200, 1000, 0, 0))
    device = D.descriptor(COLUMNS, CardPolicy(band=band), mix)
    alloc = np.zeros(len(COLUMNS), dtype=np.int64)
    alloc[COL[devices.GPU_SHARES]] = 1000 * cards
    used_row = np.zeros(len(COLUMNS), dtype=np.int64)
    used_row[COL[devices.GPU_SHARES]] = min(used, 1000 * cards)
    req = np.zeros(len(COLUMNS), dtype=np.int64)
    req[COL[devices.GPU_SHARES]] = asked
    key = kernels.banded(change, alloc, used_row, req, device)
    assert key == reference.banded(change, alloc, used_row, req, device)
    # a node whose fragmentation grows less by more than a band never ranks below one where
    # it grows more, however full that one is (use only orders the nodes of one band), and
    # with no band the exact change ranks
    width = int(device[D.BAND])
    rival = reference.banded(other, alloc, alloc.copy(), req, device)
    if change > other + width:
        assert key > rival


@pytest.mark.parametrize("use_jit", [True, False])
def test_a_cpu_hungry_share_keeps_off_the_node_whose_cpu_the_common_shares_need(use_jit: bool) -> None:
    # Both nodes have four free cards; "a-small" has 16 CPUs, just enough for the sixteen
    # quarter-card shares of 1 CPU the workload mostly runs, "b-big" 64. A quarter share
    # asking 8 CPUs there would leave its cards room for 15 of them and CPU for 8: the
    # measure that counts what the CPU left cannot host sends it to "b-big". The FGD
    # paper's measure (cpu_short 0) sees both nodes alike and takes the lowest.
    def node(name: str, cpus: int) -> Node:
        return make_node(name).cap({"cpu": str(cpus), "memory": "256Gi", CORE: "400", MEM: "65536"}).build()

    light = [make_pod(f"l{i}").uid(f"l{i}").req({"cpu": "1", CORE: "25"}).gate().build() for i in range(9)]
    heavy = make_pod("heavy").uid("heavy").req({"cpu": "8", CORE: "25"}).build()
    where = {}
    for cpu_short in (0, 50):
        state = mirror(node("a-small", 16), node("b-big", 64), *light, heavy)
        cycle = Cycle(ScoringConfig(), use_jit=use_jit, cards=CardPolicy(cpu_short=cpu_short))
        plan = cycle.run(state.snapshot(), [single_unit(heavy)])
        where[cpu_short] = {b.name: b.node for b in plan.bindings}["heavy"]
    assert where == {0: "a-small", 50: "b-big"}


@pytest.mark.parametrize("use_jit", [True, False])
def test_dotproduct_packs_a_whole_card_onto_the_node_with_less_free(use_jit: bool) -> None:
    # the FGD paper's DotProd: the node whose free CPU and GPU, dotted with the pod's ask,
    # are least; a half-used node beats an empty one
    def node(name: str) -> Node:
        return make_node(name).cap({"cpu": "96", "memory": "256Gi", CORE: "800", MEM: "131072"}).build()

    busy = [make_pod(f"r{i}").uid(f"r{i}").req({"cpu": "12", CORE: "100"})
            .annotate({"elasticgpu.io/container-main": str(i)}).running("b-busy").build() for i in range(4)]
    state = mirror(node("a-empty"), node("b-busy"), *busy,
                   make_pod("w").uid("w").req({"cpu": "12", CORE: "100"}).build())
    plan = run(state, "dotproduct", use_jit)
    assert {b.name: b.node for b in plan.bindings} == {"w": "b-busy"}
