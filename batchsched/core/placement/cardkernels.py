"""The GPU-card part of the placement kernels: does a member fit a node card by card, which
cards it takes, and how the card policy ranks the node. numba-compiled, inlined into
:func:`batchsched.core.placement.kernels.place_members`; each has a plain-Python twin of
the same name in :mod:`batchsched.core.placement.reference` (``card_place``, ``frag``,
``asks_cards``, ``cpu_fragments``, ``cpu_frag_key``), held equal by the property tests.

The device descriptor's layout is in :mod:`batchsched.core.placement.cards`.
"""

from __future__ import annotations

from numba import njit

from batchsched.core.placement import cards as D
from batchsched.core.placement.scoring import BoolArray, IntArray

_FULL = 1000
_PRIME = 2147483647
_D_POLICY = D.POLICY
_D_SCOPE_ALL = D.SCOPE_ALL
_D_N_CARDS = D.N_CARDS
_D_N_SHARES = D.N_SHARES
_D_GPU = D.GPU
_D_ANY = D.ANY
_D_ASK_WHOLE = D.ASK_WHOLE
_D_ASK_ANY = D.ASK_ANY
_D_ASK_POLICY = D.ASK_POLICY
_D_OUT_WHOLE = D.OUT_WHOLE
_D_CPU = D.CPU
_D_SEED = D.SEED
_D_N_MIX = D.N_MIX
_D_HEAD = D.HEAD
_FRAGMENTATION = D.FRAGMENTATION
_BINPACK = D.BINPACK
_SPREAD = D.SPREAD
_RANDOM = D.RANDOM


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
        if cpu_free < cpu:
            lost = total
        elif whole == 0:
            lost = 0
            room = False
            for j in range(n):
                if free[j] >= share:
                    room = True
                else:
                    lost += free[j]
            if not room:
                lost = total
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
    for t in range(device[_D_N_MIX]):
        share = device[start + 4 * t + 3]
        below = 0
        at_least = 0
        for j in range(n):
            if free[j] >= share:
                at_least += 1
            else:
                below += free[j]
        sum_lt[t] = below
        cnt_ge[t] = at_least
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
    out = 0
    for t in range(device[_D_N_MIX]):
        weight = device[start + 4 * t]
        cpu = device[start + 4 * t + 1]
        whole = device[start + 4 * t + 2]
        share = device[start + 4 * t + 3]
        if cpu_free < cpu:
            lost = total2
        elif whole == 0:
            below = sum_lt[t] - (x_old if x_old < share else 0) + (x_new if x_new < share else 0)
            at_least = cnt_ge[t] - (1 if x_old >= share else 0) + (1 if x_new >= share else 0)
            lost = below if at_least > 0 else total2
        else:
            lost = partial2 if whole2 >= whole else total2
        out += weight * lost
    return out


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
    cc0 = _D_HEAD + 3 * k
    cm0 = cc0 + n_cards
    n_free = 0
    for i in range(n_cards):
        comp[i] = used_row[device[cc0 + i]]
        mcol = device[cm0 + i]
        mem[i] = used_row[mcol] if mcol >= 0 else 0
        exists[i] = alloc_row[device[cc0 + i]] > 0
        if exists[i] and comp[i] == 0 and mem[i] == 0:
            n_free += 1
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
            if policy == _BINPACK:
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
        else:
            key = before - frag(comp, mem, exists, n_cards, any_after, cpu_after, device, free)
    return True, key, n_adds, mask


@njit(cache=True, nogil=True)
def cpu_fragments(req: IntArray, device: IntArray) -> bool:
    cpu = device[_D_CPU]
    return bool(device[_D_SCOPE_ALL] != 0 and device[_D_POLICY] == _FRAGMENTATION and device[_D_N_CARDS] > 0
                and cpu >= 0 and req[cpu] > 0)


@njit(cache=True, nogil=True, inline="always")
def cpu_frag_key(alloc_row: IntArray, used_row: IntArray, req: IntArray, device: IntArray,
                  comp: IntArray, mem: IntArray, exists: BoolArray, free: IntArray) -> int:
    """The kernel twin of reference.cpu_frag_key."""
    k = device[_D_N_SHARES]
    n_cards = device[_D_N_CARDS]
    cc0 = _D_HEAD + 3 * k
    for i in range(n_cards):
        comp[i] = used_row[device[cc0 + i]]
        mcol = device[cc0 + n_cards + i]
        mem[i] = used_row[mcol] if mcol >= 0 else 0
        exists[i] = alloc_row[device[cc0 + i]] > 0
    held_any = used_row[device[_D_ANY]] if device[_D_ANY] >= 0 else 0
    cpu = device[_D_CPU]
    cpu_free = alloc_row[cpu] - used_row[cpu]
    before = frag(comp, mem, exists, n_cards, held_any, cpu_free, device, free)
    return before - frag(comp, mem, exists, n_cards, held_any, cpu_free - req[cpu], device, free)


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
