"""Plain-Python twins of the placement kernels in :mod:`batchsched.core.placement.kernels`.

Same names, signatures and results, written the obvious way: exact Python integers, every
node re-evaluated for every member, no caches. They are the specification the property
tests hold the numba kernels to, and a readable fallback when debugging a placement; they
are far too slow for a real cluster.

See :mod:`batchsched.core.placement.kernels` for the argument layout and units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batchsched.core.placement.scoring import (
    LEAST_ALLOCATED,
    MAX_NODE_SCORE,
    MOST_ALLOCATED,
    RTCR,
    BoolArray,
    IntArray,
)

MAX_UTILIZATION = 100


def _go_div(a: int, b: int) -> int:
    """``a / b`` for Go integers: the quotient truncated toward zero (Python's ``//`` floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _go_round(numerator: int, denominator: int) -> int:
    """``math.Round(numerator / denominator)`` for a positive denominator: halves away from 0."""
    q, r = divmod(abs(numerator), denominator)
    if 2 * r >= denominator:
        q += 1
    return q if numerator >= 0 else -q


def _shape_score(p: int, shape_u: list[int], shape_s: list[int]) -> int:
    """The broken-linear shape at utilization ``p`` (kube's ``BuildBrokenLinearFunction``)."""
    if not shape_u:
        return 0
    for i, u in enumerate(shape_u):
        if p <= u:
            if i == 0:
                return shape_s[0]
            rise = (shape_s[i] - shape_s[i - 1]) * (p - shape_u[i - 1])
            return shape_s[i - 1] + _go_div(rise, u - shape_u[i - 1])
    return shape_s[-1]


def _resource_score(
    requested: int, alloc: int, strategy: int, shape_u: list[int], shape_s: list[int]
) -> int:
    """One resource's score in 0..100 (for shapes with scores in 0..100)."""
    if strategy == LEAST_ALLOCATED:
        if requested > alloc:
            return 0
        return (alloc - requested) * MAX_NODE_SCORE // alloc
    if strategy == MOST_ALLOCATED:
        # kube-scheduler caps requested at capacity here (pods without requests are counted
        # with default requests, so a node can look over-committed).
        return min(requested, alloc) * MAX_NODE_SCORE // alloc
    if requested > alloc:
        return _shape_score(MAX_UTILIZATION, shape_u, shape_s)
    return _shape_score(max(requested, 0) * MAX_UTILIZATION // alloc, shape_u, shape_s)


def _check_strategy(strategy: int) -> None:
    if strategy not in (RTCR, LEAST_ALLOCATED, MOST_ALLOCATED):
        raise ValueError("unknown scoring strategy code")


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def _score(
    alloc_row: Sequence[int],
    used_row: Sequence[int],
    req: Sequence[int],
    weights: Sequence[int],
    scalar: Sequence[bool],
    shape_u: list[int],
    shape_s: list[int],
    strategy: int,
) -> int:
    total = 0
    weight_sum = 0
    for r, asked in enumerate(req):
        weight = weights[r]
        alloc = alloc_row[r]
        if weight <= 0 or alloc <= 0 or (scalar[r] and asked == 0):
            continue
        score = _resource_score(used_row[r] + asked, alloc, strategy, shape_u, shape_s)
        if strategy == RTCR and score <= 0:
            continue
        total += score * weight
        weight_sum += weight
    if weight_sum == 0:
        return 0
    if strategy == RTCR:
        return _go_round(total, weight_sum)
    return total // weight_sum


def _fits(alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int]) -> bool:
    return all(used_row[r] + asked <= alloc_row[r] for r, asked in enumerate(req) if asked > 0)


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
    """NodeResourcesFit's score (0..100) of one node for one pod; see the kernel."""
    _check_strategy(strategy)
    return _score(
        _ints(alloc_row),
        _ints(used_row),
        _ints(req),
        _ints(weights),
        [bool(v) for v in scalar],
        _ints(shape_u),
        _ints(shape_s),
        strategy,
    )


def fits(alloc_row: IntArray, used_row: IntArray, req: IntArray) -> bool:
    """Whether ``req`` fits next to ``used_row`` within ``alloc_row``; see the kernel."""
    return _fits(_ints(alloc_row), _ints(used_row), _ints(req))


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
    n_nodes, n_res = alloc.shape
    n_members = reqs.shape[0]
    if used.shape != (n_nodes, n_res):
        raise ValueError("used must have the shape of alloc")
    if reqs.shape[1] != n_res or weights.shape[0] != n_res or scalar.shape[0] != n_res:
        raise ValueError("reqs, weights and scalar must have one column per resource")
    if masks.shape[1] != n_nodes or static_score.shape != masks.shape:
        raise ValueError("masks and static_score must be [S, N]")
    if sig.shape[0] != n_members or out.shape[0] < n_members:
        raise ValueError("sig and out must have one entry per member")
    for m in range(n_members):
        if not 0 <= int(sig[m]) < masks.shape[0]:
            raise ValueError("sig holds a signature index outside masks")


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
    """Place members in order, each on its best fitting node, all-or-nothing for the first
    ``min_count``. Writes ``used`` and ``out``; see the kernel for the contract."""
    _check_strategy(strategy)
    _check_place_shapes(alloc, used, reqs, sig, masks, static_score, weights, scalar, out)
    n_members = reqs.shape[0]
    out[:n_members] = -1
    if min_count > n_members:
        return 0
    alloc_l: list[list[int]] = alloc.tolist()
    used_l: list[list[int]] = used.tolist()
    reqs_l: list[list[int]] = reqs.tolist()
    masks_l: list[list[bool]] = masks.tolist()
    static_l: list[list[int]] = static_score.tolist()
    weights_l, su, ss = _ints(weights), _ints(shape_u), _ints(shape_s)
    scalar_l = [bool(v) for v in scalar]
    placed: list[tuple[int, int]] = []
    for m, req in enumerate(reqs_l):
        s = int(sig[m])
        best = -1
        best_total = 0
        for n, alloc_row in enumerate(alloc_l):
            if not masks_l[s][n] or not _fits(alloc_row, used_l[n], req):
                continue
            total = static_l[s][n] + _score(
                alloc_row, used_l[n], req, weights_l, scalar_l, su, ss, strategy
            )
            if best < 0 or total > best_total:
                best, best_total = n, total
        if best < 0:
            if m < min_count:
                for k, n in reversed(placed):
                    used[n] -= reqs[k]
                out[:n_members] = -1
                return 0
            continue
        used_l[best] = [u + q for u, q in zip(used_l[best], req, strict=True)]
        used[best] += reqs[m]
        out[m] = best
        placed.append((m, best))
    return len(placed)


def insufficient_counts(
    alloc: IntArray, used: IntArray, req: IntArray, mask: BoolArray
) -> IntArray:
    """Per resource, how many masked-in nodes lack room for ``req``; see the kernel."""
    n_nodes, n_res = alloc.shape
    counts = np.zeros(n_res, dtype=np.int64)
    for n in range(n_nodes):
        if not mask[n]:
            continue
        for r in range(n_res):
            asked = int(req[r])
            if asked > 0 and int(used[n, r]) + asked > int(alloc[n, r]):
                counts[r] += 1
    return counts
