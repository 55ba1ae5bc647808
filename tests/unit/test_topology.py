"""Topology-aware gang placement: gangs kept inside one rack, else one block, else anywhere
(or nowhere, when required), by hand on 2 blocks x 2 racks x 4 nodes x 8 GPUs, and by
hypothesis on random labelled clusters, against a brute force over every domain with the
plain-Python twin; the numba kernel and the twin give the same results throughout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.model import GPU, Node, NodeName
from batchsched.core.placement import kernels, reference
from batchsched.core.placement.problem import PlacementProblem
from batchsched.core.placement.scoring import BoolArray, IntArray, ScoringArrays, ScoringConfig
from batchsched.core.placement.topology import (
    BLOCK_LABEL,
    CLUSTER,
    RACK_LABEL,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    DomainCache,
    Domains,
    TopologyLevels,
    place_gang_topology,
    topology_placer,
    topology_policy,
)
from tests.builders import make_node

BOTH = pytest.mark.parametrize("impl", [kernels, reference], ids=["numba", "twin"])
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COLUMNS = ("cpu", "memory", "pods", GPU)
RACK, BLOCK = 0, 1
HOST = "kubernetes.io/hostname"


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    kernels.warm_up()


# ---- a hand-built cluster ----------------------------------------------------------------


def gpu_node(name: str, rack: str | None, block: str | None, gpus: int = 8) -> Node:
    labels = {HOST: name}
    if rack is not None:
        labels[RACK_LABEL] = rack
    if block is not None:
        labels[BLOCK_LABEL] = block
    return make_node(name).cap(cpu="96", memory="1024Gi", gpu=gpus).label(labels).build()


def standard_nodes() -> list[Node]:
    """2 blocks x 2 racks x 4 nodes x 8 GPUs; node i is in rack-(i//4), block-(i//8)."""
    return [gpu_node(f"n{i:02}", f"rack-{i // 4}", f"block-{i // 8}") for i in range(16)]


@dataclass
class World:
    nodes: list[Node] = field(default_factory=standard_nodes)
    config: ScoringConfig = field(default_factory=ScoringConfig)

    def __post_init__(self) -> None:
        self.alloc = np.array(
            [[n.allocatable.get(c, 0) for c in COLUMNS] for n in self.nodes], dtype=np.int64
        )
        self.used = np.zeros_like(self.alloc)
        self.domains = Domains.build(self.nodes)
        self.arrays: ScoringArrays = self.config.arrays(COLUMNS)

    def fill(self, *rows: int, gpus: int = 8) -> World:
        """Charge ``gpus`` GPUs (and a CPU per GPU) on each of ``rows``."""
        for row in rows:
            self.used[row] += member(gpus, cpu=gpus)
        return self

    def rack_of(self, row: int) -> str:
        return self.nodes[row].labels.get(RACK_LABEL, "")

    def block_of(self, row: int) -> str:
        return self.nodes[row].labels.get(BLOCK_LABEL, "")


def member(gpus: int = 8, *, cpu: int = 8) -> IntArray:
    return np.array([cpu * 1000, 64 * 2**30, 1, gpus], dtype=np.int64)


@dataclass
class Result:
    placed: int
    where: str
    out: list[int]
    used: IntArray


def place(
    world: World,
    impl: ModuleType,
    n_members: int,
    *,
    gpus: int = 8,
    min_count: int | None = None,
    required: int | None = None,
    masks: BoolArray | None = None,
) -> Result:
    """Place ``n_members`` identical members; ``world.used`` is left as it was."""
    reqs = np.tile(member(gpus), (n_members, 1))
    n = len(world.nodes)
    masks = np.ones((1, n), dtype=np.bool_) if masks is None else masks
    used = world.used.copy()
    out = np.full(n_members, 99, dtype=np.int64)
    problem = PlacementProblem(
        world.alloc, used, reqs, np.zeros(n_members, dtype=np.int64), masks,
        np.zeros((1, n), dtype=np.int64), world.arrays, n_members if min_count is None else min_count,
    )
    placed, where = place_gang_topology(
        problem, out, world.domains, required_level=required, place=impl.place, columns=COLUMNS,
    )
    return Result(placed, where, out.tolist(), used)


# ---- racks, then blocks, then anywhere ---------------------------------------------------


@BOTH
def test_a_gang_that_fits_a_rack_lands_in_one(impl: ModuleType) -> None:
    r = place(World(), impl, 4)
    assert (r.placed, r.where) == (4, "rack rack-0")  # every rack is as tight: by name
    assert sorted(r.out) == [0, 1, 2, 3]
    assert r.used[:, 3].tolist() == [8] * 4 + [0] * 12  # the placement is charged


@BOTH
@pytest.mark.parametrize(
    ("members", "rack"),
    [(1, "rack-3"), (2, "rack-0"), (3, "rack-1"), (4, "rack-2")],
)
def test_the_tightest_rack_that_fits_wins(impl: ModuleType, members: int, rack: str) -> None:
    # free GPUs per rack: rack-0 16, rack-1 24, rack-2 32, rack-3 8
    world = World().fill(0, 1, 4, 12, 13, 14)
    r = place(world, impl, members)
    assert (r.placed, r.where) == (members, f"rack {rack}")
    assert {world.rack_of(n) for n in r.out} == {rack}


@BOTH
def test_a_rack_with_enough_gpus_in_pieces_too_small_is_passed_over(impl: ModuleType) -> None:
    # rack-0 has 16 GPUs free, 4 on each node: no 8-GPU member fits there
    world = World().fill(0, 1, 2, 3, gpus=4).fill(4)
    r = place(world, impl, 2)
    assert r.where == "rack rack-1"
    assert {world.rack_of(n) for n in r.out} == {"rack-1"}


@BOTH
def test_a_gang_too_big_for_a_rack_spans_racks_in_one_block(impl: ModuleType) -> None:
    world = World()
    r = place(world, impl, 6)
    assert (r.placed, r.where) == (6, "block block-0")
    assert {world.rack_of(n) for n in r.out} == {"rack-0", "rack-1"}
    # with block-1 partly used it is the tighter block that still fits
    world.fill(8)
    r = place(world, impl, 6)
    assert r.where == "block block-1"
    assert {world.block_of(n) for n in r.out} == {"block-1"}


@BOTH
def test_required_rack_too_big_fails_readably_and_changes_nothing(impl: ModuleType) -> None:
    world = World().fill(0, 1, 2)
    before = world.used.copy()
    reqs = np.tile(member(), (12, 1))
    out = np.full(12, 99, dtype=np.int64)
    problem = PlacementProblem(
        world.alloc, world.used, reqs, np.zeros(12, dtype=np.int64),
        np.ones((1, 16), dtype=np.bool_), np.zeros((1, 16), dtype=np.int64), world.arrays, 12,
    )
    placed, why = place_gang_topology(
        problem, out, world.domains, required_level=RACK, place=impl.place, columns=COLUMNS,
    )
    assert placed == 0
    assert why == (
        "no rack can hold the gang's 12 members together (they need 96 cpu, 768Gi memory, "
        "96 nvidia.com/gpu); largest free in one rack: 32 nvidia.com/gpu (rack rack-1)"
    )
    assert np.array_equal(world.used, before)
    assert out.tolist() == [-1] * 12


@BOTH
def test_required_block_too_big_fails_readably(impl: ModuleType) -> None:
    r = place(World().fill(8), impl, 12, required=BLOCK)
    assert r.placed == 0
    assert r.where.startswith("no block can hold the gang's 12 members together")
    assert r.where.endswith("largest free in one block: 64 nvidia.com/gpu (block block-0)")


@BOTH
def test_required_rack_when_racks_have_the_gpus_but_in_small_pieces(impl: ModuleType) -> None:
    world = World().fill(*range(16), gpus=4)  # every rack: 16 GPUs free, 4 per node
    r = place(world, impl, 2, required=RACK)
    assert r.placed == 0
    assert r.where.endswith(
        "largest free in one rack: 16 nvidia.com/gpu (rack rack-0); "
        "4 rack(s) have enough free in total, but not on nodes where each member fits"
    )


@BOTH
def test_required_rack_short_of_another_resource_says_which(impl: ModuleType) -> None:
    world = World()
    world.used[:, 0] = 93_000  # 3 CPUs left per node, 12 per rack; two members ask 16
    r = place(world, impl, 2, required=RACK)
    assert r.placed == 0
    assert r.where.endswith("(rack rack-0) but only 12 cpu there")


@BOTH
def test_required_level_lets_a_narrower_domain_inside_it_win(impl: ModuleType) -> None:
    r = place(World(), impl, 4, required=BLOCK)
    assert (r.placed, r.where) == (4, "rack rack-0")


@BOTH
def test_preferred_falls_back_to_the_whole_cluster(impl: ModuleType) -> None:
    world = World()
    r = place(world, impl, 12)
    assert (r.placed, r.where) == (12, CLUSTER)
    assert {world.block_of(n) for n in r.out} == {"block-0", "block-1"}
    assert place(world.fill(*range(8)), impl, 12).placed == 0  # 64 GPUs left: not even so


@BOTH
def test_unlabelled_nodes_serve_only_the_cluster_fallback(impl: ModuleType) -> None:
    loose = [gpu_node(f"x{i}", None, None) for i in range(4)]
    world = World(nodes=standard_nodes() + loose).fill(16, 17, 18, 19, gpus=4)
    # Bin packing alone would fill the half-used unlabelled nodes first.
    r = place(world, impl, 4, gpus=4)
    assert r.where == "rack rack-0" and max(r.out) < 16
    # 36 x 4 GPUs: more than a block (64), all of the cluster (128 + 16)
    r = place(world, impl, 36, gpus=4)
    assert (r.placed, r.where) == (36, CLUSTER)
    assert sorted(set(r.out) & {16, 17, 18, 19}) == [16, 17, 18, 19]
    assert place(world, impl, 36, gpus=4, required=BLOCK).placed == 0


@BOTH
def test_no_node_with_the_label_is_said_so(impl: ModuleType) -> None:
    world = World(nodes=[gpu_node(f"x{i}", None, "block-0") for i in range(4)])
    r = place(world, impl, 2, required=RACK)
    assert r.placed == 0
    assert r.where.endswith(": no node it may use has the label batchsched.io/rack")
    assert place(world, impl, 2, required=BLOCK).where == "block block-0"


@BOTH
def test_a_rack_straddling_blocks_does_not_satisfy_required_block(impl: ModuleType) -> None:
    nodes = standard_nodes()
    nodes[3] = gpu_node("n03", "rack-0", "block-1")  # mislabelled: rack-0 is in two blocks
    world = World(nodes=nodes)
    assert place(world, impl, 4).where == "rack rack-0"
    r = place(world, impl, 4, required=BLOCK)
    assert r.where == "rack rack-1"


@BOTH
def test_masks_are_kept_inside_the_domain(impl: ModuleType) -> None:
    masks = np.ones((1, 16), dtype=np.bool_)
    masks[0, [0, 1]] = False  # say, a node selector: rack-0 keeps only 2 nodes
    r = place(World(), impl, 4, masks=masks)
    assert r.where == "rack rack-1"


@BOTH
def test_elastic_extras_prefer_the_winning_rack(impl: ModuleType) -> None:
    # rack-0: 3 nodes free (the tightest for a quorum of 2), rack-2: 4 free, others full
    world = World().fill(0, 4, 5, 6, 7, 12, 13, 14, 15)
    r = place(world, impl, 5, min_count=2)
    assert (r.placed, r.where) == (5, "rack rack-0")
    assert [world.rack_of(n) for n in r.out] == ["rack-0"] * 3 + ["rack-2"] * 2
    # a required rack keeps the extras in it: those that do not fit wait
    r = place(world, impl, 5, min_count=2, required=RACK)
    assert (r.placed, r.where) == (3, "rack rack-0")
    assert r.out[3:] == [-1, -1]


@BOTH
def test_without_a_quorum_members_go_anywhere(impl: ModuleType) -> None:
    r = place(World().fill(*range(15), gpus=4), impl, 3, gpus=4, min_count=0)
    assert (r.placed, r.where) == (3, CLUSTER)


@BOTH
def test_a_quorum_larger_than_the_gang_places_nothing(impl: ModuleType) -> None:
    r = place(World(), impl, 2, min_count=3)
    assert (r.placed, r.out) == (0, [-1, -1])
    assert "needs 3 members and has 2" in r.where


def test_bad_arguments_are_refused() -> None:
    world = World()
    with pytest.raises(ValueError, match="required topology level 2"):
        place(world, reference, 2, required=2)
    world.domains = Domains.build(world.nodes[:8])
    with pytest.raises(ValueError, match="another node list"):
        place(world, reference, 2)


def test_the_placer_has_the_kernel_signature() -> None:
    world = World().fill(0, 1)
    placer = topology_placer(world.domains, required_level=RACK, place=kernels.place)
    reqs = np.tile(member(), (2, 1))
    out = np.full(2, -1, dtype=np.int64)
    problem = PlacementProblem(
        world.alloc, world.used, reqs, np.zeros(2, dtype=np.int64), np.ones((1, 16), np.bool_),
        np.zeros((1, 16), np.int64), world.arrays, 2,
    )
    assert placer(problem.copy(), out) == 2 and sorted(out.tolist()) == [2, 3]
    # on the problem's own arrays too, as the victim search calls it
    out = np.full(2, -1, dtype=np.int64)
    placed = placer(problem, out)
    assert placed == 2 and sorted(out.tolist()) == [2, 3]


# ---- domains and the policy --------------------------------------------------------------


def test_domains_number_label_values_in_name_order() -> None:
    nodes = [
        gpu_node("a", "r-b", "b-1"),
        gpu_node("b", "r-a", "b-0"),
        gpu_node("c", None, "b-0"),
        gpu_node("d", "r-b", None),
        gpu_node("e", "", ""),  # an empty value counts as no label
    ]
    d = Domains.build(nodes)
    assert d.names == (("r-a", "r-b"), ("b-0", "b-1"))
    assert d.ids[RACK].tolist() == [1, 0, -1, 1, -1]
    assert d.ids[BLOCK].tolist() == [1, 0, 0, -1, -1]
    assert d.within(RACK, BLOCK).tolist() == [0, -1]  # r-b has a node without a block
    assert d.label(BLOCK, 1) == "block b-1"
    values = np.arange(10, dtype=np.int64).reshape(5, 2)
    assert d.totals(RACK, values).tolist() == [[2, 3], [6, 8]]
    assert d.totals(BLOCK, values).tolist() == [[6, 8], [0, 1]]


def test_custom_levels() -> None:
    levels = TopologyLevels((HOST, RACK_LABEL, BLOCK_LABEL, "topology.kubernetes.io/zone"))
    assert levels.names == ("hostname", "rack", "block", "zone")
    d = Domains.build(standard_nodes(), levels)
    assert d.count(0) == 16 and d.count(1) == 4 and d.count(3) == 0
    with pytest.raises(ValueError, match="distinct"):
        TopologyLevels(("a/rack", "b/rack"))
    with pytest.raises(ValueError, match="at least one"):
        TopologyLevels(())


def test_domain_cache_rebuilds_only_when_the_nodes_change() -> None:
    cache = DomainCache()
    nodes = standard_nodes()
    first = cache.get(nodes)
    assert cache.get(tuple(nodes)) is first  # a new snapshot tuple of the same nodes
    nodes[5] = gpu_node("n05", "rack-9", "block-0")
    second = cache.get(nodes)
    assert second is not first and second.names[RACK][-1] == "rack-9"
    assert cache.get(nodes, TopologyLevels((RACK_LABEL,))) is not second


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, (None, False)),
        ({TOPOLOGY_ANNOTATION: "rack"}, (RACK, True)),
        ({TOPOLOGY_ANNOTATION: "block"}, (BLOCK, True)),
        ({TOPOLOGY_PREFERRED_ANNOTATION: "rack"}, (RACK, False)),
        ({TOPOLOGY_PREFERRED_ANNOTATION: " Block "}, (BLOCK, False)),
        ({"other": "rack"}, (None, False)),
    ],
)
def test_topology_policy(annotations: Mapping[str, str], expected: tuple[int | None, bool]) -> None:
    assert topology_policy(annotations) == expected


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({TOPOLOGY_ANNOTATION: "zone"}, "annotation batchsched.io/topology: 'zone' is not rack or block"),
        ({TOPOLOGY_PREFERRED_ANNOTATION: ""}, "'' is not rack or block"),
        ({TOPOLOGY_ANNOTATION: "rack", TOPOLOGY_PREFERRED_ANNOTATION: "block"}, "set only one"),
    ],
)
def test_topology_policy_refuses(annotations: Mapping[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        topology_policy(annotations)
    assert "\n" not in str(info.value)


# ---- properties on random clusters -------------------------------------------------------

PROP_COLUMNS = ("cpu", GPU)


@dataclass
class Problem:
    nodes: list[Node]
    alloc: IntArray
    used: IntArray
    reqs: IntArray
    sig: IntArray
    masks: BoolArray
    static: IntArray
    arrays: ScoringArrays
    min_count: int
    required: int | None

    def run(self, place_fn: object, masks: BoolArray | None = None,
            domains: Domains | None = None) -> tuple[int, str, IntArray, IntArray]:
        problem = self.problem(self.masks if masks is None else masks)
        out = np.full(self.reqs.shape[0], 99, dtype=np.int64)
        placed, where = place_gang_topology(
            problem, out, domains if domains is not None else Domains.build(self.nodes),
            required_level=self.required, place=place_fn,  # type: ignore[arg-type]
            columns=PROP_COLUMNS,
        )
        return placed, where, out, problem.used

    def problem(self, masks: BoolArray) -> PlacementProblem:
        """The gang over ``masks``, on copies of the arrays a placement writes."""
        return PlacementProblem(
            self.alloc, self.used, self.reqs, self.sig, masks, self.static, self.arrays, self.min_count,
        ).copy()

    def quorum_fits(self, masks: BoolArray) -> bool:
        """The twin's verdict on the quorum over ``masks``."""
        out = np.full(self.reqs.shape[0], -1, dtype=np.int64)
        return bool(reference.place(self.problem(masks), out))


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    n = draw(st.integers(1, 10))
    nodes: list[Node] = []
    alloc = np.zeros((n, 2), dtype=np.int64)
    used = np.zeros((n, 2), dtype=np.int64)
    for i in range(n):
        rack = draw(st.integers(0, 3))
        kind = draw(st.sampled_from(["both", "both", "both", "rack", "block", "none"]))
        labels = {HOST: f"n{i}"}
        if kind in ("both", "rack"):
            labels[RACK_LABEL] = f"r{rack}"
        if kind in ("both", "block"):
            labels[BLOCK_LABEL] = f"b{rack // 2}"
        nodes.append(Node(name=NodeName(f"n{i}"), labels=labels))
        alloc[i] = [draw(st.sampled_from([2000, 4000, 8000])), draw(st.sampled_from([0, 4, 8, 8]))]
        # mostly room to spare: free, a quarter, half or all of it used
        share = draw(st.sampled_from([0, 0, 1, 2, 4]))
        used[i] = alloc[i] * share // 4
    m = draw(st.integers(1, 6))
    reqs = np.array(
        [[draw(st.integers(0, 2)) * 1000, draw(st.integers(0, 4))] for _ in range(m)],
        dtype=np.int64,
    ).reshape(m, 2)
    n_sig = draw(st.integers(1, 2))
    masks = np.array(
        [[draw(st.booleans()) or draw(st.booleans()) for _ in range(n)] for _ in range(n_sig)],
        dtype=np.bool_,
    )
    static = np.array(
        [[draw(st.sampled_from([0, 0, 10, 30])) for _ in range(n)] for _ in range(n_sig)],
        dtype=np.int64,
    )
    sig = np.array([draw(st.integers(0, n_sig - 1)) for _ in range(m)], dtype=np.int64)
    strategy = draw(st.sampled_from(["RequestedToCapacityRatio", "LeastAllocated"]))
    arrays = ScoringConfig(strategy=strategy, resources=(("cpu", 1), (GPU, 3))).arrays(PROP_COLUMNS)
    return Problem(
        nodes, alloc, used, reqs, sig, masks, static, arrays,
        min_count=draw(st.integers(1, m)), required=draw(st.sampled_from([None, RACK, BLOCK])),
    )


def narrowest_level_that_holds(p: Problem, domains: Domains) -> int | None:
    """Brute force with the twin: the first level one of whose (eligible) domains holds the
    quorum on its own."""
    last = len(domains.levels) - 1 if p.required is None else p.required
    for j in range(last + 1):
        for d in range(domains.count(j)):
            if p.required is not None and j < p.required and domains.within(j, p.required)[d] < 0:
                continue
            if p.quorum_fits(p.masks & domains.nodes_of(j, d)):
                return j
    return None


def check_placement(p: Problem, placed: int, out: IntArray, used: IntArray) -> None:
    """Never over-committed, masks respected, all-or-nothing for the quorum."""
    m = p.reqs.shape[0]
    rows = out[:m]
    if placed == 0:
        assert (rows == -1).all()
        assert np.array_equal(used, p.used)
        return
    assert (rows[: p.min_count] >= 0).all()
    assert placed == int((rows >= 0).sum())
    expect = p.used.copy()
    for k in range(m):
        if rows[k] >= 0:
            assert p.masks[p.sig[k], rows[k]]
            expect[rows[k]] += p.reqs[k]
    assert np.array_equal(used, expect)
    assert (used <= p.alloc).all()


@PROPERTY
@given(problems())
def test_property_topology_placement(p: Problem) -> None:
    domains = Domains.build(p.nodes)
    placed, where, out, used = p.run(kernels.place, domains=domains)
    twin = p.run(reference.place, domains=domains)
    assert (placed, where) == twin[:2]
    assert np.array_equal(out, twin[2]) and np.array_equal(used, twin[3])
    check_placement(p, placed, out, used)

    best = narrowest_level_that_holds(p, domains)
    if best is None:
        if p.required is not None:
            assert placed == 0 and where.startswith(f"no {domains.levels.name(p.required)} ")
        else:
            assert (placed > 0) == p.quorum_fits(p.masks)
            assert where == (CLUSTER if placed else f"the gang's {p.min_count} members do not fit on the nodes together")
        return
    level_name, _, domain_name = where.partition(" ")
    assert placed > 0 and level_name == domains.levels.name(best)
    d = domains.names[best].index(domain_name)
    rows = out[: p.reqs.shape[0]]
    inside = rows[: p.min_count] if p.required is None else rows[rows >= 0]
    assert (domains.ids[best][inside] == d).all()
    if p.required is not None and best < p.required:
        assert domains.within(best, p.required)[d] >= 0
