"""Placement within a cycle: the kernel call, the units' layouts and why a pod fits nowhere.

:class:`CycleKernels` is what placement keeps between cycles (the kernel or its twin, the
node filter and scoring caches, the topology domains, the running pods' topology).
:class:`Placer` is one cycle's use of them over its snapshot: it lays units out
(:mod:`batchsched.core.placement.layout`), places them on the working usage of the
cycle's :class:`~batchsched.core.statement.Statement` (the kernel writes it in place; every
other change of usage is told to the statement's node views), and explains a pod that
fits no node. It writes nothing else: binding, charging a queue or holding a nomination is
for the caller to record on the statement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.dra.book import DeviceCycle
from batchsched.core.mirror import Snapshot
from batchsched.core.model import Pod
from batchsched.core.placement import kernels, reference
from batchsched.core.placement.cards import CardPolicy, descriptor, shortfalls
from batchsched.core.placement.layout import (
    Layout,
    PlacementCaches,
    build_layout,
    narrow,
    request_matrix,
)
from batchsched.core.placement.podtopology import PodSource, TopologyCache
from batchsched.core.placement.problem import Place, PlacementProblem
from batchsched.core.placement.scoring import ScoringArrays, ScoringConfig
from batchsched.core.placement.topology import (
    DomainCache,
    Domains,
    TopologyLevels,
    place_gang_topology,
    topology_placer,
)
from batchsched.core.placement.views import NodeViews
from batchsched.core.plan import Unit
from batchsched.core.statement import Statement

__all__ = ["CycleKernels", "Placer"]

IntArray = npt.NDArray[np.int64]


class CycleKernels:
    """What placement keeps between cycles (node filter, scoring arrays, topology domains,
    the running pods' topology), and the kernels: numba's, or their plain-Python twins
    (``use_jit=False``). ``levels``: the topology levels gangs may ask for (the default
    ones when None)."""

    def __init__(
        self, scoring: ScoringConfig, *, use_jit: bool = True, levels: TopologyLevels | None = None,
        cards: CardPolicy | None = None,
    ) -> None:
        self.cards = cards if cards is not None else CardPolicy()
        self.cards.validate()
        scoring.validate()
        self.scoring = scoring
        self.levels = levels if levels is not None else TopologyLevels()
        self._domain_cache = DomainCache()
        self._place: Place = kernels.place if use_jit else reference.place
        self._insufficient: Callable[..., Any] = (
            kernels.insufficient_counts if use_jit else reference.insufficient_counts
        )
        self.caches = PlacementCaches(scoring)
        self._pod_topology = TopologyCache()

    def _topology(self, snap: Snapshot) -> Domains:
        return self._domain_cache.get(snap.nodes, self.levels)

    def arrays(self, snap: Snapshot) -> ScoringArrays:
        """The scoring arrays of ``snap``'s resources, with its device descriptor."""
        return replace(
            self.caches.scoring_arrays(snap.columns),
            device=descriptor(snap.columns, self.cards, snap.card_mix),
        )


class Placer:
    """Placement over one cycle's snapshot, on the usage of ``st``. ``arrays``:
    :meth:`CycleKernels.arrays` of the snapshot; ``state``: the running pods, for the rules
    that depend on them (:mod:`batchsched.core.placement.podtopology`)."""

    def __init__(
        self, cycle: CycleKernels, snap: Snapshot, st: Statement, arrays: ScoringArrays,
        state: PodSource | None = None, devices: DeviceCycle | None = None,
    ) -> None:
        self.cycle = cycle
        #: the cycle's DRA devices: where pods like a member were refused their devices
        self.devices = devices
        self.snap = snap
        self.st = st
        self.filt, self.rows = cycle.caches.node_filter(snap.nodes, snap.node_generation)
        self.arrays = arrays
        self.col = {c: i for i, c in enumerate(snap.columns)}
        self.explain_cache: dict[tuple[Any, ...], str] = {}
        self.kernel_time = 0.0
        self.layouts: dict[str, Layout] = {}
        #: unit key -> its layout narrowed to the domain its placed members are in
        self.narrowed: dict[str, Layout] = {}
        self._domains: Domains | None = None
        self.requests: dict[str, IntArray | None] = {}
        self.topo = cycle._pod_topology.begin(self.filt, self.rows, state, snap, arrays, cycle._place, cycle._insufficient)

    @property
    def used(self) -> IntArray:
        """The working usage: the statement's."""
        return self.st.used

    @property
    def views(self) -> NodeViews:
        return self.st.views

    def touch(self, rows: Any) -> None:
        self.st.touch(rows)

    # -- layouts ------------------------------------------------------------------------------

    def request_matrix(self, pods: Sequence[Pod], key: str | None = None) -> IntArray | None:
        if key is not None and key in self.requests:
            return self.requests[key]
        reqs = request_matrix(pods, self.col)
        if key is not None:
            self.requests[key] = reqs
        return reqs

    def layout(self, pods: Sequence[Pod], key: str | None = None) -> Layout:
        if key is not None:
            cached = self.layouts.get(key)
            if cached is not None:
                return cached
        out = build_layout(pods, self.request_matrix(pods, key), self.filt, len(self.snap.nodes))
        if self.devices is not None:
            out = self._without_refused(pods, out)
        if key is not None:
            self.layouts[key] = out
        return out

    def _refused_reason(self, pod: Pod) -> dict[str, int]:
        """The nodes the filter lets ``pod`` use where pods like it were refused their
        devices, as a reason: ``{"node(s) could not allocate its ResourceClaims (n1: ...)": 1}``."""
        refused = self.devices.book.refused_nodes(pod) if self.devices is not None and pod.may_claim_devices else {}
        if not refused:
            return {}
        static = self.filt.mask(pod)
        here = sorted(n for n in refused if (row := self.rows.get(n)) is not None and static[row])
        if not here:
            return {}
        return {explain.devices_refused_on(here[0], refused[here[0]]): len(here)}

    def _without_refused(self, pods: Sequence[Pod], lay: Layout) -> Layout:
        """``lay`` without the nodes where pods like a member were refused their devices
        (:meth:`~batchsched.core.dra.book.DeviceBook.refused_nodes`)."""
        assert self.devices is not None
        for m, pod in enumerate(pods):
            if not pod.may_claim_devices:
                continue
            for name in self.devices.book.refused_nodes(pod):
                row = self.rows.get(name)
                if row is not None and lay.masks[int(lay.sig[m]), row]:
                    lay = lay.without(m, row)
        return lay

    def domains(self) -> Domains:
        """The topology domains of the snapshot's nodes (built once, when first needed)."""
        if self._domains is None:
            self._domains = self.cycle._topology(self.snap)
        return self._domains

    def unit_layout(self, unit: Unit) -> Layout:
        """:meth:`layout` of the unit's pods; for a gang that must stay inside one domain
        and already has members placed there, with its masks narrowed to that domain."""
        lay = self.layout(unit.pods, unit.key)
        level = unit.topology_level
        if level is None or not unit.topology_required or not unit.placed_on:
            return lay
        narrowed = self.narrowed.get(unit.key)
        if narrowed is not None:
            return narrowed
        # the domain of the first placed member on a known node that has the level's label
        rows = (self.rows.get(name, -1) for name in unit.placed_on)
        found = (narrow(lay, self.domains(), level, r) for r in rows if r >= 0)
        narrowed = next((n for n in found if n), None)
        if narrowed is None:
            return lay  # nothing to keep to: place the rest as a gang of its own
        self.narrowed[unit.key] = narrowed
        return narrowed

    def quorum_vector(self, unit: Unit) -> IntArray:
        reqs = self.request_matrix(unit.pods, unit.key)
        if reqs is None:
            return np.zeros(len(self.snap.columns), dtype=np.int64)
        n = 1 if unit.single else unit.min_count
        out: IntArray = reqs[:n].sum(axis=0)
        return out

    # -- messages -----------------------------------------------------------------------------

    def explain(
        self, pod: Pod, req: IntArray | None, mask: npt.NDArray[np.bool_], usage: IntArray | None = None
    ) -> str:
        """Why ``pod`` fits no node, against ``usage`` (the working usage by default)."""
        if req is not None and self.topo.affected((pod,)):
            return self.topo.explain(pod, req, mask, self.used if usage is None else usage)
        key = (pod.constraint_key(), None if req is None else req.tobytes())
        cached = self.explain_cache.get(key) if usage is None else None
        if cached is not None:
            return cached
        if req is None:
            missing = sorted(set(pod.requests) - set(self.col))
            message = explain.no_node_has(len(self.snap.nodes), missing)
        else:
            use = self.used if usage is None else usage
            counts = self.cycle._insufficient(self.snap.alloc, use, req, mask)
            insufficient = {self.snap.columns[r]: int(n) for r, n in enumerate(counts) if n > 0}
            cards = shortfalls(self.snap.alloc, use, req, mask, self.arrays.device) if pod.card_asks else None
            message = self.filt.explain(pod, insufficient, {**(cards or {}), **self._refused_reason(pod)})
        if usage is None:
            self.explain_cache[key] = message
        return message

    def explain_member(self, pod: Pod, lay: Layout, m: int) -> str:
        """Why member ``m`` of a unit fits no node it may use (its domain's, when narrowed)."""
        req = None if lay.reqs is None else lay.reqs[m]
        mask = lay.masks[lay.sig[m]]
        if not lay.domain:
            return self.explain(pod, req, mask)
        # not cached: the cache is keyed by the pod's constraints, which do not narrow
        detail = self.explain(pod, req, mask, self.used)
        return explain.stays_in_domain(lay.domain, detail)

    # -- placing ------------------------------------------------------------------------------

    def _problem(self, reqs: IntArray, lay: Layout, sig: IntArray, min_count: int) -> PlacementProblem:
        """Members ``reqs`` (signatures ``sig``, masks and static scores of ``lay``) on the
        snapshot's nodes and the statement's usage, scored as this cycle scores."""
        return PlacementProblem(self.snap.alloc, self.used, reqs, sig, lay.masks, lay.static, self.arrays, min_count)

    def _kernel(self, reqs: IntArray, lay: Layout, sig: IntArray, min_count: int, out: IntArray,
                place: Place | None = None, pods: Sequence[Pod] = ()) -> int:
        k0 = time.perf_counter()
        fn = place or self.cycle._place
        problem = self._problem(reqs, lay, sig, min_count)
        if fn is kernels.place and pods and not lay.domain:
            # the plain layout of these pods on the statement's usage: the kinds' views carry over
            placed = kernels.place(problem, out, views=self.views, kinds=self.views.kinds(pods))
        else:
            placed = fn(problem, out)
            self.touch(out[: reqs.shape[0]][out[: reqs.shape[0]] >= 0])
        self.kernel_time += time.perf_counter() - k0
        return int(placed)

    def place(self, unit: Unit, lay: Layout, k: int, mc: int, out: IntArray) -> tuple[int, str]:
        """Place the first ``k`` members of ``unit``, the first ``mc`` all or none:
        ``(members placed, where)``.

        Without a topology policy, and for elastic extras alone (``mc == 0``: their quorum
        is placed, the masks keep them to its domain when it must be kept), the kernel
        places them as they are, and ``where`` is the domain the masks were narrowed to
        (if any). A gang with a policy goes through :func:`place_gang_topology`: ``where``
        is the domain it got, or :data:`CLUSTER`, or when nothing was placed, why."""
        assert lay.reqs is not None
        reqs = np.ascontiguousarray(lay.reqs[:k])
        sig = lay.sig[:k]
        level = unit.topology_level
        if level is None or mc == 0:
            placed = self._kernel(reqs, lay, sig, mc, out, self.topo.kernel(unit.pods), unit.pods[:k])
            self._placed(reqs, out, k, placed)
            return placed, lay.domain if placed else ""
        k0 = time.perf_counter()
        placed, where = place_gang_topology(
            self._problem(reqs, lay, sig, mc), out,
            self.domains(), required_level=level if unit.topology_required else None,
            place=self.topo.kernel(unit.pods), columns=self.snap.columns,
        )
        self.touch(out[:k][out[:k] >= 0])
        self.kernel_time += time.perf_counter() - k0
        self._placed(reqs, out, k, placed)
        return placed, where

    def _placed(self, reqs: IntArray, out: IntArray, k: int, placed: int) -> None:
        """Tell the statement, inside an attempt, what the kernel added (to discard it)."""
        if placed and self.st.trying:
            members = np.flatnonzero(out[:k] >= 0)
            self.st.placed(out[members], reqs[members])

    def free_room_first(self, reqs: IntArray, lay: Layout, out: IntArray, pods: Sequence[Pod]) -> None:
        """Place single pods, in their order, on room nothing holds first; those that do not
        fit there then on room victims still hold (they wait for them, nominated). A pod
        submitted earlier is not left waiting for a victim while a later one takes free room."""
        if not self.st.gone.remaining():
            self._kernel(reqs, lay, lay.sig, 0, out, pods=pods)
            return
        with self.st.victims_room_closed():
            self._kernel(reqs, lay, lay.sig, 0, out, pods=pods)
        left = np.flatnonzero(out < 0)
        if len(left):
            rest = np.full(len(left), -1, dtype=np.int64)
            self._kernel(np.ascontiguousarray(reqs[left]), lay, np.ascontiguousarray(lay.sig[left]), 0, rest,
                         pods=[pods[int(i)] for i in left])
            out[left] = rest

    def placer(self, unit: Unit) -> Place:
        """The placement the victim search checks room with: topology-aware for a gang with
        a policy, so that the room it frees is room the gang can use."""
        level = unit.topology_level
        place = self.topo.kernel(unit.pods)
        if level is None:
            return place
        return topology_placer(
            self.domains(), required_level=level if unit.topology_required else None,
            place=place, columns=self.snap.columns,
        )
