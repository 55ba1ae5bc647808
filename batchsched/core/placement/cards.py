"""GPU cards in the placement kernels: the descriptor that tells them where the card columns
are, the card placement policies, and the assignment read back after a placement.

The kernels take one int64 array, the *device descriptor*, next to the scoring arrays:

======================  ==================================================================
``[POLICY]``            the configured policy: 1 fragmentation, 2 binpack, 3 spread, 4 random,
                        5 bestfit (the FGD paper's baseline: least CPU and GPU left, half each),
                        6 dotproduct (the paper's DotProd baseline, see reference.dotproduct_key)
``[SCOPE_ALL]``         1: the policy also places whole-card pods (else RequestedToCapacityRatio)
``[N_CARDS]``           C, the card columns present (the most cards a node has)
``[N_SHARES]``          K, share slots per pod
``[GPU]`` ...           columns of the total card compute, the cards handed out by count,
                        the whole-card asks (recorded / by count), the pod's policy, the
                        kernel's output of whole cards (a bit mask); -1 when absent
``[CPU]``               the cpu column (the fragmentation measure looks at free CPU)
``[SEED]``              the seed of the random policy
``[N_MIX]``             T, the request kinds of the workload mix
``[BAND]``              the fragmentation score's band width, weight x milli-GPU (0: exact)
``[CPU_SHORT]``         % of the GPU a share kind could take but the node's CPU could not
                        host that the fragmentation measure counts as lost
then                    K share columns, K share-memory columns, K output columns (card + 1),
                        C card-compute columns, C card-memory columns, and T rows of
                        ``(weight, cpu milli, whole cards, share milli)``.
======================  ==================================================================

A member asks for cards when any of its ask columns is positive; all others are placed as
before. See :func:`batchsched.core.placement.reference.card_place` for the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchsched.core import devices, explain
from batchsched.core.devices import MAX_SHARED_CONTAINERS, POLICIES, CardAsk

IntArray = npt.NDArray[np.int64]

POLICY = 0
SCOPE_ALL = 1
N_CARDS = 2
N_SHARES = 3
GPU = 4
ANY = 5
ASK_WHOLE = 6
ASK_ANY = 7
ASK_POLICY = 8
OUT_WHOLE = 9
CPU = 10
SEED = 11
N_MIX = 12
BAND = 13
CPU_SHORT = 14
HEAD = 15

FRAGMENTATION, BINPACK, SPREAD, RANDOM, BESTFIT, DOTPRODUCT = 1, 2, 3, 4, 5, 6
#: BestFit's normalisation, as the FGD paper's simulator fixes it: the largest node's CPU
#: (milli) and GPU (milli) it assumes; a node's score is its weighted free share after
BESTFIT_CPU, BESTFIT_GPU, BESTFIT_SCALE = 128000, 8000, 100000
#: DotProd's score is 100 x (1 - the dot product of the node's free and the pod's asked CPU
#: and GPU, each over the largest node above, halved), truncated: in integers, 100 minus
#: the ceiling of (cpu free x cpu asked + DOT_GPU x gpu free x gpu asked) / DOT_DIVISOR
DOT_GPU = (BESTFIT_CPU // BESTFIT_GPU) ** 2
DOT_DIVISOR = 2 * BESTFIT_CPU * BESTFIT_CPU // 100
#: a policy's key is shifted above every static score (taints, affinity preferences ...),
#: which then only breaks its ties
KEY_SHIFT = 4096
#: inside a fragmentation band the node with the most of its GPU in use goes first (in
#: 1/USED_SCALE of its GPU): the band is shifted above it
USED_SCALE = 100000
BAND_SHIFT = 1 << 17


@dataclass(slots=True, frozen=True)
class CardPolicy:
    """How fractional GPU asks are placed (config ``gpuSharing``)."""

    policy: str = "fragmentation"
    #: "all": pods asking whole cards (and pods asking none, for the CPU they take from GPU
    #: nodes) are placed by the policy too; "sharing": only pods that ask for a share
    scope: str = "all"
    seed: int = 0
    #: fragmentation: a node's change of fragmentation (milli-GPU, weighted by the mix) is
    #: rounded to a multiple of this, so nodes within about this much of each other rank
    #: alike and the one with the most of its GPU in use goes first; 0 ranks by the exact
    #: change (which spreads pods over nodes that differ by a few milli-GPU)
    band: int = 20
    #: fragmentation: of the GPU a kind of share could take on a node but its CPU could
    #: not host (more shares fit the cards than the CPU left lets run), this % counts as
    #: lost; 0: only a node with no CPU for a single pod loses it (the FGD paper's measure)
    cpu_short: int = 50

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"gpuSharing.policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.scope not in ("sharing", "all"):
            raise ValueError(f"gpuSharing.scope {self.scope!r} is not 'sharing' or 'all'")
        if not 0 <= self.band <= 100_000:
            raise ValueError(f"gpuSharing.band {self.band!r} is not between 0 and 100000 (milli-GPU)")
        if not 0 <= self.cpu_short <= 100:
            raise ValueError(f"gpuSharing.cpuShort {self.cpu_short!r} is not between 0 and 100 (%)")

    @property
    def code(self) -> int:
        return POLICIES.index(self.policy) + 1


def descriptor(columns: Sequence[str], policy: CardPolicy,
               mix: Sequence[tuple[int, int, int, int]] = ()) -> IntArray:
    """The device descriptor for the snapshot's ``columns``."""
    col = {c: i for i, c in enumerate(columns)}
    pairs = devices.card_columns_of(col)
    n_cards = len(pairs)
    k = MAX_SHARED_CONTAINERS
    head = [0] * HEAD
    head[POLICY] = policy.code
    head[SCOPE_ALL] = 1 if policy.scope == "all" else 0
    head[N_CARDS] = n_cards
    head[N_SHARES] = k
    for index, name in ((GPU, devices.GPU_SHARES), (ANY, devices.CARDS_ANY),
                        (ASK_WHOLE, devices.ASK_WHOLE), (ASK_ANY, devices.ASK_ANY),
                        (ASK_POLICY, devices.ASK_POLICY), (OUT_WHOLE, devices.ASK_OUT_WHOLE),
                        (CPU, "cpu")):
        head[index] = col.get(name, -1)
    head[SEED] = policy.seed
    head[N_MIX] = len(mix)
    head[BAND] = policy.band * sum(row[0] for row in mix)
    head[CPU_SHORT] = policy.cpu_short
    body: list[int] = []
    for names in (devices.ask_share, devices.ask_memory, devices.ask_out_card):
        body.extend(col.get(names(i), -1) for i in range(k))
    body.extend(compute for compute, _ in pairs)
    body.extend(memory for _, memory in pairs)
    for row in mix:
        body.extend(row)
    if n_cards and any(head[i] < 0 for i in (GPU, ANY, ASK_WHOLE, ASK_ANY, ASK_POLICY, OUT_WHOLE)):
        raise ValueError("card columns without the ask columns")
    return np.array(head + body, dtype=np.int64)


def no_cards() -> IntArray:
    """A descriptor for a snapshot without cards (the kernels place as before)."""
    head = [0] * HEAD
    head[POLICY] = FRAGMENTATION
    for i in (GPU, ANY, ASK_WHOLE, ASK_ANY, ASK_POLICY, OUT_WHOLE, CPU):
        head[i] = -1
    return np.array(head, dtype=np.int64)


def assigned(asks: Sequence[CardAsk], req: IntArray, device: IntArray) -> tuple[tuple[int, ...], ...]:
    """The cards each ask got, from a member's request row after the kernel placed it."""
    k = int(device[N_SHARES])
    out_cols = device[HEAD + 2 * k: HEAD + 3 * k]
    mask = int(req[int(device[OUT_WHOLE])]) if device[OUT_WHOLE] >= 0 else 0
    whole_cards = [i for i in range(devices.MAX_CARDS) if mask >> i & 1]
    cards: list[tuple[int, ...]] = []
    share = 0
    for a in asks:
        if a.anywhere:
            cards.append(())
        elif a.whole:
            cards.append(tuple(whole_cards[: a.whole]))
            whole_cards = whole_cards[a.whole:]
        else:
            card = int(req[int(out_cols[share])]) - 1
            if card < 0:
                raise ValueError("a placed member's share has no card: the kernel's output is inconsistent")
            cards.append((card,))
            share += 1
    return tuple(cards)


def held_cards(req: IntArray, device: IntArray, columns: Sequence[str]) -> dict[str, int]:
    """The per-card usage a placed member's row holds (by column name): what a nomination
    keeps on its node while the victims terminate."""
    k, n_cards = int(device[N_SHARES]), int(device[N_CARDS])
    cols = device[HEAD + 3 * k: HEAD + 3 * k + 2 * n_cards]
    return {columns[int(c)]: int(req[int(c)]) for c in cols if req[int(c)] > 0}


def cards_over(alloc_row: IntArray, used_row: IntArray, device: IntArray) -> bool:
    """Whether a node's usage ``used_row`` gives out more cards by count (whole-card asks the
    device plugin picks the cards of) than it has wholly free cards: the rule of the card
    fit that no column sum sees, as a card with a share on it is not free for a whole one
    (two quarter shares on two cards hold two cards, yet only 500 milli)."""
    any_col, n_cards = int(device[ANY]), int(device[N_CARDS])
    if any_col < 0 or n_cards == 0 or used_row[any_col] <= 0:
        return False
    start = HEAD + 3 * int(device[N_SHARES])
    cc, cm = device[start: start + n_cards], device[start + n_cards: start + 2 * n_cards]
    free = (alloc_row[cc] > 0) & (used_row[cc] == 0) & (used_row[cm] == 0)
    return int(used_row[any_col]) > int(free.sum())


def shortfalls(alloc: IntArray, used: IntArray, req: IntArray, mask: npt.NDArray[np.bool_],
               device: IntArray) -> dict[str, int]:
    """Why the nodes of ``mask`` that have room for ``req`` resource by resource still fail
    it card by card: node count per reason (whole cards, a card with room for the first
    share, card memory), for the unschedulable message. Vectorised; explains, never places."""
    n_cards = int(device[N_CARDS])
    k = int(device[N_SHARES])
    if n_cards == 0 or not mask.any():
        return {}
    asked = req > 0
    room = ((used[:, asked] + req[asked]) <= alloc[:, asked]).all(axis=1) & mask
    if not room.any():
        return {}
    cc = device[HEAD + 3 * k: HEAD + 3 * k + n_cards]
    cm = device[HEAD + 3 * k + n_cards: HEAD + 3 * k + 2 * n_cards]
    comp, mem = used[:, cc], used[:, cm]
    exists = alloc[:, cc] > 0
    empty = exists & (comp == 0) & (mem == 0)
    want = sum(int(req[int(device[i])]) for i in (ASK_WHOLE, ASK_ANY) if device[i] >= 0)
    spare = empty.sum(axis=1) - used[:, int(device[ANY])] - want
    whole_short = room & (spare < 0)
    out: dict[str, int] = {}
    if whole_short.any():
        out[explain.CARDS_WHOLE_SHORT] = int(whole_short.sum())
    left = room & ~whole_short
    s_col, m_col = int(device[HEAD]), int(device[HEAD + k])
    s = int(req[s_col]) if s_col >= 0 else 0
    m = int(req[m_col]) if m_col >= 0 else 0
    if s or m:
        compute_ok = exists & (comp < devices.MILLI) & (comp + s <= devices.MILLI) & (~empty | (spare >= 1)[:, None])
        memory_ok = (mem + m <= alloc[:, cm]) if m else np.ones_like(compute_ok)
        no_compute = left & ~compute_ok.any(axis=1)
        no_memory = left & compute_ok.any(axis=1) & ~(compute_ok & memory_ok).any(axis=1)
        if no_compute.any():
            out[explain.cards_compute_short(s)] = int(no_compute.sum())
        if no_memory.any():
            out[explain.CARDS_MEMORY_SHORT] = int(no_memory.sum())
    return out
