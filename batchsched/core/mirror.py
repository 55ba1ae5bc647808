"""The cluster mirror: one writer applies watch events; the cycle reads a snapshot of it.

Nodes are rows and resources are columns of two integer arrays, ``alloc`` (allocatable)
and ``used`` (the requests of every pod charged to the node). Both are kept up to date
incrementally: adding a pod adds its request vector to one row; a new node takes a free
row; a new resource name adds a column.

A pod is *charged* to a node while it is bound and not finished, or while it is *assumed*:
the cycle decided its node and the binding is on its way, but the watch has not yet shown
``spec.nodeName``. Assumed pods are confirmed by the watch (the charge stays) or forgotten
when the binding fails (the charge is removed and the pod is pending again)::

    pending --cycle--> assumed --watch shows nodeName--> bound --finished/deleted--> gone
                         |  bind failed: forget()
                         +--------------------------> pending

Invariant, checked by :meth:`ClusterState.check`: ``used`` equals the sum of the charges
of the pods charged to each node; a broken invariant is a bug and stops the process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchsched.core.devices import (
    ASK_COLUMNS,
    CARDS_ANY,
    GPU_SHARES,
    MILLI,
    MixKind,
    assigned_usage,
    card_columns,
    card_columns_of,
    mix_kind,
    mix_rows,
    node_cards,
    stale_keys,
)
from batchsched.core.model import GPU, PODS, Node, Pod, PodUID

IntArray = npt.NDArray[np.int64]

BASE_COLUMNS = ("cpu", "memory", PODS, GPU)
#: arrivals the workload mix remembers before its counts are halved
MIX_WINDOW = 20000


class StateError(RuntimeError):
    """The mirror's bookkeeping is inconsistent: a bug, never a user error."""


@dataclass(slots=True, frozen=True)
class Snapshot:
    """What one cycle sees: a consistent copy, never changed by events during the cycle."""

    columns: tuple[str, ...]
    nodes: tuple[Node, ...]
    rows: npt.NDArray[np.intp]
    alloc: IntArray
    used: IntArray
    node_generation: int
    #: the workload mix of GPU requests: ``(weight per mille, cpu, whole cards, share)``
    card_mix: tuple[tuple[int, int, int, int], ...] = ()

    def column(self, name: str) -> int:
        return self.columns.index(name)


def held(pod: Pod, cards: tuple[tuple[int, ...], ...] | None) -> dict[str, int]:
    """What a pod holds on its node: its requests, and the cards it was given in place of
    its card asks. A card ask with no record (bound by someone who wrote none) holds whole
    cards, never a share another pod may also be given."""
    out = {k: v for k, v in pod.requests.items() if k not in _ASKS}
    if pod.card_asks:
        if cards is not None:
            for k, v in assigned_usage(pod.card_asks, cards).items():
                out[k] = out.get(k, 0) + v
        else:
            out[CARDS_ANY] = sum(max(1, a.whole) for a in pod.card_asks)
    return out


#: request columns that say what a pod asks of cards, not what it holds: a bound pod's cards
#: (unnamed ones included) are counted from its asks and their record instead
_ASKS = frozenset((*ASK_COLUMNS, CARDS_ANY))


def to_width(vec: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.int64]:
    """A charge over ``width`` columns: cut, or padded with zeros (a charge made before a
    column was added is shorter)."""
    if len(vec) == width:
        return vec
    return vec[:width] if len(vec) > width else np.pad(vec, (0, width - len(vec)))


class ChargeReader:
    """A book's reading of a mirror's charge feed (:meth:`ClusterState.watch_charges`): the
    pods whose charge changed since its last read, or everything anew when the mirror or
    what the book builds from besides the charges (its ``basis``) changed."""

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        self._changed: set[PodUID] = set()
        self._basis: object = None

    def read(self, state: ClusterState, basis: object) -> set[PodUID] | None:
        """The pods whose charge changed since the last read; None: read every charge anew."""
        if state is not self._state:
            self._state, self._changed = state, state.watch_charges()
            self._basis = None
        if basis != self._basis:
            self._basis = basis
            self._changed.clear()
            return None
        changed = set(self._changed)
        self._changed.clear()
        return changed


class ClusterState:
    """Pods, nodes and per-node usage; apply events with the ``*_event`` methods only."""

    def __init__(
        self, scheduler_names: Iterable[str] = ("batchsched",), *, mix_prior: Iterable[tuple[MixKind, int]] = (),
    ) -> None:
        self.scheduler_names = frozenset(scheduler_names)
        self.columns: list[str] = list(BASE_COLUMNS)
        self._col: dict[str, int] = {c: i for i, c in enumerate(self.columns)}
        self._cap = 64
        self.alloc: IntArray = np.zeros((self._cap, len(self.columns)), dtype=np.int64)
        self.used: IntArray = np.zeros((self._cap, len(self.columns)), dtype=np.int64)
        self.valid = np.zeros(self._cap, dtype=np.bool_)
        self.nodes: dict[str, Node] = {}
        self.node_row: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._next_row = 0
        self.pods: dict[PodUID, Pod] = {}
        #: uid -> (node name, request vector) for every pod charged to a node
        self.charges: dict[PodUID, tuple[str, IntArray]] = {}
        #: charges against nodes the mirror does not know (yet)
        self.orphans: dict[str, set[PodUID]] = {}
        #: uid -> node for pods decided by a cycle and not yet confirmed by the watch
        self.assumed: dict[PodUID, str] = {}
        #: pods of ours waiting for a node (not bound, not assumed, not finished)
        self.pending: dict[PodUID, Pod] = {}
        #: namespaces being deleted: the apiserver refuses any Binding in them, so their
        #: pods are not pending (placing them would hold room for nothing)
        self.closed_namespaces: frozenset[str] = frozenset()
        #: bumps whenever capacity may have grown (a node added or changed, a pod gone)
        self.capacity_generation = 0
        #: bumps whenever a charged pod is charged, uncharged or changed (what runs where)
        self.charge_generation = 0
        #: bumps whenever the set of nodes or their labels/taints change
        self.node_generation = 0
        self.by_name: dict[tuple[str, str], PodUID] = {}
        #: nodes where capacity was freed (a charge removed) since the session last looked
        self.freed_nodes: set[str] = set()
        #: sets the pods whose charge changed are added to, one per reader (see
        #: :meth:`watch_charges`)
        self._charge_readers: list[set[PodUID]] = []
        #: unbound pods of ours carrying a card assignment no binding followed (see
        #: :func:`~batchsched.core.devices.stale_keys`): kept out of ``pending`` until clean
        self.stale: dict[PodUID, Pod] = {}
        #: card_usage's last answer and the generations it was counted at (every step asks)
        self._card_usage: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
        #: the workload mix: how many pods of each kind arrived, over the last arrivals
        #: (counts are halved whenever their sum passes MIX_WINDOW, so old work fades). It
        #: starts from the configured prior (a new cluster's expected work), a stored mix
        #: replaces that (:meth:`restore_mix`), the first listing adds every pod listed, of
        #: any scheduler (what runs is the workload), then each pod of ours as it arrives.
        self.mix: Counter[MixKind] = Counter()
        self._mix_total = 0
        for kind, count in mix_prior:
            self._add_mix(kind, count)
        #: the pods present that were counted, with their kind (None: counted as no kind)
        self._mix_seen: dict[PodUID, MixKind | None] = {}
        #: how many of the pods present were counted of each kind (what a listing rebuilds)
        self._mix_held: Counter[MixKind] = Counter()
        #: the first listing of the pods has seeded the mix
        self._mix_seeded = False

    # -- resource columns --------------------------------------------------------------

    def column(self, name: str) -> int:
        idx = self._col.get(name)
        if idx is None:
            idx = len(self.columns)
            self.columns.append(name)
            self._col[name] = idx
            self.alloc = np.pad(self.alloc, ((0, 0), (0, 1)))
            self.used = np.pad(self.used, ((0, 0), (0, 1)))
            for uid, (node, vec) in list(self.charges.items()):
                self.charges[uid] = (node, np.pad(vec, (0, 1)))
        return idx

    def vector(self, resources: dict[str, int] | Iterable[tuple[str, int]]) -> IntArray:
        items = list(resources.items() if isinstance(resources, dict) else resources)
        for name, _ in items:
            self.column(name)
        vec = np.zeros(len(self.columns), dtype=np.int64)
        for name, value in items:
            vec[self._col[name]] = value
        return vec

    # -- nodes ----------------------------------------------------------------------------

    def _row_for(self, name: str) -> int:
        row = self.node_row.get(name)
        if row is not None:
            return row
        if self._free_rows:
            row = self._free_rows.pop()
        else:
            row = self._next_row
            self._next_row += 1
            if row >= self._cap:
                grow = self._cap
                self._cap *= 2
                self.alloc = np.pad(self.alloc, ((0, grow), (0, 0)))
                self.used = np.pad(self.used, ((0, grow), (0, 0)))
                self.valid = np.pad(self.valid, (0, grow))
        self.node_row[name] = row
        return row

    def node_event(self, kind: str, node: Node) -> None:
        if kind == "DELETED":
            self._remove_node(node.name)
            return
        old = self.nodes.get(node.name)
        row = self._row_for(node.name)
        vec = self.vector({**node.allocatable, **card_columns(*node_cards(node.allocatable, node.labels))})
        self.alloc[row, :] = vec
        self.valid[row] = True
        self.nodes[node.name] = node
        if old is None:
            for uid in self.orphans.pop(node.name, set()):
                self.used[row] += self.charges[uid][1]
        if old is None or (old.labels, old.taints, old.unschedulable, old.ready, old.deleting) != (
            node.labels, node.taints, node.unschedulable, node.ready, node.deleting
        ) or dict(old.allocatable) != dict(node.allocatable):
            self.node_generation += 1
            self.capacity_generation += 1

    def _remove_node(self, name: str) -> None:
        row = self.node_row.pop(name, None)
        if name not in self.nodes or row is None:
            return
        del self.nodes[name]
        charged = {uid for uid, (n, _) in self.charges.items() if n == name}
        if charged:
            self.orphans.setdefault(name, set()).update(charged)
        self.alloc[row, :] = 0
        self.used[row, :] = 0
        self.valid[row] = False
        self._free_rows.append(row)
        self.node_generation += 1

    def replace_nodes(self, nodes: Iterable[Node]) -> None:
        """A relist: the given nodes are all there is."""
        fresh = {n.name: n for n in nodes}
        for name in list(self.nodes):
            if name not in fresh:
                self._remove_node(name)
        for node in fresh.values():
            self.node_event("MODIFIED", node)

    # -- pods -------------------------------------------------------------------------------

    def ours(self, pod: Pod) -> bool:
        return pod.scheduler_name in self.scheduler_names

    def watch_charges(self) -> set[PodUID]:
        """A set the UIDs of pods whose charge changes (charged, uncharged, or changed while
        charged) are added to from now on; the reader empties it as it reads."""
        changed: set[PodUID] = set()
        self._charge_readers.append(changed)
        return changed

    def _charge_changed(self, uid: PodUID) -> None:
        self.charge_generation += 1
        for changed in self._charge_readers:
            changed.add(uid)

    def _charge(self, uid: PodUID, node: str, pod: Pod, cards: tuple[tuple[int, ...], ...] | None = None) -> None:
        self._charge_changed(uid)
        vec = self.vector(held(pod, cards if cards is not None else pod.cards))
        self.charges[uid] = (node, vec)
        row = self.node_row.get(node)
        if row is None:
            self.orphans.setdefault(node, set()).add(uid)
        else:
            self.used[row] += vec

    def _uncharge(self, uid: PodUID) -> None:
        charged = self.charges.pop(uid, None)
        if charged is None:
            return
        self._charge_changed(uid)
        node, vec = charged
        row = self.node_row.get(node)
        if row is None:
            orphans = self.orphans.get(node)
            if orphans is not None:
                orphans.discard(uid)
                if not orphans:
                    del self.orphans[node]
        else:
            self.used[row] -= vec
            self.freed_nodes.add(node)
        self.capacity_generation += 1

    def pod_event(self, kind: str, pod: Pod) -> None:
        uid = pod.uid
        if kind == "DELETED":
            self._remove_pod(uid)
            return
        old = self.pods.get(uid)
        self.pods[uid] = pod
        self.by_name[(pod.namespace, pod.name)] = uid
        if uid not in self._mix_seen and self.ours(pod):
            self._count_mix(pod)
        if uid in self.charges:
            self._charge_changed(uid)
        if pod.holds_resources or pod.node_name or pod.terminal:
            self.stale.pop(uid, None)
        if pod.holds_resources:
            self.assumed.pop(uid, None)
            charged = self.charges.get(uid)
            if (
                charged is None
                or charged[0] != pod.node_name
                or old is None
                or dict(old.requests) != dict(pod.requests)
            ):
                self._uncharge(uid)
                self._charge(uid, pod.node_name, pod)
            self.pending.pop(uid, None)
            return
        if pod.node_name or pod.terminal:
            # bound and finished: its resources are free again
            self.assumed.pop(uid, None)
            self._uncharge(uid)
            self.pending.pop(uid, None)
            return
        # unbound
        if uid in self.assumed:
            # the binding is in flight; keep the pod charged to its assumed node
            return
        self.stale.pop(uid, None)
        if self.ours(pod) and not pod.deleting and (
            any(stale_keys(pod.annotations, pod.labels)) or pod.stale_claim is not None
        ):
            # a card assignment (or an extended-resource claim) from a binding that did not
            # happen: not placed until removed
            self.stale[uid] = pod
            self.pending.pop(uid, None)
        elif self.ours(pod) and not pod.deleting and pod.namespace not in self.closed_namespaces:
            for name in pod.requests:
                self.column(name)
            self.pending[uid] = pod
        else:
            self.pending.pop(uid, None)

    # -- the workload mix ----------------------------------------------------------------------

    def _count_mix(self, pod: Pod) -> None:
        """A pod's arrival in the workload mix (once per pod, whatever becomes of it: the
        work that fails to fit is the work fragmentation is measured against). A pod with
        DRA claims and no card ask is no kind: its devices are not cards."""
        kind = None if pod.resource_claims and not pod.card_asks else mix_kind(pod.requests.get("cpu", 0), pod.card_asks)
        self._mix_seen[pod.uid] = kind
        if kind is not None:
            self._mix_held[kind] += 1
            self._add_mix(kind, 1)

    def _add_mix(self, kind: MixKind, count: int) -> None:
        if count <= 0:
            return
        self.mix[kind] += count
        self._mix_total += count
        if self._mix_total > MIX_WINDOW:
            self.mix = Counter({k: n // 2 for k, n in self.mix.items() if n // 2 > 0})
            self._mix_total = sum(self.mix.values())

    def _seed_mix(self, pods: Iterable[Pod]) -> None:
        """The first listing: every pod listed arrived once, whichever scheduler placed it
        (running, pending or finished, it is work the cluster runs), so a restarted
        scheduler does not measure against an empty mix. Later listings (a watch that
        expired) count only pods of ours not seen before, as events do."""
        self._mix_seeded = True
        for pod in pods:
            if pod.uid not in self._mix_seen:
                self._count_mix(pod)

    def _forget_mix(self, uid: PodUID) -> None:
        """A pod gone: its count stays in the mix, but no listing shows it any more."""
        kind = self._mix_seen.pop(uid, None)
        if kind is not None:
            self._mix_held[kind] -= 1
            if self._mix_held[kind] <= 0:
                del self._mix_held[kind]

    def mix_gone(self) -> dict[MixKind, int]:
        """The counts of the mix that no pod present stands for (pods gone, the prior):
        what a restart could not rebuild from the pods it lists, so what is worth keeping.
        Past a halving, a pod present counts in full again after a restart (its kind weighs
        a little more than it did: the mix is an estimate, not a ledger)."""
        return {k: n - self._mix_held[k] for k, n in self.mix.items() if n > self._mix_held[k]}

    def restore_mix(self, counts: Mapping[MixKind, int]) -> None:
        """Counts kept from before a restart (:meth:`mix_gone` as it was written) take the
        place of the prior; the pods present stay counted once each."""
        self.mix = Counter()
        self._mix_total = 0
        for kind, count in (*counts.items(), *self._mix_held.items()):
            self._add_mix(kind, count)

    def _remove_pod(self, uid: PodUID) -> None:
        self._forget_mix(uid)
        pod = self.pods.pop(uid, None)
        if pod is not None and self.by_name.get((pod.namespace, pod.name)) == uid:
            del self.by_name[(pod.namespace, pod.name)]
        self.assumed.pop(uid, None)
        self.pending.pop(uid, None)
        self.stale.pop(uid, None)
        self._uncharge(uid)

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        """A relist: the given pods are all there is (assumed pods stay until confirmed)."""
        fresh = {p.uid: p for p in pods}
        for uid in list(self.pods):
            if uid not in fresh:
                self._remove_pod(uid)
        if not self._mix_seeded:
            self._seed_mix(fresh.values())
        for pod in fresh.values():
            self.pod_event("MODIFIED", pod)

    # -- assume / forget --------------------------------------------------------------------

    def assume(self, uid: PodUID, node: str, cards: tuple[tuple[int, ...], ...] | None = None) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            raise StateError(f"assume of unknown pod {uid}")
        if uid in self.charges:
            raise StateError(f"assume of pod {pod.key} that is already charged to {self.charges[uid][0]}")
        self.pending.pop(uid, None)
        self.assumed[uid] = node
        self._charge(uid, node, pod, cards)

    def forget(self, uid: PodUID) -> None:
        """The binding did not happen: uncharge the pod and make it pending again."""
        if self.assumed.pop(uid, None) is None:
            return
        self._uncharge(uid)
        pod = self.pods.get(uid)
        if pod is not None:
            self.pod_event("MODIFIED", pod)

    # -- reading -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        names = sorted(self.nodes)
        rows = np.fromiter((self.node_row[n] for n in names), dtype=np.intp, count=len(names))
        return Snapshot(
            columns=tuple(self.columns),
            nodes=tuple(self.nodes[n] for n in names),
            rows=rows,
            alloc=self.alloc[rows].copy(),
            used=self.used[rows].copy(),
            node_generation=self.node_generation,
            card_mix=mix_rows(self.mix),
        )

    def card_usage(self) -> tuple[int, int, int]:
        """``(cards, card compute held in thousandths, cards wholly free)`` over all nodes;
        a card handed out by count (``nvidia.com/gpu``) is not free."""
        key = (self.charge_generation, self.node_generation, self.capacity_generation)
        if self._card_usage is not None and self._card_usage[0] == key:
            return self._card_usage[1]
        self._card_usage = (key, self._count_cards())
        return self._card_usage[1]

    def _count_cards(self) -> tuple[int, int, int]:
        gpu = self._col.get(GPU_SHARES)
        if gpu is None:
            return 0, 0, 0
        valid = self.valid
        cards = int(self.alloc[valid, gpu].sum()) // MILLI
        held = int(self.used[valid, gpu].sum())
        free = 0
        pairs = card_columns_of(self._col)
        if pairs:
            compute = [c for c, _ in pairs]
            memory = [m for _, m in pairs]
            exists = self.alloc[valid][:, compute] > 0
            empty = exists & (self.used[valid][:, compute] == 0) & (self.used[valid][:, memory] == 0)
            free = int(np.maximum(empty.sum(axis=1) - self.used[valid, self._col[CARDS_ANY]], 0).sum())
        return cards, held, free

    def pods_on(self, node: str) -> Iterator[Pod]:
        for uid, (n, _) in self.charges.items():
            if n == node:
                yield self.pods[uid]

    def check_books(self) -> None:
        """The invariants cheap enough for every step: no pod both pending and charged,
        every assumed pod charged, no usage below zero. Raises :class:`StateError`."""
        both = self.pending.keys() & self.charges.keys()
        if both:
            raise StateError(f"pods both pending and charged to a node: {sorted(both)[:5]}")
        uncharged = self.assumed.keys() - self.charges.keys()
        if uncharged:
            raise StateError(f"assumed pods not charged to their node: {sorted(uncharged)[:5]}")
        if bool((self.used < 0).any()):
            bad = [n for n, r in self.node_row.items() if bool((self.used[r] < 0).any())]
            raise StateError(f"usage below zero on nodes {bad[:5]}")

    def check(self) -> None:
        """Recompute ``used`` from the charges; raise :class:`StateError` if it differs."""
        expect = np.zeros_like(self.used)
        for _uid, (node, vec) in self.charges.items():
            row = self.node_row.get(node)
            if row is not None:
                expect[row] += vec
        if not np.array_equal(expect, self.used):
            bad = [n for n, r in self.node_row.items() if not np.array_equal(expect[r], self.used[r])]
            raise StateError(f"usage bookkeeping is off on nodes {bad[:5]}")
