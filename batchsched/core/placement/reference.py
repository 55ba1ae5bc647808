"""Plain-Python twins of the placement kernels in :mod:`batchsched.core.placement.kernels`.

Same names, signatures and results (:func:`place` takes the same
:class:`~batchsched.core.placement.problem.PlacementProblem` as the kernel's), written the
obvious way: exact Python integers, every node re-evaluated for every member, no caches. They are the specification the property
tests hold the numba kernels to, and a readable fallback when debugging a placement; they
are far too slow for a real cluster.

See :mod:`batchsched.core.placement.kernels` for the argument layout and units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from batchsched.core.placement import cards as D
from batchsched.core.placement.problem import PlacementProblem
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


# -- cards ------------------------------------------------------------------------------------

FULL = 1000
_PRIME = 2147483647


def card_hash(seed: int, member: int, node: int, card: int) -> int:
    """The random policy's draw for a (member, node, card): a Lehmer step, below 2**31."""
    h = (seed % _PRIME * 1000003 + member * 7919 + node * 104729 + card * 31) % _PRIME
    return h * 48271 % _PRIME


def _card_cols(device: Sequence[int]) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    k, c = device[D.N_SHARES], device[D.N_CARDS]
    body = list(device[D.HEAD:])
    return body[:k], body[k:2 * k], body[2 * k:3 * k], body[3 * k:3 * k + c], body[3 * k + c:3 * k + 2 * c]


def _cards(alloc_row: Sequence[int], used_row: Sequence[int], device: Sequence[int]
           ) -> tuple[list[int], list[int], list[bool], int]:
    """Per card its compute and memory used and whether it exists; and the cards the node
    gives out by count."""
    _, _, _, cc, cm = _card_cols(device)
    n_cards = device[D.N_CARDS]
    comp = [used_row[cc[i]] for i in range(n_cards)]
    mem = [used_row[cm[i]] for i in range(n_cards)]
    exists = [alloc_row[cc[i]] > 0 for i in range(n_cards)]
    held_any = used_row[device[D.ANY]] if device[D.ANY] >= 0 else 0
    return comp, mem, exists, held_any


def _mix(device: Sequence[int]) -> list[tuple[int, int, int, int]]:
    k, c, t = device[D.N_SHARES], device[D.N_CARDS], device[D.N_MIX]
    start = D.HEAD + 3 * k + 2 * c
    return [tuple(device[start + 4 * i: start + 4 * i + 4]) for i in range(t)]  # type: ignore[misc]


def asks_cards(req: Sequence[int], device: Sequence[int]) -> bool:
    """Whether a member asks for cards at all."""
    if device[D.N_CARDS] == 0 and device[D.ASK_ANY] < 0:
        return False
    shares, mems, _, _, _ = _card_cols(device)
    cols = [device[D.ASK_WHOLE], device[D.ASK_ANY], *shares, *mems]
    return any(col >= 0 and req[col] > 0 for col in cols)


def frag(free: Sequence[int], whole_free: int, cpu_free: int, mix: Sequence[tuple[int, int, int, int]],
         short: int = 0) -> int:
    """A node's GPU fragmentation against the workload mix, in weight x milli: per kind of
    request, the free compute it cannot use, weighted by its share. All of it when the kind
    does not fit at all (too little CPU, no card with room, too few whole cards) and for a
    kind that asks no card, as the FGD paper counts it; else the free on cards too small for
    it, plus for a kind of share :func:`cpu_short` of what the CPU left cannot host."""
    total = sum(free)
    out = 0
    for weight, cpu, whole, share in mix:
        if cpu_free < cpu or (whole == 0 and share == 0):
            lost = total
        elif whole == 0:
            if any(x >= share for x in free):
                pods = sum(x // share for x in free if x >= share)
                lost = sum(x for x in free if x < share) + cpu_short(pods, share, cpu_free, cpu, short)
            else:
                lost = total
        else:
            lost = sum(x for x in free if x < FULL) if whole_free >= whole else total
        out += weight * lost
    return out


def cpu_short(pods: int, share: int, cpu_free: int, cpu: int, short: int) -> int:
    """Of the GPU ``pods`` shares of one kind could take on a node's cards, what the CPU left
    cannot host (each asks ``cpu``), as ``short`` % of it: GPU that stays idle once the CPU
    is gone. The FGD paper's measure (``short`` 0) only sees a node without CPU for one pod;
    a node whose cards would take eight such shares and whose CPU runs two strands the rest
    as surely, and the kernels place shares elsewhere while it can be helped."""
    if cpu <= 0 or pods * cpu <= cpu_free:
        return 0
    return (pods - cpu_free // cpu) * share * short // 100


def _free_list(comp: Sequence[int], mem: Sequence[int], exists: Sequence[bool], held_any: int) -> tuple[list[int], int]:
    """Free compute per card (cards given out by count are taken from the empty ones, in
    order; a card with memory used and no compute counts 999) and how many cards are
    wholly free."""
    free = []
    left = held_any
    whole_free = 0
    for x, y, e in zip(comp, mem, exists, strict=True):
        if not e:
            continue
        if x == 0 and y == 0:
            if left > 0:
                left -= 1
                free.append(0)
                continue
            whole_free += 1
            free.append(FULL)
        else:
            free.append(FULL - x if x > 0 else FULL - 1)
    return free, whole_free


def member_policy(req: Sequence[int], device: Sequence[int]) -> int:
    """The card policy of a member: the one it asks for, else the scheduler's."""
    pcol = device[D.ASK_POLICY]
    return req[pcol] if pcol >= 0 and req[pcol] > 0 else device[D.POLICY]


def card_place(
    alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int], device: Sequence[int],
    member: int, node: int, uses_policy: bool,
) -> tuple[bool, int, list[tuple[int, int, int]], int, list[int]]:
    """Whether member ``member`` (asking ``req``) fits node ``node`` card by card, and how.

    Returns ``(fits, key, adds, whole_mask, share_cards)``: the policy's key for the node
    (higher is better; 0 when ``uses_policy`` is false), the ``(card, compute, memory)``
    added, the recorded whole cards as a bit mask, and per share slot its card + 1.

    Rules: a card is wholly free with no compute and no memory used. ``ask-any`` cards are
    counted from the wholly free ones (the device plugin picks which); recorded whole cards
    are the lowest wholly free ones (:func:`take_whole_cards`). A share (compute s, memory m)
    fits a card with compute used below 1000 and ``used + s <= 1000``, and ``used memory + m``
    within the card's memory when m > 0; taking a wholly free card for a share needs a spare
    one. Shares go in slot order (:func:`place_shares`), each on the card the member's policy
    prefers (:func:`best_card`): fragmentation the least increase of :func:`frag`, binpack the
    fullest card, spread the emptiest, random a draw; ties to the lowest card. The node's
    key is :func:`policy_key`.
    """
    n_cards = device[D.N_CARDS]
    policy = member_policy(req, device)
    comp, mem, exists, held_any = _cards(alloc_row, used_row, device)
    n_free = sum(1 for i in range(n_cards) if exists[i] and comp[i] == 0 and mem[i] == 0)
    spare = n_free - held_any
    want_any = req[device[D.ASK_ANY]] if device[D.ASK_ANY] >= 0 else 0
    want_whole = req[device[D.ASK_WHOLE]] if device[D.ASK_WHOLE] >= 0 else 0
    if spare < want_any + want_whole:
        return False, 0, [], 0, []
    cpu = device[D.CPU]
    cpu_free = alloc_row[cpu] - used_row[cpu] if cpu >= 0 else 2**62
    cpu_after = cpu_free - (req[cpu] if cpu >= 0 else 0)
    before = 0
    if policy == D.FRAGMENTATION and uses_policy:
        free0, wf0 = _free_list(comp, mem, exists, held_any)
        before = frag(free0, wf0, cpu_free, _mix(device), device[D.CPU_SHORT])
    adds, mask = take_whole_cards(comp, mem, exists, want_whole)
    any_after = held_any + want_any
    shares = place_shares(alloc_row, req, device, member, node, policy, spare - want_whole - want_any,
                          any_after, cpu_after, comp, mem, exists)
    if shares is None:
        return False, 0, [], 0, []
    share_adds, share_cards, chosen_sum = shares
    key = 0
    if uses_policy:
        key = policy_key(alloc_row, used_row, req, device, member, node, policy, chosen_sum, before,
                         any_after, cpu_after, comp, mem, exists)
    return True, key, adds + share_adds, mask, share_cards


def take_whole_cards(comp: list[int], mem: Sequence[int], exists: Sequence[bool], want_whole: int
                     ) -> tuple[list[tuple[int, int, int]], int]:
    """Take the lowest ``want_whole`` wholly free cards (full compute each): the adds and the
    cards as a bit mask."""
    adds: list[tuple[int, int, int]] = []
    mask = 0
    for i in range(len(comp)):
        if len(adds) == want_whole:
            break
        if exists[i] and comp[i] == 0 and mem[i] == 0:
            comp[i] = FULL
            mask |= 1 << i
            adds.append((i, FULL, 0))
    return adds, mask


def place_shares(
    alloc_row: Sequence[int], req: Sequence[int], device: Sequence[int], member: int, node: int,
    policy: int, spare: int, any_after: int, cpu_after: int, comp: list[int], mem: list[int],
    exists: Sequence[bool],
) -> tuple[list[tuple[int, int, int]], list[int], int] | None:
    """Each share slot in order on the card :func:`best_card` ranks first, taken at once so
    the next slot sees it: the adds, per slot its card + 1, and the compute used on the
    chosen cards summed after each share (binpack's and spread's key); None when a slot
    finds no card."""
    shares, mems, _, _, _ = _card_cols(device)
    adds: list[tuple[int, int, int]] = []
    share_cards = [0] * len(shares)
    chosen_sum = 0
    for k in range(len(shares)):
        s = req[shares[k]] if shares[k] >= 0 else 0
        m = req[mems[k]] if mems[k] >= 0 else 0
        if s == 0 and m == 0:
            continue
        best = best_card(alloc_row, device, member, node, policy, s, m, spare, any_after, cpu_after,
                         comp, mem, exists)
        if best < 0:
            return None
        if comp[best] == 0 and mem[best] == 0:
            spare -= 1
        comp[best] += s
        mem[best] += m
        adds.append((best, s, m))
        share_cards[k] = best + 1
        chosen_sum += comp[best]
    return adds, share_cards, chosen_sum


def best_card(
    alloc_row: Sequence[int], device: Sequence[int], member: int, node: int, policy: int, s: int,
    m: int, spare: int, any_after: int, cpu_after: int, comp: list[int], mem: list[int],
    exists: Sequence[bool],
) -> int:
    """The card a share of compute ``s`` and memory ``m`` goes on under ``policy``, or -1:
    of the cards it fits (see :func:`card_place`), the one with the highest value, the
    lowest card on a tie. Fragmentation values a card by minus the node's :func:`frag` with
    the share on it."""
    _, _, _, _, cm = _card_cols(device)
    mix = _mix(device)
    best = -1
    best_val = 0
    for i in range(device[D.N_CARDS]):
        if not exists[i] or comp[i] >= FULL or comp[i] + s > FULL:
            continue
        if m > 0 and mem[i] + m > alloc_row[cm[i]]:
            continue
        empty = comp[i] == 0 and mem[i] == 0
        if empty and spare < 1:
            continue
        if policy in (D.BINPACK, D.BESTFIT, D.DOTPRODUCT):
            val = comp[i]
        elif policy == D.SPREAD:
            val = -comp[i]
        elif policy == D.RANDOM:
            val = card_hash(device[D.SEED], member, node, i)
        else:
            comp[i] += s
            mem[i] += m
            free1, wf1 = _free_list(comp, mem, exists, any_after)
            val = -frag(free1, wf1, cpu_after, mix, device[D.CPU_SHORT])
            comp[i] -= s
            mem[i] -= m
        if best < 0 or val > best_val:
            best, best_val = i, val
    return best


def policy_key(
    alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int], device: Sequence[int],
    member: int, node: int, policy: int, chosen_sum: int, before: int, any_after: int,
    cpu_after: int, comp: Sequence[int], mem: Sequence[int], exists: Sequence[bool],
) -> int:
    """The node's key under the member's policy once its cards are taken (higher is better):
    binpack the compute on its chosen cards then the GPUs used, spread the opposite, random
    a draw, bestfit :func:`bestfit_key`, fragmentation minus the increase of :func:`frag`
    from ``before``."""
    gpu_after = used_row[device[D.GPU]] + req[device[D.GPU]] if device[D.GPU] >= 0 else 0
    if policy == D.BINPACK:
        return chosen_sum * 65536 + gpu_after
    if policy == D.SPREAD:
        return -(chosen_sum * 65536 + gpu_after)
    if policy == D.RANDOM:
        return card_hash(device[D.SEED], member, node, device[D.N_CARDS])
    if policy == D.BESTFIT:
        return bestfit_key(alloc_row, used_row, req, device)
    if policy == D.DOTPRODUCT:
        return dotproduct_key(alloc_row, used_row, req, device)
    free1, wf1 = _free_list(comp, mem, exists, any_after)
    return banded(before - frag(free1, wf1, cpu_after, _mix(device), device[D.CPU_SHORT]), alloc_row, used_row,
                  req, device)


def banded(change: int, alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int], device: Sequence[int]) -> int:
    """The fragmentation key of a node from the ``change`` of its :func:`frag` (before minus
    after, higher is better). With a band width B (``device[BAND]``: ``gpuSharing.band``
    milli-GPU times the mix's weights), the change is rounded to the nearest multiple of B,
    so nodes whose changes differ by less than about B rank alike, and among those the
    :func:`most_used` goes first (then the lowest node). Ranking by the exact change spreads
    pods over nodes that differ by a few milli-GPU of fragmentation; the FGD paper's score,
    whole points of a sigmoid (about 40 milli-GPU each near no change), packs. B = 0: the
    exact change."""
    width = device[D.BAND]
    if width <= 0:
        return change
    return (change + width // 2) // width * D.BAND_SHIFT + most_used(alloc_row, used_row, req, device)


def most_used(alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int], device: Sequence[int]) -> int:
    """How much of a node's GPU is in use once the member is placed there, in
    1/USED_SCALE of its GPU: inside a fragmentation band the fullest node goes first, so
    work packs onto nodes already in use and whole nodes stay free."""
    gcol = device[D.GPU]
    if gcol < 0 or alloc_row[gcol] <= 0:
        return 0
    after = min(max(used_row[gcol] + req[gcol], 0), alloc_row[gcol])
    return after * D.USED_SCALE // alloc_row[gcol]


def bestfit_key(alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int], device: Sequence[int]) -> int:
    """Minus BestFit's score: half the node's CPU and half its GPU left once ``req`` is
    placed, each over the paper's largest node (lower left is better)."""
    cpu, gpu = device[D.CPU], device[D.GPU]
    cpu_left = alloc_row[cpu] - used_row[cpu] - req[cpu] if cpu >= 0 else 0
    gpu_left = alloc_row[gpu] - used_row[gpu] - req[gpu] if gpu >= 0 else 0
    return -(cpu_left * D.BESTFIT_SCALE // D.BESTFIT_CPU + gpu_left * D.BESTFIT_SCALE // D.BESTFIT_GPU)


def dotproduct_key(alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int],
                   device: Sequence[int]) -> int:
    """DotProd's node score as the FGD paper's simulator runs it for its figures (GPU
    dimensions merged, normalised by the largest node): the node's free CPU and free GPU
    (before the pod) and the pod's CPU and GPU, each over 128 CPUs and 8 GPUs, dotted and
    halved; the score is 100 x (1 - that), truncated to whole points, so the node with the
    least free where the pod asks most wins and nodes in the same point tie (the lowest
    node first). Cards are chosen as binpack chooses them (the fullest card a share fits)."""
    cpu, gpu = device[D.CPU], device[D.GPU]
    cpu_free = alloc_row[cpu] - used_row[cpu] if cpu >= 0 else 0
    gpu_free = alloc_row[gpu] - used_row[gpu] if gpu >= 0 else 0
    dot = cpu_free * (req[cpu] if cpu >= 0 else 0) + D.DOT_GPU * gpu_free * (req[gpu] if gpu >= 0 else 0)
    return (-dot) // D.DOT_DIVISOR  # minus the ceiling: 100 - score


def cpu_fragments(req: Sequence[int], device: Sequence[int]) -> bool:
    """With scope ``all``, a pod asking no card is placed by the fragmentation (or bestfit)
    policy too: the CPU it takes can leave a node's free cards unusable."""
    cpu = device[D.CPU]
    return (device[D.SCOPE_ALL] != 0 and device[D.POLICY] in (D.FRAGMENTATION, D.BESTFIT, D.DOTPRODUCT)
            and device[D.N_CARDS] > 0 and cpu >= 0 and req[cpu] > 0)


def cpu_frag_key(alloc_row: Sequence[int], used_row: Sequence[int], req: Sequence[int], device: Sequence[int]) -> int:
    """Minus the increase of the node's fragmentation when ``req``'s CPU is taken there
    (for bestfit: :func:`bestfit_key`)."""
    if device[D.POLICY] == D.BESTFIT:
        return bestfit_key(alloc_row, used_row, req, device)
    if device[D.POLICY] == D.DOTPRODUCT:
        return dotproduct_key(alloc_row, used_row, req, device)
    comp, mem, exists, held_any = _cards(alloc_row, used_row, device)
    free, whole_free = _free_list(comp, mem, exists, held_any)
    cpu = device[D.CPU]
    cpu_free = alloc_row[cpu] - used_row[cpu]
    mix = _mix(device)
    short = device[D.CPU_SHORT]
    change = frag(free, whole_free, cpu_free, mix, short) - frag(free, whole_free, cpu_free - req[cpu], mix, short)
    return banded(change, alloc_row, used_row, req, device)


def _uses_policy(req: Sequence[int], device: Sequence[int]) -> bool:
    """Shares are placed by the card policy; whole cards only with scope ``all``."""
    if device[D.SCOPE_ALL]:
        return True
    shares, mems, _, _, _ = _card_cols(device)
    return any(col >= 0 and req[col] > 0 for col in (*shares, *mems))


def _apply_cards(req: list[int], reqs_row: Any, device: Sequence[int], adds: Sequence[tuple[int, int, int]],
                 mask: int, share_cards: Sequence[int]) -> None:
    """Write a member's card assignment into its request row (usage and outputs)."""
    _, _, outs, cc, cm = _card_cols(device)
    for i, s, m in adds:
        req[cc[i]] += s
        reqs_row[cc[i]] += s
        if m:
            req[cm[i]] += m
            reqs_row[cm[i]] += m
    if device[D.OUT_WHOLE] >= 0:
        req[device[D.OUT_WHOLE]] = mask
        reqs_row[device[D.OUT_WHOLE]] = mask
    for k, v in enumerate(share_cards):
        if outs[k] >= 0:
            req[outs[k]] = v
            reqs_row[outs[k]] = v


def _clear_outputs(reqs: IntArray, device: Sequence[int]) -> None:
    """Reset the card columns a previous placement wrote into ``reqs``."""
    if device[D.N_CARDS] == 0:
        return
    _, _, outs, cc, cm = _card_cols(device)
    for col in (*outs, *cc, *cm, device[D.OUT_WHOLE]):
        if col >= 0:
            reqs[:, col] = 0


def _check_place_shapes(problem: PlacementProblem, out: IntArray) -> None:
    p, a = problem, problem.scoring
    n_nodes, n_res = p.alloc.shape
    n_members = p.reqs.shape[0]
    if p.used.shape != (n_nodes, n_res):
        raise ValueError("used must have the shape of alloc")
    if p.reqs.shape[1] != n_res or a.weights.shape[0] != n_res or a.scalar.shape[0] != n_res:
        raise ValueError("reqs, weights and scalar must have one column per resource")
    if p.masks.shape[1] != n_nodes or p.static.shape != p.masks.shape:
        raise ValueError("masks and static_score must be [S, N]")
    if p.sig.shape[0] != n_members or out.shape[0] < n_members:
        raise ValueError("sig and out must have one entry per member")
    for m in range(n_members):
        if not 0 <= int(p.sig[m]) < p.masks.shape[0]:
            raise ValueError("sig holds a signature index outside masks")


class _Lists(NamedTuple):
    """A problem's arrays as Python lists of exact integers, read member after member."""

    alloc: list[list[int]]
    used: list[list[int]]
    masks: list[list[bool]]
    static: list[list[int]]
    weights: list[int]
    scalar: list[bool]
    shape_u: list[int]
    shape_s: list[int]
    strategy: int

    @classmethod
    def of(cls, problem: PlacementProblem) -> _Lists:
        a = problem.scoring
        return cls(problem.alloc.tolist(), problem.used.tolist(), problem.masks.tolist(),
                   problem.static.tolist(), _ints(a.weights), [bool(v) for v in a.scalar],
                   _ints(a.shape_u), _ints(a.shape_s), a.strategy)


def place(problem: PlacementProblem, out: IntArray, /) -> int:
    """Place members in order, each on its best fitting node, all-or-nothing for the first
    ``min_count``. Writes ``used`` and ``out`` (and each placed member's card assignment
    into its row of ``reqs``); see the kernel for the contract.

    Per member: the best node (:func:`_best_node`, over :func:`_node_total`: the filter and
    the score), then its cards taken (:func:`card_place`, :func:`_apply_cards`) and its
    request added to the node; or, when a gang member finds none, every placement undone."""
    _check_strategy(problem.scoring.strategy)
    _check_place_shapes(problem, out)
    used, reqs, sig, min_count = problem.used, problem.reqs, problem.sig, problem.min_count
    n_members = reqs.shape[0]
    out[:n_members] = -1
    if min_count > n_members:
        return 0
    dev = _ints(problem.scoring.device)
    _clear_outputs(reqs, dev)
    lists = _Lists.of(problem)
    placed: list[tuple[int, int]] = []
    for m, req in enumerate(reqs.tolist()):
        cards = asks_cards(req, dev)
        policy = cards and _uses_policy(req, dev)
        by_cpu = not cards and cpu_fragments(req, dev)
        best = _best_node(lists, req, int(sig[m]), m, dev, cards=cards, policy=policy, by_cpu=by_cpu)
        if best < 0:
            if m < min_count:
                for k, n in reversed(placed):
                    used[n] -= reqs[k]
                out[:n_members] = -1
                _clear_outputs(reqs, dev)
                return 0
            continue
        if cards:
            _, _, adds, mask, share_cards = card_place(lists.alloc[best], lists.used[best], req, dev, m, best, policy)
            _apply_cards(req, reqs[m], dev, adds, mask, share_cards)
        lists.used[best] = [u + q for u, q in zip(lists.used[best], req, strict=True)]
        used[best] += reqs[m]
        out[m] = best
        placed.append((m, best))
    return len(placed)


def _best_node(lists: _Lists, req: list[int], s: int, m: int, dev: Sequence[int], *, cards: bool,
               policy: bool, by_cpu: bool) -> int:
    """The node with the highest :func:`_node_total` for member m, the lowest on a tie; -1
    when it may go nowhere."""
    best = -1
    best_total = 0
    for n in range(len(lists.alloc)):
        total = _node_total(lists, req, s, m, n, dev, cards=cards, policy=policy, by_cpu=by_cpu)
        if total is not None and (best < 0 or total > best_total):
            best, best_total = n, total
    return best


def _node_total(lists: _Lists, req: list[int], s: int, m: int, n: int, dev: Sequence[int], *,
                cards: bool, policy: bool, by_cpu: bool) -> int | None:
    """Member m's total on node n, or None where it may not go (its signature's mask, the fit,
    the cards): the static score plus the CPU fragmentation key (``by_cpu``), the card
    policy's key (``policy``), or the resource score."""
    alloc_row, used_row = lists.alloc[n], lists.used[n]
    if not lists.masks[s][n] or not _fits(alloc_row, used_row, req):
        return None
    key = 0
    if cards:
        ok, key, _, _, _ = card_place(alloc_row, used_row, req, dev, m, n, policy)
        if not ok:
            return None
    static = lists.static[s][n]
    if by_cpu:
        return static + cpu_frag_key(alloc_row, used_row, req, dev) * D.KEY_SHIFT
    if policy:
        return static + key * D.KEY_SHIFT
    return static + _score(alloc_row, used_row, req, lists.weights, lists.scalar, lists.shape_u,
                           lists.shape_s, lists.strategy)


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
