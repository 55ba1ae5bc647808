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

from batchsched.core.placement import cards as D
from batchsched.core.placement.cardkernels import (
    asks_cards,
    card_output_columns,
    card_place,
    cpu_frag_key,
    cpu_fragments,
    uses_policy,
)
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

# the device descriptor's slots and the card policies (batchsched.core.placement.cards)
_D_ASK_POLICY = D.ASK_POLICY
_D_HEAD = D.HEAD
_D_N_CARDS = D.N_CARDS
_D_N_MIX = D.N_MIX
_D_N_SHARES = D.N_SHARES
_D_OUT_WHOLE = D.OUT_WHOLE
_D_POLICY = D.POLICY
_KEY_SHIFT = D.KEY_SHIFT
#: kinds of member one kernel call keeps a view of the nodes for (see place_members)
_MAX_KINDS = 16
_RANDOM = D.RANDOM


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
    device: IntArray,
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

    GPU cards (``device``, see :mod:`batchsched.core.placement.cards`): a member that asks
    for cards must also fit card by card (:func:`card_place`); one whose shares are placed
    by a card policy takes the node with the highest ``key * KEY_SHIFT + static_score``
    instead of the resource score. The cards a placed member got are written into its row
    of ``reqs`` (card usage and output columns, cleared at the start of every call and when
    the gang is undone), so ``used`` gains them and an undo gives them back exactly.

    Returns the number of members placed. Raises ValueError for inconsistent shapes, a
    ``sig`` outside ``masks`` or an unknown strategy, before touching anything.
    """
    _check_strategy(strategy)
    _check_place_shapes(alloc, used, reqs, sig, masks, static_score, weights, scalar, out)
    n_nodes = alloc.shape[0]
    n_slots = min(_MAX_KINDS, reqs.shape[0]) + 1
    return _place(
        alloc, used, reqs, sig, masks, static_score, weights, scalar, shape_u, shape_s, strategy,
        min_count, out, device, np.empty(0, dtype=np.int64),
        np.empty((n_slots, n_nodes), dtype=np.int64), np.empty((n_slots, n_nodes), dtype=np.bool_),
        np.full((n_slots, n_nodes), -1, dtype=np.int64), np.zeros(n_nodes, dtype=np.int64),
    )


@njit(cache=True, nogil=True)
def place_members_cached(
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
    device: IntArray,
    kinds: IntArray,
    view_total: IntArray,
    view_ok: BoolArray,
    view_stamp: IntArray,
    version: IntArray,
) -> int:
    """:func:`place_members` keeping each kind's view of the nodes from one call to the next.

    ``kinds[m]``: the row of the views member m's kind owns (members with the same
    signature, requests and layout share one); the last row is scratch (the random policy,
    and members the caller gave -1). ``view_stamp[k, n]`` is the ``version[n]`` the view was
    taken at; the call bumps ``version[n]`` for each placement on n, and the caller must
    bump it for every other change of ``used[n]`` (and reset a row's stamps to -1 when it
    gives the row to another kind). Same results as :func:`place_members`.
    """
    _check_strategy(strategy)
    _check_place_shapes(alloc, used, reqs, sig, masks, static_score, weights, scalar, out)
    n_nodes = alloc.shape[0]
    if kinds.shape[0] != reqs.shape[0] or version.shape[0] != n_nodes:
        raise ValueError("kinds must have one entry per member and version one per node")
    if view_total.shape[1] != n_nodes or view_ok.shape != view_total.shape or view_stamp.shape != view_total.shape:
        raise ValueError("the views must be [K, N]")
    for m in range(kinds.shape[0]):
        if kinds[m] >= view_total.shape[0] - 1:
            raise ValueError("kinds holds a row outside the views (the last row is scratch)")
    return _place(
        alloc, used, reqs, sig, masks, static_score, weights, scalar, shape_u, shape_s, strategy,
        min_count, out, device, kinds, view_total, view_ok, view_stamp, version,
    )


@njit(cache=True, nogil=True)
def _place(
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
    device: IntArray,
    kinds: IntArray,
    kind_total: IntArray,
    kind_ok: BoolArray,
    kind_stamp: IntArray,
    version: IntArray,
) -> int:
    """The body of :func:`place_members` (``kinds`` empty: kinds found within the call) and
    :func:`place_members_cached`."""
    n_nodes, n_res = alloc.shape
    n_members = reqs.shape[0]
    for m in range(n_members):
        out[m] = -1
    is_out = np.zeros(n_res, dtype=np.bool_)
    card_output_columns(device, is_out)
    for r in range(n_res):
        if is_out[r]:
            for m in range(n_members):
                reqs[m, r] = 0
    if min_count > n_members:
        return 0
    n_cards = device[_D_N_CARDS]
    comp = np.zeros(max(n_cards, 1), dtype=np.int64)
    mem = np.zeros(max(n_cards, 1), dtype=np.int64)
    exists = np.zeros(max(n_cards, 1), dtype=np.bool_)
    free = np.zeros(max(n_cards, 1), dtype=np.int64)
    add_card = np.zeros(n_cards + 8, dtype=np.int64)
    add_comp = np.zeros(n_cards + 8, dtype=np.int64)
    add_mem = np.zeros(n_cards + 8, dtype=np.int64)
    share_cards = np.zeros(max(device[_D_N_SHARES], 1), dtype=np.int64)
    sum_lt = np.zeros(max(device[_D_N_MIX], 1), dtype=np.int64)
    cnt_ge = np.zeros(max(device[_D_N_MIX], 1), dtype=np.int64)
    cards = False
    policy = False

    table = _shape_table(shape_u, shape_s)
    asked = np.empty(n_res, dtype=np.int64)  # columns the member requests (checked by fit)
    scored = np.empty(n_res, dtype=np.int64)  # columns its score reads
    n_asked = 0
    n_scored = 0
    placed = 0
    # Members that ask alike (same signature, same requests) form a *kind*. Each kind keeps
    # its view of every node (valid? score + static score), stamped with the node's version;
    # a node's version grows when a member is placed on it. A member re-evaluates only the
    # nodes changed since its kind last looked: interleaved kinds of a mixed queue reuse
    # their views instead of rescanning every node.
    persistent = kinds.shape[0] > 0
    scratch = kind_total.shape[0] - 1  # the last row: views nobody keeps
    n_slots = scratch  # rows matched within this call when not persistent
    kind_rep = np.full(max(n_slots, 1), -1, dtype=np.int64)
    next_slot = 0
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
                if not is_out[r] and reqs[m, r] < reqs[f, r]:
                    dominated = False
                    break
            if dominated:
                hopeless = True
                break
        if hopeless and m >= min_count:
            continue
        n_asked = 0
        for r in range(n_res):
            if reqs[m, r] > 0:
                asked[n_asked] = r
                n_asked += 1
        n_scored = _scored_columns(reqs[m], weights, scalar, scored)
        cards = asks_cards(reqs[m], device)
        policy = cards and uses_policy(reqs[m], device)
        by_cpu = not cards and cpu_fragments(reqs[m], device)
        drawn = False  # the random policy draws per member: no view of it can be reused
        if policy:
            pcol = device[_D_ASK_POLICY]
            drawn = (reqs[m, pcol] if pcol >= 0 and reqs[m, pcol] > 0 else device[_D_POLICY]) == _RANDOM
        k = -1
        if persistent and not drawn:
            k = kinds[m] if kinds[m] >= 0 else scratch
            if k == scratch:
                for n in range(n_nodes):
                    kind_stamp[k, n] = -1
        elif drawn:
            k = scratch
            for n in range(n_nodes):
                kind_stamp[k, n] = -1
        else:
            for slot in range(n_slots):
                rep = kind_rep[slot]
                if rep < 0 or sig[rep] != s:
                    continue
                alike = True
                for r in range(n_res):
                    if not is_out[r] and reqs[m, r] != reqs[rep, r]:
                        alike = False
                        break
                if alike:
                    k = slot
                    break
        if k < 0:
            k = next_slot
            next_slot = (next_slot + 1) % n_slots
            kind_rep[k] = m
            for n in range(n_nodes):
                kind_stamp[k, n] = -1
        total = kind_total[k]
        ok = kind_ok[k]
        stamp = kind_stamp[k]

        for n in range(n_nodes):
            if stamp[n] == version[n]:
                continue
            stamp[n] = version[n]
            if not masks[s, n]:
                ok[n] = False
                continue
            fit = True
            for i in range(n_asked):
                r = asked[i]
                if used[n, r] + reqs[m, r] > alloc[n, r]:
                    fit = False
                    break
            if fit and cards:
                fit, key, _, _ = card_place(
                    alloc[n], used[n], reqs[m], device, m, n, policy, comp, mem, exists, free,
                    add_card, add_comp, add_mem, share_cards, sum_lt, cnt_ge,
                )
                if fit and policy:
                    ok[n] = True
                    total[n] = key * _KEY_SHIFT + static_score[s, n]
                    continue
            if fit and by_cpu:
                ok[n] = True
                key = cpu_frag_key(alloc[n], used[n], reqs[m], device, comp, mem, exists, free)
                total[n] = key * _KEY_SHIFT + static_score[s, n]
                continue
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
                        version[node] += 1
                for k in range(n_members):
                    out[k] = -1
                for r in range(n_res):
                    if is_out[r]:
                        for k in range(n_members):
                            reqs[k, r] = 0
                return 0
            if n_failed < max_failed:
                failed[n_failed] = m
                n_failed += 1
            continue
        if cards:
            again, _, n_adds, mask = card_place(
                alloc[best], used[best], reqs[m], device, m, best, policy, comp, mem, exists,
                free, add_card, add_comp, add_mem, share_cards, sum_lt, cnt_ge,
            )
            if not again:
                raise ValueError("the chosen node no longer fits the member's cards: a stale node view")
            k_shares = device[_D_N_SHARES]
            cc0 = _D_HEAD + 3 * k_shares
            for a in range(n_adds):
                i = add_card[a]
                reqs[m, device[cc0 + i]] += add_comp[a]
                if add_mem[a] > 0:
                    reqs[m, device[cc0 + n_cards + i]] += add_mem[a]
            if device[_D_OUT_WHOLE] >= 0:
                reqs[m, device[_D_OUT_WHOLE]] = mask
            for j in range(k_shares):
                col = device[_D_HEAD + 2 * k_shares + j]
                if col >= 0:
                    reqs[m, col] = share_cards[j]
        for r in range(n_res):
            used[best, r] += reqs[m, r]
        version[best] += 1
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
        D.no_cards(),
    )
    insufficient_counts(alloc, used, reqs[0], masks[0])
    return time.perf_counter() - started
