"""The placement kernels: numba-compiled loops over the snapshot's integer arrays.

Layout and units. Resources are the columns of every array, in one order fixed by the
snapshot: cpu in milli-CPU, memory and ephemeral-storage in bytes, ``pods`` and extended
resources (``nvidia.com/gpu``, ...) as counts. All quantities are non-negative ``int64``.

- ``alloc[N, R]``, ``used[N, R]``: each node's allocatable and what is already requested on
  it (for cpu and memory, the caller counts pods without requests the way kube-scheduler's
  ``NonZeroRequested`` does, if it wants its scores).
- ``req[R]`` / ``reqs[M, R]``: what one pod / each of M gang members asks for.
- ``sig[M]``: per member, a row of ``masks[S, N]`` (may the member go on node n: affinity,
  taints, ... already evaluated) and of ``static_score[S, N]`` (other score plugins, added to
  the resource score). Members with the same constraints share a signature.
- ``weights[R]``, ``scalar[R]``, ``shape_u[K]``, ``shape_s[K]``, ``strategy``: the scoring
  strategy from :meth:`batchsched.core.placement.scoring.ScoringConfig.arrays`.

Scores follow kube-scheduler's NodeResourcesFit strategies exactly, in integer arithmetic
(RequestedToCapacityRatio, LeastAllocated, MostAllocated; 0..100 per node).

Every kernel has a plain-Python twin of the same name in :mod:`batchsched.core.placement.reference`;
the property tests hold them equal. Arrays must be C-contiguous with the dtypes above, or
numba compiles (and caches) another specialisation. Call :func:`warm_up` before the
scheduler reports ready so no cycle pays for compilation.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from batchsched.core.placement.scoring import (
    LEAST_ALLOCATED,
    MAX_NODE_SCORE,
    MOST_ALLOCATED,
    RTCR,
    BoolArray,
    IntArray,
    ScoringConfig,
)

_MAX_UTILIZATION = 100
_DIRECT_LIMIT = np.iinfo(np.int64).max // MAX_NODE_SCORE
"""Above this, ``part * 100`` would overflow int64."""


# The helpers of the per-node score are inlined into their callers (numba IR): as calls,
# passing the arrays (reference counts included) cost more than the score itself.
@njit(cache=True, nogil=True, inline="always")
def _percent(part: int, whole: int) -> int:
    """``part * 100 // whole`` clamped to 0..100, exact even where the product overflows int64.

    ``whole`` must be positive.
    """
    if part <= 0:
        return 0
    if part >= whole:
        return MAX_NODE_SCORE
    if part <= _DIRECT_LIMIT:
        return part * MAX_NODE_SCORE // whole
    # Long multiplication: add ``part`` 100 times modulo ``whole``, counting the wraps.
    # rem < whole and part < whole, so comparing with ``whole - part`` never overflows.
    quotient = 0
    rem = 0
    gap = whole - part
    for _ in range(MAX_NODE_SCORE):
        if rem >= gap:
            rem -= gap
            quotient += 1
        else:
            rem += part
    return quotient


@njit(cache=True, nogil=True)
def _shape_score(p: int, shape_u: IntArray, shape_s: IntArray) -> int:
    """The broken-linear shape at utilization ``p``, with Go's truncating division."""
    k = shape_u.shape[0]
    if k == 0:
        return 0
    if p <= shape_u[0]:
        return int(shape_s[0])
    for i in range(1, k):
        if p <= shape_u[i]:
            rise = (shape_s[i] - shape_s[i - 1]) * (p - shape_u[i - 1])
            run = shape_u[i] - shape_u[i - 1]
            step = rise // run if rise >= 0 else -((-rise) // run)
            return int(shape_s[i - 1] + step)
    return int(shape_s[k - 1])


@njit(cache=True, nogil=True, inline="always")
def _utilization(requested: int, alloc: int) -> int:
    """RequestedToCapacityRatio's utilization: 100 for an over-committed resource."""
    if requested > alloc:
        return _MAX_UTILIZATION
    return _percent(requested, alloc)


@njit(cache=True, nogil=True)
def _shape_table(shape_u: IntArray, shape_s: IntArray) -> IntArray:
    """The shape at every utilization 0..100 (RTCR utilizations are whole percentages)."""
    table = np.empty(_MAX_UTILIZATION + 1, dtype=np.int64)
    for p in range(_MAX_UTILIZATION + 1):
        table[p] = _shape_score(p, shape_u, shape_s)
    return table


@njit(cache=True, nogil=True)
def _scored_columns(req: IntArray, weights: IntArray, scalar: BoolArray, into: IntArray) -> int:
    """Write the columns a pod asking ``req`` is scored on into ``into``; returns how many.

    Weighted columns, less the scalar resources the pod does not ask for.
    """
    count = 0
    for r in range(req.shape[0]):
        if weights[r] > 0 and not (scalar[r] and req[r] == 0):
            into[count] = r
            count += 1
    return count


@njit(cache=True, nogil=True, inline="always")
def _weighted_score(
    alloc_row: IntArray,
    used_row: IntArray,
    req: IntArray,
    scored: IntArray,
    n_scored: int,
    weights: IntArray,
    strategy: int,
    table: IntArray,
) -> int:
    """The node score over the columns ``scored[:n_scored]``; see :func:`node_score`."""
    total = 0
    weight_sum = 0
    for i in range(n_scored):
        r = scored[i]
        cap = alloc_row[r]
        if cap <= 0:
            continue
        requested = used_row[r] + req[r]
        if strategy == RTCR:
            score = table[_utilization(requested, cap)]
            if score <= 0:
                continue  # RTCR leaves resources scoring 0 out of the mean
        elif strategy == LEAST_ALLOCATED:
            score = 0 if requested > cap else _percent(cap - requested, cap)
        else:
            score = _percent(requested, cap)  # MostAllocated caps requested at capacity
        total += score * weights[r]
        weight_sum += weights[r]
    if weight_sum == 0:
        return 0
    if strategy == RTCR:
        # Go's math.Round(total / weight_sum): half away from zero, total >= 0.
        return (2 * total + weight_sum) // (2 * weight_sum)
    return total // weight_sum


@njit(cache=True, nogil=True)
def _check_strategy(strategy: int) -> None:
    if strategy != RTCR and strategy != LEAST_ALLOCATED and strategy != MOST_ALLOCATED:
        raise ValueError("unknown scoring strategy code")


@njit(cache=True, nogil=True)
def node_score(
    alloc_row: IntArray,
    used_row: IntArray,
    req: IntArray,
    weights: IntArray,
    scalar: BoolArray,
    shape_u: IntArray,
    shape_s: IntArray,
    strategy: int,
) -> int:
    """NodeResourcesFit's score (0..100) of one node for a pod asking ``req``.

    A resource r counts when ``weights[r] > 0``, ``alloc_row[r] > 0`` and, for a scalar
    resource, the pod asks for some of it. Its ``requested`` is ``used_row[r] + req[r]``.

    - RequestedToCapacityRatio (0): utilization ``requested * 100 // alloc`` (100 when over
      capacity) through the shape (scores already 0..100); resources scoring 0 are left out;
      the weighted mean is rounded half away from zero.
    - LeastAllocated (1): ``(alloc - requested) * 100 // alloc`` (0 when over capacity).
    - MostAllocated (2): ``requested * 100 // alloc``, requested capped at alloc.

    LeastAllocated and MostAllocated floor the weighted mean. 0 when no resource counts.
    Raises ValueError for another strategy code. Does not check that the pod fits.
    """
    _check_strategy(strategy)
    scored = np.empty(req.shape[0], dtype=np.int64)
    n_scored = _scored_columns(req, weights, scalar, scored)
    table = _shape_table(shape_u, shape_s)
    return _weighted_score(alloc_row, used_row, req, scored, n_scored, weights, strategy, table)


@njit(cache=True, nogil=True)
def fits(alloc_row: IntArray, used_row: IntArray, req: IntArray) -> bool:
    """Whether the pod fits: ``used_row[r] + req[r] <= alloc_row[r]`` for every requested r.

    Resources the pod does not ask for are not checked, even where the node is already
    over-committed (as kube-scheduler's Fit filter).
    """
    for r in range(req.shape[0]):
        if req[r] > 0 and used_row[r] + req[r] > alloc_row[r]:
            return False
    return True


@njit(cache=True, nogil=True)
def _check_place_shapes(
    alloc: IntArray,
    used: IntArray,
    reqs: IntArray,
    sig: IntArray,
    masks: BoolArray,
    static_score: IntArray,
    weights: IntArray,
    scalar: BoolArray,
    out: IntArray,
) -> None:
    # numba does not check bounds: a wrong shape would read or write outside the arrays.
    n_nodes, n_res = alloc.shape
    n_members = reqs.shape[0]
    if used.shape[0] != n_nodes or used.shape[1] != n_res:
        raise ValueError("used must have the shape of alloc")
    if reqs.shape[1] != n_res or weights.shape[0] != n_res or scalar.shape[0] != n_res:
        raise ValueError("reqs, weights and scalar must have one column per resource")
    if (
        masks.shape[1] != n_nodes
        or static_score.shape[0] != masks.shape[0]
        or static_score.shape[1] != n_nodes
    ):
        raise ValueError("masks and static_score must be [S, N]")
    if sig.shape[0] != n_members or out.shape[0] < n_members:
        raise ValueError("sig and out must have one entry per member")
    for m in range(n_members):
        if sig[m] < 0 or sig[m] >= masks.shape[0]:
            raise ValueError("sig holds a signature index outside masks")


@njit(cache=True, nogil=True)
def place_members(
    alloc: IntArray,
    used: IntArray,
    reqs: IntArray,
    sig: IntArray,
    masks: BoolArray,
    static_score: IntArray,
    weights: IntArray,
    scalar: BoolArray,
    shape_u: IntArray,
    shape_s: IntArray,
    strategy: int,
    min_count: int,
    out: IntArray,
) -> int:
    """Place members 0..M-1 in order, each on its best node; all-or-nothing for a gang's core.

    Member m may go on node n when ``masks[sig[m], n]`` and it :func:`fits` next to
    ``used[n]``; among those it takes the node with the highest
    ``node_score + static_score[sig[m], n]``, the lowest n on a tie, and ``reqs[m]`` is
    added to ``used[n]`` in place so later members see it. ``out[m]`` is the node, or -1.

    The first ``min_count`` members are the gang: if any of them finds no node, every
    placement of this call is undone (``used`` is restored exactly), ``out[:M]`` is -1 and
    the result is 0. The same happens at once when ``min_count > M``. Members from
    ``min_count`` on are best effort: one that finds no node gets -1 and the rest go on.

    Returns the number of members placed. Raises ValueError for inconsistent shapes, a
    ``sig`` outside ``masks`` or an unknown strategy, before touching anything.
    """
    _check_strategy(strategy)
    _check_place_shapes(alloc, used, reqs, sig, masks, static_score, weights, scalar, out)
    n_nodes, n_res = alloc.shape
    n_members = reqs.shape[0]
    for m in range(n_members):
        out[m] = -1
    if min_count > n_members:
        return 0

    table = _shape_table(shape_u, shape_s)
    asked = np.empty(n_res, dtype=np.int64)  # columns the member requests (checked by fit)
    scored = np.empty(n_res, dtype=np.int64)  # columns its score reads
    total = np.empty(n_nodes, dtype=np.int64)  # score + static score per node ...
    ok = np.empty(n_nodes, dtype=np.bool_)  # ... valid where the member may go and fits
    n_asked = 0
    n_scored = 0
    placed = 0
    prev = -1  # the member whose view total/ok hold, before its own placement
    # Members that found no node. Usage only grows during a call, so a later member with
    # the same signature asking at least as much of every resource cannot fit either.
    max_failed = 64
    failed = np.empty(max_failed, dtype=np.int64)
    n_failed = 0

    for m in range(n_members):
        s = sig[m]
        hopeless = False
        for i in range(n_failed):
            f = failed[i]
            if sig[f] != s:
                continue
            dominated = True
            for r in range(n_res):
                if reqs[m, r] < reqs[f, r]:
                    dominated = False
                    break
            if dominated:
                hopeless = True
                break
        if hopeless and m >= min_count:
            continue
        # A member identical to the previous one (same signature, same requests) sees the
        # same nodes, except the one the previous member was placed on: re-evaluate only it.
        same = prev >= 0 and sig[prev] == s
        if same:
            for r in range(n_res):
                if reqs[m, r] != reqs[prev, r]:
                    same = False
                    break
        if same:
            first = out[prev]
            last = first + 1 if first >= 0 else first
        else:
            n_asked = 0
            for r in range(n_res):
                if reqs[m, r] > 0:
                    asked[n_asked] = r
                    n_asked += 1
            n_scored = _scored_columns(reqs[m], weights, scalar, scored)
            first = 0
            last = n_nodes
        prev = m

        for n in range(first, last):
            if not masks[s, n]:
                ok[n] = False
                continue
            fit = True
            for i in range(n_asked):
                r = asked[i]
                if used[n, r] + reqs[m, r] > alloc[n, r]:
                    fit = False
                    break
            ok[n] = fit
            if not fit:
                continue
            fit_score = _weighted_score(
                alloc[n], used[n], reqs[m], scored, n_scored, weights, strategy, table
            )
            total[n] = fit_score + static_score[s, n]

        best = -1
        best_total = 0
        for n in range(n_nodes):
            if ok[n] and (best < 0 or total[n] > best_total):
                best = n
                best_total = total[n]

        if best < 0:
            if m < min_count:
                # The gang cannot be whole: give back everything placed so far.
                for k in range(m):
                    node = out[k]
                    if node >= 0:
                        for r in range(n_res):
                            used[node, r] -= reqs[k, r]
                for k in range(n_members):
                    out[k] = -1
                return 0
            if n_failed < max_failed:
                failed[n_failed] = m
                n_failed += 1
            continue
        for r in range(n_res):
            used[best, r] += reqs[m, r]
        out[m] = best
        placed += 1
    return placed


@njit(cache=True, nogil=True)
def insufficient_counts(
    alloc: IntArray, used: IntArray, req: IntArray, mask: BoolArray
) -> IntArray:
    """Per resource r, how many nodes with ``mask[n]`` lack room for ``req[r]``.

    A node counts for r when ``req[r] > 0`` and ``used[n, r] + req[r] > alloc[n, r]``; it
    can count for several resources. Explains an unschedulable pod ("3 Insufficient
    nvidia.com/gpu") the way kube-scheduler's Fit filter reports it.
    """
    n_nodes, n_res = alloc.shape
    if used.shape[0] != n_nodes or used.shape[1] != n_res:
        raise ValueError("used must have the shape of alloc")
    if req.shape[0] != n_res or mask.shape[0] != n_nodes:
        raise ValueError("req must be [R] and mask [N]")
    counts = np.zeros(n_res, dtype=np.int64)
    for n in range(n_nodes):
        if not mask[n]:
            continue
        for r in range(n_res):
            if req[r] > 0 and used[n, r] + req[r] > alloc[n, r]:
                counts[r] += 1
    return counts


def warm_up() -> float:
    """Compile (or load from numba's cache) every kernel; returns the seconds it took.

    Uses the dtypes and layouts the scheduler passes, so later calls find the
    specialisation ready.
    """
    started = time.perf_counter()
    columns = ("cpu", "memory", "pods", "nvidia.com/gpu")
    arrays = ScoringConfig().arrays(columns)
    alloc = np.array([[8000, 2**36, 110, 8], [4000, 2**35, 110, 0]], dtype=np.int64)
    used = np.zeros_like(alloc)
    reqs = np.array([[1000, 2**30, 1, 1], [500, 2**29, 1, 0]], dtype=np.int64)
    sig = np.zeros(2, dtype=np.int64)
    masks = np.ones((1, 2), dtype=np.bool_)
    static_score = np.zeros((1, 2), dtype=np.int64)
    out = np.empty(2, dtype=np.int64)
    node_score(
        alloc[0],
        used[0],
        reqs[0],
        arrays.weights,
        arrays.scalar,
        arrays.shape_u,
        arrays.shape_s,
        arrays.strategy,
    )
    fits(alloc[0], used[0], reqs[0])
    place_members(
        alloc,
        used,
        reqs,
        sig,
        masks,
        static_score,
        arrays.weights,
        arrays.scalar,
        arrays.shape_u,
        arrays.shape_s,
        arrays.strategy,
        2,
        out,
    )
    insufficient_counts(alloc, used, reqs[0], masks[0])
    return time.perf_counter() - started
