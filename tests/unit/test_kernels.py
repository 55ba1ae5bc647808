"""The placement kernels: kube-scheduler's scores by hand, and the numba kernels held equal
to their plain-Python twins on random clusters by hypothesis."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.placement import kernels, reference
from batchsched.core.placement.problem import PlacementProblem
from batchsched.core.placement.scoring import (
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    RTCR,
    BoolArray,
    IntArray,
    ScoringArrays,
    ScoringConfig,
)

BOTH = pytest.mark.parametrize("impl", [kernels, reference], ids=["numba", "twin"])
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    kernels.warm_up()


def ints(*values: int) -> IntArray:
    return np.array(values, dtype=np.int64)


def score(
    impl: ModuleType,
    arrays: ScoringArrays,
    alloc: Sequence[int],
    used: Sequence[int],
    req: Sequence[int],
) -> int:
    result = impl.node_score(
        ints(*alloc),
        ints(*used),
        ints(*req),
        arrays.weights,
        arrays.scalar,
        arrays.shape_u,
        arrays.shape_s,
        arrays.strategy,
    )
    return int(result)


GPU_ONLY = ScoringConfig().arrays([GPU])
SPREAD = ScoringConfig(shape=((0, 10), (100, 0))).arrays([GPU])


# ---- node_score by hand ------------------------------------------------------------------


@BOTH
@pytest.mark.parametrize(
    ("alloc", "used", "asks", "expected"),
    [
        (8, 3, 1, 50),  # 4 of 8 GPUs after placing: utilization 50
        (8, 0, 8, 100),
        (8, 0, 1, 12),  # 100 // 8
        (8, 0, 0, 0),  # a scalar resource the pod does not ask for is not scored
        (8, 8, 1, 100),  # over capacity counts as utilization 100
        (0, 0, 1, 0),  # no allocatable: skipped
    ],
)
def test_rtcr_default_gpu(
    impl: ModuleType, alloc: int, used: int, asks: int, expected: int
) -> None:
    assert score(impl, GPU_ONLY, [alloc], [used], [asks]) == expected


@BOTH
def test_rtcr_spread_shape(impl: ModuleType) -> None:
    # 4 of 8 GPUs: utilization 50; 100 + (0 - 100) * 50 / 100 = 50.
    assert score(impl, SPREAD, [8], [2], [2]) == 50
    assert score(impl, SPREAD, [8], [0], [1]) == 88  # utilization 12: 100 - 12


@BOTH
def test_rtcr_shape_division_truncates_toward_zero(impl: ModuleType) -> None:
    # Shape 0:10, 30:0 scaled to 0:100, 30:0. At utilization 10 (1 of 10 GPUs):
    # 100 + (0 - 100) * (10 - 0) / 30 = 100 + trunc(-33.3) = 67 (flooring would give 66).
    arrays = ScoringConfig(shape=((0, 10), (30, 0))).arrays([GPU])
    assert score(impl, arrays, [10], [0], [1]) == 67
    # Beyond the last point the last score holds.
    assert score(impl, arrays, [10], [0], [5]) == 0


@BOTH
def test_rtcr_shape_below_first_point(impl: ModuleType) -> None:
    arrays = ScoringConfig(shape=((20, 2), (80, 8))).arrays([GPU])
    assert score(impl, arrays, [10], [0], [1]) == 20  # utilization 10 <= 20: the first score
    assert score(impl, arrays, [10], [0], [5]) == 50  # 20 + 60 * 30 / 60
    assert score(impl, arrays, [10], [0], [9]) == 80  # utilization 90: the last score


# Two weighted resources, cpu weight 1 and GPU weight 3, on a node with 16 CPUs (4 used)
# and 8 GPUs (4 used), for a pod asking 2 CPUs and 1 GPU:
#   cpu requested 6000m of 16000m: 6000 * 100 // 16000 = 37 used, (16000 - 6000) * 100 // 16000
#   = 62 free; GPU requested 5 of 8: 500 // 8 = 62 used, 300 // 8 = 37 free.
#   RTCR (shape 0:0, 100:10): (37 * 1 + 62 * 3) / 4 = 223 / 4 = 55.75, rounded: 56
#   LeastAllocated: (62 * 1 + 37 * 3) // 4 = 173 // 4 = 43
#   MostAllocated:  (37 * 1 + 62 * 3) // 4 = 223 // 4 = 55
TWO = ("cpu", GPU)
TWO_NODE = ([16000, 8], [4000, 4], [2000, 1])


@BOTH
@pytest.mark.parametrize(
    ("strategy", "expected"),
    [("RequestedToCapacityRatio", 56), ("LeastAllocated", 43), ("MostAllocated", 55)],
)
def test_two_weighted_resources(impl: ModuleType, strategy: str, expected: int) -> None:
    arrays = ScoringConfig(strategy=strategy, resources=(("cpu", 1), (GPU, 3))).arrays(TWO)
    assert score(impl, arrays, *TWO_NODE) == expected


@BOTH
def test_rtcr_rounds_half_away_from_zero(impl: ModuleType) -> None:
    # Equal weights: (37 + 62) / 2 = 49.5 -> 50.
    arrays = ScoringConfig(resources=(("cpu", 1), (GPU, 1))).arrays(TWO)
    assert score(impl, arrays, *TWO_NODE) == 50


@BOTH
def test_rtcr_leaves_out_resources_scoring_zero(impl: ModuleType) -> None:
    # cpu is not scalar, so it is scored although the pod asks none, but utilization 0 scores
    # 0 and RTCR leaves it out of the mean: the GPU alone decides (4 of 8: 50, not 25).
    arrays = ScoringConfig(resources=(("cpu", 1), (GPU, 1))).arrays(TWO)
    assert score(impl, arrays, [16000, 8], [0, 3], [0, 1]) == 50


@BOTH
def test_least_allocated_counts_resources_scoring_zero(impl: ModuleType) -> None:
    # cpu full after placing: 0 free, still weighs in; GPU 4 of 8 free: 50. (0 + 50) // 2.
    arrays = ScoringConfig(strategy="LeastAllocated", resources=(("cpu", 1), (GPU, 1))).arrays(TWO)
    assert score(impl, arrays, [16000, 8], [15000, 3], [1000, 1]) == 25
    # Over capacity scores 0 (kube-scheduler's leastRequestedScore).
    assert score(impl, arrays, [16000, 8], [17000, 3], [1000, 1]) == 25


@BOTH
def test_most_allocated_caps_requested_at_capacity(impl: ModuleType) -> None:
    # kube-scheduler's mostRequestedScore caps requested at capacity: cpu over capacity
    # scores 100, not 0. GPU 4 of 8: 50. (100 + 50) // 2 = 75.
    arrays = ScoringConfig(strategy="MostAllocated", resources=(("cpu", 1), (GPU, 1))).arrays(TWO)
    assert score(impl, arrays, [16000, 8], [17000, 3], [1000, 1]) == 75


@BOTH
def test_exact_where_the_product_overflows_int64(impl: ModuleType) -> None:
    # 2**60 * 100 overflows int64; the utilization must still be 100 * 3 // 7 = 42.
    big = 2**60
    assert score(impl, GPU_ONLY, [7 * big], [2 * big], [big]) == 42


@BOTH
def test_unknown_strategy_is_refused(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="strategy"):
        impl.node_score(
            ints(8), ints(0), ints(1), ints(1), np.ones(1, np.bool_), ints(0), ints(0), 7
        )


# ---- fits and insufficient_counts --------------------------------------------------------


@BOTH
def test_fits_checks_requested_resources_only(impl: ModuleType) -> None:
    assert impl.fits(ints(4000, 8), ints(3000, 7), ints(1000, 1))
    assert not impl.fits(ints(4000, 8), ints(3000, 7), ints(1001, 1))
    # Already over-committed on cpu, but the pod asks no cpu.
    assert impl.fits(ints(4000, 8), ints(5000, 0), ints(0, 8))


@BOTH
def test_insufficient_counts(impl: ModuleType) -> None:
    alloc = np.array([[4000, 8], [4000, 8], [1000, 0], [0, 0]], dtype=np.int64)
    used = np.array([[3500, 0], [0, 8], [0, 0], [0, 0]], dtype=np.int64)
    mask = np.array([True, True, True, False])
    counts = impl.insufficient_counts(alloc, used, ints(1000, 1), mask)
    assert counts.tolist() == [1, 2]  # node 3 is masked out
    assert impl.insufficient_counts(alloc, used, ints(0, 0), mask).tolist() == [0, 0]


# ---- place by hand ------------------------------------------------------------------------


@dataclass
class Cluster:
    """A placement problem being drawn or edited: nodes x resources, members, signatures,
    scoring (:meth:`problem` is the value the kernel and its twin take)."""

    alloc: IntArray
    used: IntArray
    reqs: IntArray
    sig: IntArray
    masks: BoolArray
    static_score: IntArray
    arrays: ScoringArrays
    min_count: int

    def copy(self) -> Cluster:
        return Cluster(
            self.alloc.copy(),
            self.used.copy(),
            self.reqs.copy(),
            self.sig.copy(),
            self.masks.copy(),
            self.static_score.copy(),
            self.arrays,
            self.min_count,
        )

    def problem(self) -> PlacementProblem:
        """The problem over this cluster's arrays (a placement writes ``used`` and ``reqs``)."""
        return PlacementProblem(
            self.alloc, self.used, self.reqs, self.sig, self.masks, self.static_score, self.arrays,
            self.min_count,
        )

    def place(self, impl: ModuleType) -> tuple[int, list[int]]:
        """Run ``impl.place``; ``used`` is updated in place."""
        return solve(impl, self.problem())


def solve(impl: ModuleType, problem: PlacementProblem) -> tuple[int, list[int]]:
    """``impl.place(problem)``: the members placed and each one's node."""
    out = np.full(problem.reqs.shape[0], 99, dtype=np.int64)
    placed = impl.place(problem, out)
    return int(placed), out.tolist()


def gpu_cluster(
    gpus: Sequence[int],
    used: Sequence[int],
    asks: Sequence[int],
    *,
    min_count: int,
    config: ScoringConfig | None = None,
) -> Cluster:
    """GPU-only nodes, one signature that allows every node."""
    n, m = len(gpus), len(asks)
    return Cluster(
        alloc=np.array([[g] for g in gpus], dtype=np.int64),
        used=np.array([[u] for u in used], dtype=np.int64),
        reqs=np.array([[q] for q in asks], dtype=np.int64).reshape(m, 1),
        sig=np.zeros(m, dtype=np.int64),
        masks=np.ones((1, n), dtype=np.bool_),
        static_score=np.zeros((1, n), dtype=np.int64),
        arrays=(config or ScoringConfig()).arrays([GPU]),
        min_count=min_count,
    )


@BOTH
def test_bin_packs_gpus(impl: ModuleType) -> None:
    # Default RTCR packs: each member goes where utilization ends highest.
    c = gpu_cluster([8, 8, 8], [0, 4, 6], [2, 2, 2, 2], min_count=4)
    assert c.place(impl) == (4, [2, 1, 1, 0])
    assert c.used.ravel().tolist() == [2, 8, 8]


@BOTH
def test_spread_shape_spreads(impl: ModuleType) -> None:
    c = gpu_cluster(
        [8, 8, 8],
        [0, 0, 0],
        [2, 2, 2],
        min_count=3,
        config=ScoringConfig(shape=((0, 10), (100, 0))),
    )
    assert c.place(impl) == (3, [0, 1, 2])  # ties go to the lowest node


@BOTH
def test_gang_rolls_back_when_a_core_member_does_not_fit(impl: ModuleType) -> None:
    c = gpu_cluster([8, 4], [2, 0], [4, 4, 4], min_count=3)
    before = c.used.copy()
    assert c.place(impl) == (0, [-1, -1, -1])
    assert np.array_equal(c.used, before)


@BOTH
def test_members_past_min_count_are_best_effort(impl: ModuleType) -> None:
    c = gpu_cluster([8, 4], [2, 0], [4, 8, 4, 1], min_count=1)
    assert c.place(impl) == (3, [1, -1, 0, 0])
    assert c.used.ravel().tolist() == [7, 4]


@BOTH
def test_min_count_above_member_count_places_nothing(impl: ModuleType) -> None:
    c = gpu_cluster([8], [0], [1, 1], min_count=3)
    assert c.place(impl) == (0, [-1, -1])
    assert c.used.ravel().tolist() == [0]


@BOTH
def test_masks_and_static_scores(impl: ModuleType) -> None:
    c = gpu_cluster([8, 8, 8], [0, 0, 6], [1, 1], min_count=2)
    c.masks = np.array([[True, True, False], [True, True, True]])
    c.static_score = np.array([[0, 30, 0], [0, 0, 0]], dtype=np.int64)
    c.sig = ints(0, 1)
    # Member 0 may not use node 2; node 1's static 30 beats node 0's equal fit score.
    # Member 1 may go anywhere and packs onto node 2 (7 of 8).
    assert c.place(impl) == (2, [1, 2])


@BOTH
def test_bad_signature_is_refused_before_anything_changes(impl: ModuleType) -> None:
    c = gpu_cluster([8], [0], [1, 1], min_count=1)
    c.sig = ints(0, 1)
    with pytest.raises(ValueError, match="sig"):
        c.place(impl)
    assert c.used.ravel().tolist() == [0]


# ---- ScoringConfig -----------------------------------------------------------------------


def test_default_scoring_arrays() -> None:
    a = ScoringConfig().arrays(["cpu", "memory", "pods", GPU, "example.com/fpga"])
    assert a.strategy == RTCR
    assert a.weights.tolist() == [0, 0, 0, 1, 0]
    assert a.scalar.tolist() == [False, False, False, True, True]
    assert a.shape_u.tolist() == [0, 100]
    assert a.shape_s.tolist() == [0, 100]
    assert a.weights.dtype == np.int64 and a.scalar.dtype == np.bool_


def test_configured_pods_is_never_scored() -> None:
    config = ScoringConfig(strategy="LeastAllocated", resources=(("cpu", 2), ("pods", 5)))
    a = config.arrays(["cpu", "pods"])
    assert (a.strategy, a.weights.tolist()) == (LEAST_ALLOCATED, [2, 0])
    assert ScoringConfig(strategy="MostAllocated").arrays([GPU]).strategy == MOST_ALLOCATED


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (ScoringConfig(strategy="Balanced"), "not one of"),
        (ScoringConfig(resources=()), "at least one resource"),
        (ScoringConfig(resources=((GPU, 0),)), "weight"),
        (ScoringConfig(resources=((GPU, 101),)), "weight"),
        (ScoringConfig(resources=((GPU, 1), (GPU, 2))), "twice"),
        (ScoringConfig(shape=()), "at least one shape point"),
        (ScoringConfig(shape=((0, 0), (0, 10))), "increase strictly"),
        (ScoringConfig(shape=((50, 0), (20, 10))), "increase strictly"),
        (ScoringConfig(shape=((0, 0), (101, 10))), "outside 0..100"),
        (ScoringConfig(shape=((0, 0), (100, 11))), "score 11"),
        (ScoringConfig(shape=((0, -1), (100, 10))), "score -1"),
    ],
)
def test_scoring_config_validation(config: ScoringConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_valid_scoring_configs() -> None:
    ScoringConfig().validate()
    ScoringConfig(shape=((0, 10), (100, 0))).validate()
    ScoringConfig(
        strategy="LeastAllocated", resources=(("cpu", 1), ("memory", 1)), shape=()
    ).validate()


# ---- kernels == twins, and invariants, on random clusters --------------------------------


@st.composite
def scoring_arrays(draw: st.DrawFn, n_res: int) -> ScoringArrays:
    """Any strategy, weights 0..3 (0: unscored), random scalar flags, random shapes whose
    scores are often 0 (RTCR leaves such resources out) or round."""
    points = draw(st.lists(st.integers(0, 100), min_size=1, max_size=4, unique=True))
    points.sort()
    score = st.one_of(st.sampled_from([0, 0, 50, 100]), st.integers(0, 100))
    scores = draw(st.lists(score, min_size=len(points), max_size=len(points)))
    weight = st.sampled_from([0, 1, 1, 2, 3])
    return ScoringArrays(
        strategy=draw(st.sampled_from([RTCR, LEAST_ALLOCATED, MOST_ALLOCATED])),
        weights=np.array(draw(st.lists(weight, min_size=n_res, max_size=n_res)), np.int64),
        scalar=np.array(draw(st.lists(st.booleans(), min_size=n_res, max_size=n_res)), np.bool_),
        shape_u=np.array(points, np.int64),
        shape_s=np.array(scores, np.int64),
    )


def int_matrix(draw: st.DrawFn, rows: int, cols: int, values: st.SearchStrategy[int]) -> IntArray:
    cells = draw(st.lists(values, min_size=rows * cols, max_size=rows * cols))
    return np.array(cells, dtype=np.int64).reshape(rows, cols)


def rows_from_pool(draw: st.DrawFn, pool: IntArray, count: int) -> IntArray:
    """``count`` rows, each a copy of one of the pool's rows."""
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=count, max_size=count))
    return pool[picks].reshape(count, pool.shape[1]).copy()


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """Small clusters that are mostly placeable: nodes and members drawn from a few shapes
    (so score ties and runs of identical members, the kernel's incremental path, are
    common), usage mostly under allocatable with some nodes over-committed, masks mostly
    open, static scores often flat."""
    n_nodes = draw(st.integers(1, 6))
    n_res = draw(st.integers(1, 4))
    n_sigs = draw(st.integers(1, 3))
    n_members = draw(st.integers(0, 7))
    top = draw(st.sampled_from([4, 10, 1000]))
    node_pool = int_matrix(draw, draw(st.integers(1, 3)), n_res, st.integers(0, top))
    alloc = rows_from_pool(draw, node_pool, n_nodes)
    # Usage in quarters of allocatable; 5 quarters over-commits.
    quarters = int_matrix(draw, n_nodes, n_res, st.sampled_from([0, 0, 1, 2, 3, 4, 5]))
    used = alloc * quarters // 4
    member_pool = int_matrix(
        draw, draw(st.integers(1, 3)), n_res, st.sampled_from([0, 0, 1, top // 4, top // 2])
    )
    masks = int_matrix(draw, n_sigs, n_nodes, st.sampled_from([1, 1, 1, 0])).astype(np.bool_)
    flat = draw(st.booleans())
    static = int_matrix(draw, n_sigs, n_nodes, st.just(0) if flat else st.integers(-30, 30))
    return Cluster(
        alloc=alloc,
        used=used,
        reqs=rows_from_pool(draw, member_pool, n_members),
        sig=np.array(
            draw(st.lists(st.integers(0, n_sigs - 1), min_size=n_members, max_size=n_members)),
            dtype=np.int64,
        ),
        masks=masks,
        static_score=static,
        arrays=draw(scoring_arrays(n_res)),
        min_count=draw(st.integers(0, n_members + 1)),
    )


def each_pair(c: Cluster, fn: Callable[[IntArray, IntArray, IntArray], Any]) -> list[Any]:
    return [
        fn(c.alloc[n], c.used[n], c.reqs[m])
        for n in range(len(c.alloc))
        for m in range(len(c.reqs))
    ]


def scorer(impl: ModuleType, a: ScoringArrays) -> Callable[[IntArray, IntArray, IntArray], int]:
    return lambda al, us, rq: int(
        impl.node_score(al, us, rq, a.weights, a.scalar, a.shape_u, a.shape_s, a.strategy)
    )


@PROPERTY
@given(clusters())
def test_node_score_and_fits_equal_twin(c: Cluster) -> None:
    assert each_pair(c, scorer(kernels, c.arrays)) == each_pair(c, scorer(reference, c.arrays))
    assert each_pair(c, lambda *x: bool(kernels.fits(*x))) == each_pair(
        c, lambda *x: bool(reference.fits(*x))
    )


@settings(max_examples=100, deadline=None)
@given(
    alloc=st.integers(1, 2**61),
    used=st.integers(0, 2**61),
    req=st.integers(0, 2**61),
    strategy=st.sampled_from([RTCR, LEAST_ALLOCATED, MOST_ALLOCATED]),
)
def test_node_score_equals_twin_on_huge_quantities(
    alloc: int, used: int, req: int, strategy: int
) -> None:
    args = (ints(alloc, 5), ints(used, 1), ints(req, 1), ints(1, 1), np.array([False, True]))
    shape = (ints(0, 40, 100), ints(100, 20, 70))
    assert kernels.node_score(*args, *shape, strategy) == reference.node_score(
        *args, *shape, strategy
    )


@PROPERTY
@given(clusters())
def test_place_equals_twin(c: Cluster) -> None:
    problem = c.problem()
    fast, slow = problem.copy(), problem.copy()
    assert solve(kernels, fast) == solve(reference, slow)
    assert np.array_equal(fast.used, slow.used)
    assert np.array_equal(fast.reqs, slow.reqs)


@PROPERTY
@given(clusters())
def test_place_invariants(c: Cluster) -> None:
    after = c.copy()
    placed, out = after.place(kernels)
    m_count = len(out)

    assert placed == sum(1 for n in out if n >= 0)
    # All or nothing for the gang's core; nothing at all when the core cannot be whole.
    if c.min_count > m_count or any(n < 0 for n in out[: c.min_count]):
        assert placed == 0 and all(n == -1 for n in out)
        assert np.array_equal(after.used, c.used)
    # Each member lands on a node its signature allows; used grows by exactly what landed.
    expected = c.used.copy()
    for m, n in enumerate(out):
        if n >= 0:
            assert c.masks[c.sig[m], n]
            expected[n] += c.reqs[m]
    assert np.array_equal(after.used, expected)
    # No node over-committed by this call: a column that changed is within allocatable.
    changed = after.used != c.used
    assert np.all(after.used[changed] <= c.alloc[changed])


@PROPERTY
@given(clusters())
def test_insufficient_counts_equals_twin(c: Cluster) -> None:
    mask = c.masks[0]
    req = c.reqs[0] if len(c.reqs) else np.ones(c.alloc.shape[1], dtype=np.int64)
    fast = kernels.insufficient_counts(c.alloc, c.used, req, mask)
    slow = reference.insufficient_counts(c.alloc, c.used, req, mask)
    assert fast.tolist() == slow.tolist()
    for r, count in enumerate(fast.tolist()):
        lacking = [
            n
            for n in range(len(mask))
            if mask[n] and req[r] > 0 and c.used[n, r] + req[r] > c.alloc[n, r]
        ]
        assert count == len(lacking)
