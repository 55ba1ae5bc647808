"""GPUs as devices: what a pod asks of cards, what cards a node has, which cards a pod holds.

A node's GPUs are *cards*, numbered from 0. Their count is ``nvidia.com/gpu`` allocatable,
or ``elasticgpu.io/gpu-core`` allocatable / 100 on a node that only offers that; the memory
of each card is ``elasticgpu.io/gpu-memory`` allocatable (MiB) split evenly over the cards,
else the ``nvidia.com/gpu.memory`` label (MiB, as GPU feature discovery sets it), else
unknown (then no pod that asks for card memory fits there).

A card's compute is counted in thousandths (*milli*, 1000 = the whole card). A pod asks,
per container, for one of:

- whole cards: ``nvidia.com/gpu: n``, or ``elasticgpu.io/gpu-core`` a multiple of 100;
- a share of one card: ``elasticgpu.io/gpu-core`` below 100 (percent of a card) and/or
  ``elasticgpu.io/gpu-memory`` (MiB on that card); or, on the first container, KAI
  Scheduler's pod annotations ``gpu-fraction`` ("0.5") and/or ``gpu-memory`` (MiB).

The cycle sees these as extra request columns (:func:`ask_columns`), and every node as extra
allocatable columns: the total card compute (``batchsched.io/gpu``, milli) and each card's
compute and memory (:func:`card_columns`). What a bound pod holds is read back from the
assignment annotations the scheduler writes before binding (:func:`assignment`), so a
restarted scheduler rebuilds every card's usage from the pods alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from batchsched.core.quantity import QuantityError, parse_quantity

NVIDIA_GPU = "nvidia.com/gpu"
ELASTIC_CORE = "elasticgpu.io/gpu-core"
ELASTIC_MEMORY = "elasticgpu.io/gpu-memory"
#: the per-container assignment elastic-gpu-agent reads: card indexes, comma-separated
ELASTIC_CONTAINER_PREFIX = "elasticgpu.io/container-"
ELASTIC_ASSUMED = "elasticgpu.io/assumed"
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
#: KAI's fraction on several devices, and the container a fraction is for
KAI_DEVICES = "gpu-fraction-num-devices"
KAI_CONTAINER = "gpu-fraction-container-name"
#: our record of the card a KAI-style fractional pod (or a whole-card pod) got
CARDS_ANNOTATION = "batchsched.io/gpu-cards"
#: a pod's choice of card placement policy, overriding the configured one
POLICY_ANNOTATION = "batchsched.io/gpu-placement"
CARD_MEMORY_LABEL = "nvidia.com/gpu.memory"
#: GPU models, as GPU feature discovery labels nodes
MODEL_LABEL = "nvidia.com/gpu.product"

MILLI = 1000
#: the card compute a pod holds, in thousandths of a card; also a node's total
GPU_SHARES = "batchsched.io/gpu"
MAX_CARDS = 32
#: fractional containers per pod the cycle places (more is refused, visibly)
MAX_SHARED_CONTAINERS = 4
#: allocatable of the request-only columns on every node: never the limit
UNBOUNDED = 2**40
#: the largest card memory a container may ask for, MiB (about a pebibyte)
MAX_CARD_MEMORY = 2**30

ASK_WHOLE = "batchsched.io/ask-whole-cards"
ASK_ANY = "batchsched.io/ask-any-cards"
#: written by the kernels: the recorded whole cards a member got, as a bit mask
ASK_OUT_WHOLE = "batchsched.io/ask-out-whole-cards"
#: how many whole cards a node gives out without saying which (``nvidia.com/gpu`` pods)
CARDS_ANY = "batchsched.io/card-any"
ASK_POLICY = "batchsched.io/ask-gpu-policy"

POLICIES = ("fragmentation", "binpack", "spread", "random", "bestfit", "dotproduct")
"""Card placement policies; the kernels take their index + 1 (0 = the configured one)."""


def ask_share(k: int) -> str:
    return f"batchsched.io/ask-share-{k}"


def ask_memory(k: int) -> str:
    return f"batchsched.io/ask-memory-{k}"


def ask_out_card(k: int) -> str:
    """Written by the kernels: the card share ``k`` got, plus one."""
    return f"batchsched.io/ask-out-card-{k}"


def card_compute(i: int) -> str:
    return f"batchsched.io/card-{i}"


def card_memory(i: int) -> str:
    return f"batchsched.io/card-{i}-memory"


ASK_COLUMNS: tuple[str, ...] = (
    ASK_WHOLE, ASK_ANY, ASK_POLICY, ASK_OUT_WHOLE,
    *(ask_share(k) for k in range(MAX_SHARED_CONTAINERS)),
    *(ask_memory(k) for k in range(MAX_SHARED_CONTAINERS)),
    *(ask_out_card(k) for k in range(MAX_SHARED_CONTAINERS)),
)


def card_columns_of(col: Mapping[str, int]) -> list[tuple[int, int]]:
    """``(compute, memory)`` column indexes of each card, in card order, given the column
    index by name (card columns exist up to the most cards a node has). A card whose
    memory column is missing is no card of a node: its compute column was made by the
    usage of a pod running on a node not listed (deleted, or not seen yet)."""
    out: list[tuple[int, int]] = []
    while len(out) < MAX_CARDS and card_compute(len(out)) in col and card_memory(len(out)) in col:
        out.append((col[card_compute(len(out))], col[card_memory(len(out))]))
    return out


def internal(column: str) -> bool:
    """A column of the device model that users never name (asks and per-card usage)."""
    return column.startswith(("batchsched.io/ask-", "batchsched.io/card-"))


def gpu_column(column: str) -> bool:
    """A column that counts cards or what is on them, any of which a quota may name: the
    device plugins' resources (``nvidia.com/gpu``, ``elasticgpu.io/gpu-core`` and
    ``-memory``), the card compute total (``batchsched.io/gpu``), each card's compute and
    memory and the cards handed out by count. Not the request-only ask columns, which no
    node runs short of."""
    return column in (NVIDIA_GPU, ELASTIC_CORE, ELASTIC_MEMORY, GPU_SHARES) or column.startswith("batchsched.io/card-")


def shown(amounts: Mapping[str, int]) -> dict[str, int]:
    """``amounts`` as users are told them: no internal column, and the card compute total
    only when no GPU resource the pod named says the same."""
    out = {r: n for r, n in amounts.items() if not internal(r)}
    if GPU_SHARES in out and any(r in out for r in (NVIDIA_GPU, ELASTIC_CORE)):
        del out[GPU_SHARES]
    return out


@dataclass(slots=True, frozen=True)
class CardAsk:
    """What one container asks of cards: ``whole`` cards, or a ``share`` (milli) and/or
    ``memory`` (MiB) of one card."""

    container: str
    whole: int = 0
    share: int = 0
    memory: int = 0
    #: the ask came from KAI-style pod annotations (recorded under our annotation)
    kai: bool = False

    @property
    def shared(self) -> bool:
        return self.whole == 0

    @property
    def anywhere(self) -> bool:
        """Whole ``nvidia.com/gpu`` cards: the device plugin picks which, so the scheduler
        counts how many a node gives out, not which."""
        return self.whole > 0 and not self.elastic

    #: the ask is in elasticgpu.io resources (the agent needs the card indexes)
    elastic: bool = False

    @property
    def recorded(self) -> bool:
        """Whether the cards it gets are written on the pod (and read back)."""
        return not self.anywhere


class DeviceError(ValueError):
    """A GPU request batchsched will not place: the message says why."""


def _container_requests(c: Mapping[str, Any]) -> Mapping[str, Any]:
    """Requests, defaulted from limits per resource as the apiserver does."""
    res = c.get("resources") or {}
    return {**(res.get("limits") or {}), **(res.get("requests") or {})}


def _int_quantity(name: str, value: Any) -> int:
    try:
        q = parse_quantity(value)
    except QuantityError as exc:
        raise DeviceError(str(exc)) from exc
    if q != q.to_integral_value() or q < 0 or q >= MAX_CARD_MEMORY:
        raise DeviceError(f"{name} {value} is not a whole number within range")
    return int(q)


def _fraction(value: str) -> int:
    try:
        f = Decimal(value.strip())
    except InvalidOperation as exc:
        raise DeviceError(f"annotation {KAI_FRACTION}={value!r} is not a number") from exc
    if not f.is_finite() or f <= 0 or f >= 1:
        raise DeviceError(f"annotation {KAI_FRACTION}={value!r} must be a fraction between 0 and 1")
    milli = int(f * MILLI)
    if milli < 1 or milli != f * MILLI:
        raise DeviceError(f"annotation {KAI_FRACTION}={value!r} is finer than a thousandth of a card")
    return milli


def card_asks(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> tuple[CardAsk, ...]:
    """Every container's ask of cards, in container order; raises :class:`DeviceError`."""
    asks: list[CardAsk] = []
    containers = list(spec.get("containers") or [])
    for c in containers:
        name = str(c.get("name") or "")
        req = _container_requests(c)
        whole = _int_quantity(NVIDIA_GPU, req[NVIDIA_GPU]) if NVIDIA_GPU in req else 0
        core = _int_quantity(ELASTIC_CORE, req[ELASTIC_CORE]) if ELASTIC_CORE in req else 0
        memory = _int_quantity(ELASTIC_MEMORY, req[ELASTIC_MEMORY]) if ELASTIC_MEMORY in req else 0
        if whole and (core or memory):
            raise DeviceError(
                f"container {name} asks for both {NVIDIA_GPU} and {ELASTIC_CORE}/{ELASTIC_MEMORY}; ask for one"
            )
        if core > 100 and core % 100:
            raise DeviceError(
                f"container {name} asks for {ELASTIC_CORE} {core}: above 100 only whole cards "
                f"(a multiple of 100) can be given, a share is of one card (below 100)"
            )
        if core >= 100:
            if memory:
                raise DeviceError(
                    f"container {name} asks for whole cards ({ELASTIC_CORE} {core}) and "
                    f"{ELASTIC_MEMORY}: whole cards come with all their memory"
                )
            whole = core // 100
        if whole:
            if whole > MAX_CARDS:
                raise DeviceError(f"container {name} asks for {whole} cards; no node has more than {MAX_CARDS}")
            asks.append(CardAsk(name, whole=whole, elastic=core > 0))
        elif core or memory:
            asks.append(CardAsk(name, share=core * 10, memory=memory, elastic=True))
    fraction = annotations.get(KAI_FRACTION)
    kai_memory = annotations.get(KAI_MEMORY)
    if fraction is not None or kai_memory is not None:
        if asks:
            raise DeviceError(
                f"the pod has the {KAI_FRACTION}/{KAI_MEMORY} annotations and also requests GPUs; use one or the other"
            )
        if not containers:
            raise DeviceError("the pod has no container to give a GPU share to")
        share = _fraction(fraction) if fraction is not None else 0
        memory = _int_quantity(f"annotation {KAI_MEMORY}", kai_memory) if kai_memory is not None else 0
        if memory == 0 and share == 0:
            raise DeviceError(f"annotation {KAI_MEMORY} must be a positive number of MiB")
        devices = annotations.get(KAI_DEVICES, "1").strip()
        if devices != "1":
            raise DeviceError(
                f"annotation {KAI_DEVICES}={devices!r}: batchsched gives a fraction on one card only"
            )
        names = [str(c.get("name") or "") for c in containers]
        container = annotations.get(KAI_CONTAINER, names[0])
        if container not in names:
            raise DeviceError(f"annotation {KAI_CONTAINER}={container!r} names no container of the pod")
        asks.append(CardAsk(container, share=share, memory=memory, kai=True))
    shared = sum(1 for a in asks if a.shared)
    if shared > MAX_SHARED_CONTAINERS:
        raise DeviceError(
            f"{shared} containers ask for a share of a card; batchsched places at most "
            f"{MAX_SHARED_CONTAINERS} per pod"
        )
    return tuple(asks)


def policy_code(annotations: Mapping[str, str]) -> int:
    """The pod's card placement policy as the kernels take it (0: the configured one)."""
    name = annotations.get(POLICY_ANNOTATION)
    if name is None:
        return 0
    if name not in POLICIES:
        raise DeviceError(
            f"annotation {POLICY_ANNOTATION}={name!r} is not one of {', '.join(POLICIES)}"
        )
    return POLICIES.index(name) + 1


def ask_requests(asks: Sequence[CardAsk], policy: int) -> dict[str, int]:
    """The request columns of ``asks``: total compute, whole cards, each share."""
    out: dict[str, int] = {}
    if not asks:
        return out
    whole = sum(a.whole for a in asks if a.recorded)
    anywhere = sum(a.whole for a in asks if a.anywhere)
    shares = [a for a in asks if a.shared]
    out[GPU_SHARES] = (whole + anywhere) * MILLI + sum(a.share for a in shares)
    if whole:
        out[ASK_WHOLE] = whole
    if anywhere:
        out[ASK_ANY] = anywhere
        # charged to the node's count of cards handed out unnamed as soon as the pod is
        # placed, so the next pod placed there in the same cycle counts them as taken
        out[CARDS_ANY] = anywhere
    for k, a in enumerate(shares):
        # a share of 0 milli with memory is still an ask: the kernels read the memory too
        if a.share:
            out[ask_share(k)] = a.share
        if a.memory:
            out[ask_memory(k)] = a.memory
    if shares and not any(a.share for a in shares) and not any(a.memory for a in shares):
        raise DeviceError("a GPU share must ask for compute or memory")
    if policy:
        out[ASK_POLICY] = policy
    return out


# -- nodes -------------------------------------------------------------------------------


def node_cards(allocatable: Mapping[str, int], labels: Mapping[str, str]) -> tuple[int, int]:
    """``(cards, memory per card in MiB)``; memory 0 when not known."""
    cards = allocatable.get(NVIDIA_GPU, 0)
    if cards <= 0:
        cards = allocatable.get(ELASTIC_CORE, 0) // 100
    cards = max(0, min(cards, MAX_CARDS))
    if cards == 0:
        return 0, 0
    memory = allocatable.get(ELASTIC_MEMORY, 0) // cards
    if memory <= 0:
        text = labels.get(CARD_MEMORY_LABEL, "")
        memory = int(text) if text.isascii() and text.isdigit() and int(text) < MAX_CARD_MEMORY else 0
    return cards, memory


def card_columns(cards: int, memory: int) -> dict[str, int]:
    """The allocatable columns of a node with ``cards`` cards of ``memory`` MiB each: the
    request-only columns are never its limit."""
    out = {name: UNBOUNDED for name in ASK_COLUMNS}
    if cards:
        out[GPU_SHARES] = cards * MILLI
        out[CARDS_ANY] = cards
        for i in range(cards):
            out[card_compute(i)] = MILLI
            out[card_memory(i)] = memory
    return out


# -- assignments -------------------------------------------------------------------------


def _indexes(text: str) -> tuple[int, ...] | None:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    # ASCII digits only: superscripts and fullwidth digits pass str.isdigit, not int()
    if not parts or not all(p.isascii() and p.isdigit() and int(p) < MAX_CARDS for p in parts):
        return None
    return tuple(int(p) for p in parts)


def assignment(asks: Sequence[CardAsk], annotations: Mapping[str, str]) -> tuple[tuple[int, ...], ...] | None:
    """The cards each recorded ask holds (``()`` for an :attr:`~CardAsk.anywhere` ask), as
    the annotations say; None when a recorded ask has no readable record or one with the
    wrong number of cards."""
    ours = annotations.get(CARDS_ANNOTATION)
    recorded: dict[str, tuple[int, ...]] = {}
    if ours is not None:
        for part in ours.split(";"):
            name, _, cards = part.partition("=")
            got = _indexes(cards)
            if got is not None:
                recorded[name.strip()] = got
    out: list[tuple[int, ...]] = []
    for a in asks:
        if a.anywhere:
            out.append(())
            continue
        text = annotations.get(ELASTIC_CONTAINER_PREFIX + a.container)
        got = _indexes(text) if text is not None else recorded.get(a.container)
        if got is None or len(got) != max(1, a.whole) or len(set(got)) != len(got):
            return None
        out.append(got)
    return tuple(out)


def annotations_for(asks: Sequence[CardAsk], cards: Sequence[Sequence[int]]) -> tuple[dict[str, str], dict[str, str]]:
    """``(annotations, labels)`` to write on a pod before binding it with ``cards`` (per ask):
    elastic-gpu-agent's per-container annotation and label for elasticgpu.io asks, our own
    annotation for KAI-style shares; nothing for whole ``nvidia.com/gpu`` cards."""
    notes: dict[str, str] = {}
    ours: list[str] = []
    elastic = False
    for a, got in zip(asks, cards, strict=True):
        value = ",".join(str(i) for i in got)
        if a.anywhere:
            continue
        if a.elastic:
            notes[ELASTIC_CONTAINER_PREFIX + a.container] = value
            elastic = True
        else:
            ours.append(f"{a.container}={value}")
    if ours:
        notes[CARDS_ANNOTATION] = ";".join(ours)
    labels = {ELASTIC_ASSUMED: "true"} if elastic else {}
    return notes, labels


def assigned_usage(asks: Sequence[CardAsk], cards: Sequence[Sequence[int]]) -> dict[str, int]:
    """The per-card usage columns of a pod holding ``cards`` (per ask): a whole card counts
    all its compute, a share its milli and its memory."""
    out: dict[str, int] = {}
    for a, got in zip(asks, cards, strict=True):
        if a.anywhere:
            out[CARDS_ANY] = out.get(CARDS_ANY, 0) + a.whole
            continue
        for i in got:
            if a.whole:
                out[card_compute(i)] = out.get(card_compute(i), 0) + MILLI
            else:
                if a.share:
                    out[card_compute(i)] = out.get(card_compute(i), 0) + a.share
                if a.memory:
                    out[card_memory(i)] = out.get(card_memory(i), 0) + a.memory
    return out


def stale_keys(annotations: Mapping[str, str], labels: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The card assignment written on a pod: ``(annotation keys, label keys)``. On a pod
    that is not bound and not being bound it is stale (its binding failed, or the scheduler
    restarted in between) and must go before the pod is placed again, so that no node
    agent reads cards the pod does not hold."""
    notes = tuple(sorted(k for k in annotations if k.startswith(ELASTIC_CONTAINER_PREFIX) or k == CARDS_ANNOTATION))
    marks = (ELASTIC_ASSUMED,) if ELASTIC_ASSUMED in labels else ()
    return notes, marks


# -- the workload mix (what the fragmentation policy measures against) -------------------
#
# The fragmentation policy scores a node by the GPU it leaves useless to the pods the
# cluster runs (FGD, ATC'23): each kind of pod, weighted by how often it arrives. As in FGD,
# pods that ask for no card count as kinds of their own (a CPU-only kind finds every free
# GPU of a node useless, and a node whose CPU a GPU pod exhausts strands its cards for all
# kinds), and the rare kinds are cut: the most frequent kinds that cover POPULAR_PERMILLE
# of the arrivals are kept, :data:`MAX_MIX` at most.

#: request kinds of the mix kept at most (the most frequent); the rest are a small tail.
#: openb's default trace needs 35 to cover 95% of its pods (FGD's typical pods)
MAX_MIX = 48
#: the kept kinds cover this much of the arrivals (thousandths): FGD's 95% popularity cut
POPULAR_PERMILLE = 950

MixKind = tuple[int, int, int]
"""``(cpu milli, whole cards, share milli)`` of a kind of pod; ``(cpu, 0, 0)`` for a pod
that asks for no card (a whole-card kind has share :data:`MILLI`)."""


def mix_kind(cpu: int, asks: Sequence[CardAsk]) -> MixKind | None:
    """The kind of a pod in the workload mix: its CPU and its cards; ``(cpu, 0, 0)`` for a
    pod that asks for no card; None for a pod that asks for nothing the mix measures (no
    CPU and no card, or cards by memory alone)."""
    if not asks:
        return (cpu, 0, 0) if cpu > 0 else None
    whole = sum(a.whole for a in asks)
    share = max((a.share for a in asks if a.shared), default=0)
    if whole == 0 and share == 0:
        return None
    return (cpu, whole, share if whole == 0 else MILLI)


def popular(counts: Mapping[MixKind, int]) -> list[tuple[MixKind, int]]:
    """The kinds of the mix kept, most frequent first: those that cover
    :data:`POPULAR_PERMILLE` of the count (the kind that crosses it included), at most
    :data:`MAX_MIX`. Equal counts go larger CPU first, then larger share, then more whole
    cards (FGD's order), so a restart or a copy that counted in another order keeps the same
    kinds."""
    ranked = sorted(((k, n) for k, n in counts.items() if n > 0),
                    key=lambda kn: (-kn[1], -kn[0][0], -kn[0][2], -kn[0][1]))
    total = sum(n for _, n in ranked)
    kept: list[tuple[MixKind, int]] = []
    covered = 0
    for kind, n in ranked[:MAX_MIX]:
        if covered * 1000 >= total * POPULAR_PERMILLE:
            break
        kept.append((kind, n))
        covered += n
    return kept


def mix_rows(counts: Mapping[MixKind, int]) -> tuple[tuple[int, int, int, int], ...]:
    """The rows the kernels measure against: the :func:`popular` kinds, each
    ``(weight, cpu, whole, share)`` with its weight in thousandths of the kept total (a kind
    whose weight rounds to 0 is left out)."""
    top = popular(counts)
    total = sum(n for _, n in top)
    if total == 0:
        return ()
    return tuple((n * 1000 // total, cpu, whole, share) for (cpu, whole, share), n in top if n * 1000 >= total)
