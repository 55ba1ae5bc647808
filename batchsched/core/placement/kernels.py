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

Callers hand a :class:`~batchsched.core.placement.problem.PlacementProblem` to :func:`place`,
the one function that spells it out into :func:`place_members` (or
:func:`place_members_cached`); the jitted kernels keep their positional arguments, which
numba compiles and dispatches on. Every kernel has a plain-Python twin of the same name in
:mod:`batchsched.core.placement.reference` (``place`` too); the property tests hold them equal. Arrays must be C-contiguous with the dtypes above, or
numba compiles (and caches) another specialisation. Call :func:`warm_up` before the
scheduler reports ready so no cycle pays for compilation.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from batchsched.core.placement import cards as D
from batchsched.core.placement.problem import PlacementProblem
from batchsched.core.placement.scoring import (
    LEAST_ALLOCATED,
    MAX_NODE_SCORE,
    MOST_ALLOCATED,
    RTCR,
    BoolArray,
    IntArray,
    ScoringConfig,
)
from batchsched.core.placement.views import NodeViews

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


# -- GPU cards: the fit card by card and the card policies. They live in this module with
# place_members, which inlines them: numba's cache keys compiled code by its own module's
# source only, so a caller in another module would keep running an old copy of them.
# Twins of the same names: reference.card_place, frag, asks_cards, bestfit_key, ...

_FULL = 1000
_PRIME = 2147483647
_D_SCOPE_ALL = D.SCOPE_ALL
_D_GPU = D.GPU
_D_ANY = D.ANY
_D_ASK_WHOLE = D.ASK_WHOLE
_D_ASK_ANY = D.ASK_ANY
_D_CPU = D.CPU
_D_SEED = D.SEED
_D_BAND = D.BAND
_D_CPU_SHORT = D.CPU_SHORT
_BAND_SHIFT = D.BAND_SHIFT
_USED_SCALE = D.USED_SCALE
_FRAGMENTATION = D.FRAGMENTATION
_BINPACK = D.BINPACK
_SPREAD = D.SPREAD
_BESTFIT = D.BESTFIT
_BESTFIT_CPU = D.BESTFIT_CPU
_BESTFIT_GPU = D.BESTFIT_GPU
_BESTFIT_SCALE = D.BESTFIT_SCALE
_DOTPRODUCT = D.DOTPRODUCT
_DOT_GPU = D.DOT_GPU
_DOT_DIVISOR = D.DOT_DIVISOR


@njit(cache=True, nogil=True, inline="always")
def card_hash(seed: int, member: int, node: int, card: int) -> int:
    h = (seed % _PRIME * 1000003 + member * 7919 + node * 104729 + card * 31) % _PRIME
    return h * 48271 % _PRIME


@njit(cache=True, nogil=True)
def asks_cards(req: IntArray, device: IntArray) -> bool:
    k = device[_D_N_SHARES]
    if device[_D_N_CARDS] == 0 and device[_D_ASK_ANY] < 0:
        return False
    for col in (device[_D_ASK_WHOLE], device[_D_ASK_ANY]):
        if col >= 0 and req[col] > 0:
            return True
    for j in range(2 * k):
        col = device[_D_HEAD + j]
        if col >= 0 and req[col] > 0:
            return True
    return False


@njit(cache=True, nogil=True)
def uses_policy(req: IntArray, device: IntArray) -> bool:
    if device[_D_SCOPE_ALL] != 0:
        return True
    k = device[_D_N_SHARES]
    for j in range(2 * k):
        col = device[_D_HEAD + j]
        if col >= 0 and req[col] > 0:
            return True
    return False


@njit(cache=True, nogil=True)
def frag(comp: IntArray, mem: IntArray, exists: BoolArray, n_cards: int, held_any: int,
          cpu_free: int, device: IntArray, free: IntArray) -> int:
    """reference.frag over reference._free_list; ``free`` is scratch of n_cards."""
    left = held_any
    whole_free = 0
    n = 0
    total = 0
    for i in range(n_cards):
        if not exists[i]:
            continue
        if comp[i] == 0 and mem[i] == 0:
            if left > 0:
                left -= 1
                free[n] = 0
            else:
                whole_free += 1
                free[n] = _FULL
        elif comp[i] > 0:
            free[n] = _FULL - comp[i]
        else:
            free[n] = _FULL - 1
        total += free[n]
        n += 1
    k = device[_D_N_SHARES]
    start = _D_HEAD + 3 * k + 2 * n_cards
    out = 0
    for t in range(device[_D_N_MIX]):
        weight = device[start + 4 * t]
        cpu = device[start + 4 * t + 1]
        whole = device[start + 4 * t + 2]
        share = device[start + 4 * t + 3]
        if cpu_free < cpu or (whole == 0 and share == 0):
            lost = total
        elif whole == 0:
            lost = 0
            room = False
            pods = 0
            for j in range(n):
                if free[j] >= share:
                    room = True
                    pods += free[j] // share
                else:
                    lost += free[j]
            if not room:
                lost = total
            else:
                lost += cpu_short(pods, share, cpu_free, cpu, device)
        else:
            if whole_free >= whole:
                lost = 0
                for j in range(n):
                    if free[j] < _FULL:
                        lost += free[j]
            else:
                lost = total
        out += weight * lost
    return out


@njit(cache=True, nogil=True, inline="always")
def cpu_short(pods: int, share: int, cpu_free: int, cpu: int, device: IntArray) -> int:
    """The kernel twin of reference.cpu_short."""
    if cpu <= 0 or pods * cpu <= cpu_free:
        return 0
    return int((pods - cpu_free // cpu) * share * device[_D_CPU_SHORT] // 100)


@njit(cache=True, nogil=True, inline="always")
def card_free(comp: int, mem: int) -> int:
    """A card's free compute as the fragmentation measure counts it (not wholly free)."""
    if comp > 0:
        return _FULL - comp
    return _FULL - 1 if mem > 0 else _FULL


@njit(cache=True, nogil=True)
def frag_prepare(comp: IntArray, mem: IntArray, exists: BoolArray, n_cards: int, held_any: int,
                  device: IntArray, free: IntArray, sum_lt: IntArray, cnt_ge: IntArray) -> tuple[int, int, int]:
    """The aggregates :func:`frag_swap` updates: ``(total free, wholly free cards, free on
    cards not wholly free)``, and per mix kind the free below its share and the cards with
    at least its share. Same card list as :func:`frag`."""
    left = held_any
    whole_free = 0
    n = 0
    total = 0
    for i in range(n_cards):
        if not exists[i]:
            continue
        if comp[i] == 0 and mem[i] == 0:
            if left > 0:
                left -= 1
                free[n] = 0
            else:
                whole_free += 1
                free[n] = _FULL
        else:
            free[n] = card_free(comp[i], mem[i])
        total += free[n]
        n += 1
    partial = 0
    for j in range(n):
        if free[j] < _FULL:
            partial += free[j]
    k = device[_D_N_SHARES]
    start = _D_HEAD + 3 * k + 2 * n_cards
    n_mix = device[_D_N_MIX]
    for t in range(n_mix):
        share = device[start + 4 * t + 3]
        below = 0
        at_least = 0
        pods = 0
        for j in range(n):
            if free[j] >= share:
                at_least += 1
                if share > 0:
                    pods += free[j] // share
            else:
                below += free[j]
        sum_lt[t] = below
        cnt_ge[t] = at_least
        cnt_ge[n_mix + t] = pods
    return total, whole_free, partial


@njit(cache=True, nogil=True, inline="always")
def frag_swap(x_old: int, x_new: int, total: int, whole_free: int, partial: int, cpu_free: int,
               n_cards: int, device: IntArray, sum_lt: IntArray, cnt_ge: IntArray) -> int:
    """:func:`frag` of the card list :func:`frag_prepare` saw with one card's free compute
    changed from ``x_old`` to ``x_new``, in O(mix kinds)."""
    total2 = total - x_old + x_new
    whole2 = whole_free - (1 if x_old == _FULL else 0) + (1 if x_new == _FULL else 0)
    partial2 = partial - (x_old if x_old < _FULL else 0) + (x_new if x_new < _FULL else 0)
    k = device[_D_N_SHARES]
    start = _D_HEAD + 3 * k + 2 * n_cards
    n_mix = device[_D_N_MIX]
    out = 0
    for t in range(n_mix):
        weight = device[start + 4 * t]
        cpu = device[start + 4 * t + 1]
        whole = device[start + 4 * t + 2]
        share = device[start + 4 * t + 3]
        if cpu_free < cpu or (whole == 0 and share == 0):
            lost = total2
        elif whole == 0:
            below = sum_lt[t] - (x_old if x_old < share else 0) + (x_new if x_new < share else 0)
            at_least = cnt_ge[t] - (1 if x_old >= share else 0) + (1 if x_new >= share else 0)
            if at_least > 0:
                pods = (cnt_ge[n_mix + t] - (x_old // share if x_old >= share else 0)
                        + (x_new // share if x_new >= share else 0))
                lost = below + cpu_short(pods, share, cpu_free, cpu, device)
            else:
                lost = total2
        else:
            lost = partial2 if whole2 >= whole else total2
        out += weight * lost
    return out


@njit(cache=True, nogil=True, inline="always")
def load_cards(alloc_row: IntArray, used_row: IntArray, device: IntArray, comp: IntArray,
               mem: IntArray, exists: BoolArray) -> int:
    """Each card's compute and memory used, and whether it exists, into comp/mem/exists;
    returns how many existing cards are wholly free (no compute, no memory used)."""
    n_cards = device[_D_N_CARDS]
    cc0 = _D_HEAD + 3 * device[_D_N_SHARES]
    n_free = 0
    for i in range(n_cards):
        comp[i] = used_row[device[cc0 + i]]
        mcol = device[cc0 + n_cards + i]
        mem[i] = used_row[mcol] if mcol >= 0 else 0
        exists[i] = alloc_row[device[cc0 + i]] > 0
        if exists[i] and comp[i] == 0 and mem[i] == 0:
            n_free += 1
    return n_free


@njit(cache=True, nogil=True, inline="always")
def card_place(alloc_row: IntArray, used_row: IntArray, req: IntArray, device: IntArray,
                member: int, node: int, uses_policy: bool, comp: IntArray, mem: IntArray,
                exists: BoolArray, free: IntArray, add_card: IntArray, add_comp: IntArray,
                add_mem: IntArray, share_cards: IntArray, sum_lt: IntArray,
                cnt_ge: IntArray) -> tuple[bool, int, int, int]:
    """The kernel twin of reference.card_place: ``(fits, key, number of adds, whole mask)``;
    the adds go to add_card/add_comp/add_mem, each share slot's card + 1 to share_cards."""
    k = device[_D_N_SHARES]
    n_cards = device[_D_N_CARDS]
    pcol = device[_D_ASK_POLICY]
    policy = device[_D_POLICY]
    if pcol >= 0 and req[pcol] > 0:
        policy = req[pcol]
    cm0 = _D_HEAD + 3 * k + n_cards
    n_free = load_cards(alloc_row, used_row, device, comp, mem, exists)
    held_any = used_row[device[_D_ANY]] if device[_D_ANY] >= 0 else 0
    spare = n_free - held_any
    want_any = req[device[_D_ASK_ANY]] if device[_D_ASK_ANY] >= 0 else 0
    want_whole = req[device[_D_ASK_WHOLE]] if device[_D_ASK_WHOLE] >= 0 else 0
    if spare < want_any + want_whole:
        return False, 0, 0, 0
    cpu = device[_D_CPU]
    cpu_free = alloc_row[cpu] - used_row[cpu] if cpu >= 0 else 2**62
    cpu_after = cpu_free - (req[cpu] if cpu >= 0 else 0)
    before = 0
    if policy == _FRAGMENTATION and uses_policy:
        before = frag(comp, mem, exists, n_cards, held_any, cpu_free, device, free)
    n_adds = 0
    mask = 0
    taken = 0
    for i in range(n_cards):
        if taken == want_whole:
            break
        if exists[i] and comp[i] == 0 and mem[i] == 0:
            comp[i] = _FULL
            mask |= 1 << i
            add_card[n_adds] = i
            add_comp[n_adds] = _FULL
            add_mem[n_adds] = 0
            n_adds += 1
            taken += 1
    spare -= want_whole + want_any
    any_after = held_any + want_any
    chosen_sum = 0
    for j in range(k):
        share_cards[j] = 0
        scol = device[_D_HEAD + j]
        mcol = device[_D_HEAD + k + j]
        s = req[scol] if scol >= 0 else 0
        m = req[mcol] if mcol >= 0 else 0
        if s == 0 and m == 0:
            continue
        best = -1
        best_val = 0
        if policy == _FRAGMENTATION:
            f_total, f_whole, f_partial = frag_prepare(
                comp, mem, exists, n_cards, any_after, device, free, sum_lt, cnt_ge,
            )
        for i in range(n_cards):
            if not exists[i] or comp[i] >= _FULL or comp[i] + s > _FULL:
                continue
            if m > 0:
                capcol = device[cm0 + i]
                cap = alloc_row[capcol] if capcol >= 0 else 0
                if mem[i] + m > cap:
                    continue
            if comp[i] == 0 and mem[i] == 0 and spare < 1:
                continue
            if policy in (_BINPACK, _BESTFIT, _DOTPRODUCT):
                val = comp[i]
            elif policy == _SPREAD:
                val = -comp[i]
            elif policy == _RANDOM:
                val = card_hash(device[_D_SEED], member, node, i)
            else:
                # taking a wholly free card turns one free card of the list into a share
                x_old = _FULL if comp[i] == 0 and mem[i] == 0 else card_free(comp[i], mem[i])
                val = -frag_swap(x_old, card_free(comp[i] + s, mem[i] + m), f_total, f_whole,
                                  f_partial, cpu_after, n_cards, device, sum_lt, cnt_ge)
            if best < 0 or val > best_val:
                best = i
                best_val = val
        if best < 0:
            return False, 0, 0, 0
        if comp[best] == 0 and mem[best] == 0:
            spare -= 1
        comp[best] += s
        mem[best] += m
        add_card[n_adds] = best
        add_comp[n_adds] = s
        add_mem[n_adds] = m
        n_adds += 1
        share_cards[j] = best + 1
        chosen_sum += comp[best]
    key = 0
    if uses_policy:
        gcol = device[_D_GPU]
        gpu_after = used_row[gcol] + req[gcol] if gcol >= 0 else 0
        if policy == _BINPACK:
            key = chosen_sum * 65536 + gpu_after
        elif policy == _SPREAD:
            key = -(chosen_sum * 65536 + gpu_after)
        elif policy == _RANDOM:
            key = card_hash(device[_D_SEED], member, node, n_cards)
        elif policy == _BESTFIT:
            key = bestfit_key(alloc_row, used_row, req, device)
        elif policy == _DOTPRODUCT:
            key = dotproduct_key(alloc_row, used_row, req, device)
        else:
            key = banded(before - frag(comp, mem, exists, n_cards, any_after, cpu_after, device, free),
                         alloc_row, used_row, req, device)
    return True, key, n_adds, mask


@njit(cache=True, nogil=True, inline="always")
def banded(change: int, alloc_row: IntArray, used_row: IntArray, req: IntArray, device: IntArray) -> int:
    """The kernel twin of reference.banded."""
    width = device[_D_BAND]
    if width <= 0:
        return change
    return int((change + width // 2) // width * _BAND_SHIFT + most_used(alloc_row, used_row, req, device))


@njit(cache=True, nogil=True, inline="always")
def most_used(alloc_row: IntArray, used_row: IntArray, req: IntArray, device: IntArray) -> int:
    """The kernel twin of reference.most_used."""
    gcol = device[_D_GPU]
    if gcol < 0 or alloc_row[gcol] <= 0:
        return 0
    after = min(max(used_row[gcol] + req[gcol], 0), alloc_row[gcol])
    return int(after * _USED_SCALE // alloc_row[gcol])


@njit(cache=True, nogil=True, inline="always")
def bestfit_key(alloc_row: IntArray, used_row: IntArray, req: IntArray, device: IntArray) -> int:
    """The kernel twin of reference.bestfit_key."""
    cpu = device[_D_CPU]
    gpu = device[_D_GPU]
    cpu_left = alloc_row[cpu] - used_row[cpu] - req[cpu] if cpu >= 0 else 0
    gpu_left = alloc_row[gpu] - used_row[gpu] - req[gpu] if gpu >= 0 else 0
    return -(cpu_left * _BESTFIT_SCALE // _BESTFIT_CPU + gpu_left * _BESTFIT_SCALE // _BESTFIT_GPU)


@njit(cache=True, nogil=True, inline="always")
def dotproduct_key(alloc_row: IntArray, used_row: IntArray, req: IntArray, device: IntArray) -> int:
    """The kernel twin of reference.dotproduct_key."""
    cpu = device[_D_CPU]
    gpu = device[_D_GPU]
    cpu_free = alloc_row[cpu] - used_row[cpu] if cpu >= 0 else 0
    gpu_free = alloc_row[gpu] - used_row[gpu] if gpu >= 0 else 0
    dot = cpu_free * (req[cpu] if cpu >= 0 else 0) + _DOT_GPU * gpu_free * (req[gpu] if gpu >= 0 else 0)
    return (-dot) // _DOT_DIVISOR


@njit(cache=True, nogil=True)
def cpu_fragments(req: IntArray, device: IntArray) -> bool:
    cpu = device[_D_CPU]
    policy = device[_D_POLICY]
    return bool(device[_D_SCOPE_ALL] != 0 and policy in (_FRAGMENTATION, _BESTFIT, _DOTPRODUCT)
                and device[_D_N_CARDS] > 0 and cpu >= 0 and req[cpu] > 0)


@njit(cache=True, nogil=True, inline="always")
def cpu_frag_key(alloc_row: IntArray, used_row: IntArray, req: IntArray, device: IntArray,
                  comp: IntArray, mem: IntArray, exists: BoolArray, free: IntArray) -> int:
    """The kernel twin of reference.cpu_frag_key."""
    if device[_D_POLICY] == _BESTFIT:
        return bestfit_key(alloc_row, used_row, req, device)
    if device[_D_POLICY] == _DOTPRODUCT:
        return dotproduct_key(alloc_row, used_row, req, device)
    n_cards = device[_D_N_CARDS]
    load_cards(alloc_row, used_row, device, comp, mem, exists)
    held_any = used_row[device[_D_ANY]] if device[_D_ANY] >= 0 else 0
    cpu = device[_D_CPU]
    cpu_free = alloc_row[cpu] - used_row[cpu]
    before = frag(comp, mem, exists, n_cards, held_any, cpu_free, device, free)
    change = before - frag(comp, mem, exists, n_cards, held_any, cpu_free - req[cpu], device, free)
    return banded(change, alloc_row, used_row, req, device)


@njit(cache=True, nogil=True)
def card_output_columns(device: IntArray, is_out: BoolArray) -> None:
    """Mark the columns the kernel writes into a member's row (usage and outputs)."""
    k = device[_D_N_SHARES]
    n_cards = device[_D_N_CARDS]
    if n_cards == 0:
        return
    for j in range(k):
        col = device[_D_HEAD + 2 * k + j]
        if col >= 0:
            is_out[col] = True
    for i in range(2 * n_cards):
        col = device[_D_HEAD + 3 * k + i]
        if col >= 0:
            is_out[col] = True
    if device[_D_OUT_WHOLE] >= 0:
        is_out[device[_D_OUT_WHOLE]] = True


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


# ``_place`` and ``card_place`` are long on purpose: split into njit helpers along their
# phases (filter, score, choose, commit; card fit, policy, commit), the first compile took
# 36 s instead of 20 s and the random card policy ran 60% slower, inlined or not. Their
# twins in reference.py are split into those phases, and read as the kernels' outline.
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
    cnt_ge = np.zeros(max(2 * device[_D_N_MIX], 1), dtype=np.int64)
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


def place(
    problem: PlacementProblem, out: IntArray, /, *, views: NodeViews | None = None,
    kinds: IntArray | None = None,
) -> int:
    """Solve ``problem`` with the kernel: the one place its arguments are spelled out.

    With ``views`` (and ``kinds``, each member's row of them: :meth:`NodeViews.kinds`), the
    kinds' views of the nodes carry over from the previous call
    (:func:`place_members_cached`); else :func:`place_members` looks at every node. Only
    unpacks: the loops are the kernels'.
    """
    p, s = problem, problem.scoring
    if views is None:
        return int(place_members(
            p.alloc, p.used, p.reqs, p.sig, p.masks, p.static, s.weights, s.scalar, s.shape_u,
            s.shape_s, s.strategy, p.min_count, out, s.device,
        ))
    if kinds is None:
        raise ValueError("the views need each member's kind")
    return int(place_members_cached(
        p.alloc, p.used, p.reqs, p.sig, p.masks, p.static, s.weights, s.scalar, s.shape_u,
        s.shape_s, s.strategy, p.min_count, out, s.device, kinds, views.total, views.ok,
        views.stamp, views.version,
    ))


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
    """Compile (or load from numba's cache) every kernel the scheduler calls; returns the
    seconds it took.

    Uses the dtypes and layouts the scheduler passes, so later calls find the
    specialisation ready (tests/unit/test_warm_up.py holds that no cycle compiles another).
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
    problem = PlacementProblem(alloc, used, reqs, sig, masks, static_score, arrays, 2)
    place(problem, out)
    # the cycle's single pods: the kernel keeping each kind's view of the nodes
    # (NodeViews: row 0 for both members, row 1 scratch)
    place(problem, out, views=NodeViews(2, kinds=1), kinds=np.zeros(2, dtype=np.int64))
    insufficient_counts(alloc, used, reqs[0], masks[0])
    return time.perf_counter() - started
