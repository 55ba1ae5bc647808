"""A unit's members as the kernels take them: a :class:`Layout`.

The members' half of a :class:`~batchsched.core.placement.problem.PlacementProblem`: their
request matrix (one row per member, one column per resource of the snapshot), and per
distinct set of constraints (a *signature*) the nodes they may use and the static score of
each node. Members that ask alike share a
signature, so a gang of 64 identical pods has one mask row, not 64.

The helpers here build layouts from pods and plain values (the snapshot's columns and
nodes, a :class:`~batchsched.core.placement.nodefilter.NodeFilter`), narrow one to a
topology domain, and explain why a gang's quorum does not fit; the cycle caches them per
unit. Pure: arrays in, arrays out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.devices import shown
from batchsched.core.model import Node, Pod
from batchsched.core.placement.nodefilter import NodeFilter
from batchsched.core.placement.problem import Place, PlacementProblem
from batchsched.core.placement.scoring import ScoringArrays, ScoringConfig
from batchsched.core.placement.topology import Domains

__all__ = ["Layout", "build_layout", "gang_message", "narrow", "request_matrix"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True, frozen=True, eq=False)
class Layout:
    """A unit's members as the kernel takes them.

    ``reqs``: member x resource (None when some member asks for a resource no node has);
    ``sig``: each member's signature; ``masks`` and ``static``: signature x node, the nodes
    it may use and their static score."""

    reqs: IntArray | None
    sig: IntArray
    masks: BoolArray
    static: IntArray
    #: the topology domain the masks were narrowed to (``rack r-3``), when they were
    domain: str = ""

    def without(self, m: int, row: int) -> Layout:
        """This layout with node ``row`` taken from member ``m``'s signature (so from every
        member alike): where that member's devices could not be allocated."""
        masks = self.masks.copy()
        masks[int(self.sig[m]), row] = False
        return Layout(self.reqs, self.sig, masks, self.static, self.domain)

    def member(self, m: int) -> Layout:
        """Member ``m`` alone, as a layout of one (signature 0)."""
        assert self.reqs is not None
        s = int(self.sig[m])
        return Layout(self.reqs[m : m + 1], np.zeros(1, dtype=np.int64),
                      self.masks[s : s + 1], self.static[s : s + 1])


def request_matrix(pods: Sequence[Pod], col: Mapping[str, int]) -> IntArray | None:
    """The pods' requests, member x column (``col``: column name -> index); None when a
    pod asks for a resource that is not a column."""
    reqs: IntArray | None = np.zeros((len(pods), len(col)), dtype=np.int64)
    prev: Mapping[str, int] | None = None
    assert reqs is not None
    for m, pod in enumerate(pods):
        if prev is not None and pod.requests == prev:
            reqs[m] = reqs[m - 1]  # gang members mostly ask alike
            continue
        prev = pod.requests
        for name, value in pod.requests.items():
            c = col.get(name)
            if c is None:
                reqs = None
                break
            reqs[m, c] = value
        if reqs is None:
            break
    return reqs


def build_layout(pods: Sequence[Pod], reqs: IntArray | None, filt: NodeFilter, n_nodes: int) -> Layout:
    """The layout of ``pods`` (with their :func:`request_matrix`) over ``n_nodes`` nodes."""
    sig_keys: dict[tuple[Any, ...], int] = {}
    sig = np.empty(len(pods), dtype=np.int64)
    rep: list[Pod] = []
    for m, pod in enumerate(pods):
        k = (pod.constraint_key(), bool(pod.invalid))
        s = sig_keys.get(k)
        if s is None:
            s = sig_keys[k] = len(rep)
            rep.append(pod)
        sig[m] = s
    masks = np.zeros((len(rep), n_nodes), dtype=np.bool_)
    static = np.zeros((len(rep), n_nodes), dtype=np.int64)
    for s, pod in enumerate(rep):
        if not pod.invalid:
            masks[s] = filt.mask(pod)
            static[s] = filt.static_score(pod)
    return Layout(reqs, sig, masks, static)


def narrow(lay: Layout, domains: Domains, level: int, row: int) -> Layout | None:
    """``lay`` with its masks narrowed to the domain of ``level`` holding node ``row``;
    None when the node has no label for that level."""
    domain = domains.domain_of(level, row)
    if domain < 0:
        return None
    return Layout(lay.reqs, lay.sig, lay.masks & domains.nodes_of(level, domain),
                  lay.static, domains.label(level, domain))


def gang_message(
    pods: Sequence[Pod],
    min_count: int,
    lay: Layout,
    why: Callable[..., str],
    *,
    alloc: IntArray,
    used: IntArray,
    columns: Sequence[str],
    arrays: ScoringArrays,
    place: Place,
) -> str:
    """Why a gang was not placed: how many members fit at most, and what stopped the rest.
    ``why(pod, req, mask[, usage])``: why one pod fits no node."""
    reqs, sig, masks = lay.reqs, lay.sig, lay.masks
    if len(pods) < min_count:
        return explain.members_missing(len(pods), min_count)
    if reqs is None:
        return why(pods[0], None, masks[sig[0]])
    # how many of the quorum fit on their own (best effort, on a scratch copy)
    scratch_used = used.copy()
    out = np.full(len(pods), -1, dtype=np.int64)
    placeable = place(
        PlacementProblem(alloc, scratch_used, reqs, sig, masks, np.zeros_like(masks, dtype=np.int64), arrays, 0),
        out,
    )
    first_missing = int(np.argmax(out < 0)) if placeable < len(pods) else 0
    # the first member that did not fit, next to the members placed before it
    detail = why(
        pods[first_missing], reqs[first_missing], masks[sig[first_missing]], scratch_used
    )
    need = {}
    for c, name in enumerate(columns):
        total = int(reqs[:min_count, c].sum())
        if total and name != "pods":
            need[name] = total
    return explain.gang_short(min_count, shown(need), placeable, pods[first_missing].name, detail)


class PlacementCaches:
    """What placement keeps between cycles: the node filter and the row of each node (rebuilt
    when the nodes change), and the scoring arrays (rebuilt when the resource columns do)."""

    def __init__(self, scoring: ScoringConfig) -> None:
        self.scoring = scoring
        self._filter: NodeFilter | None = None
        self._filter_key: tuple[int, int] = (-1, -1)
        self._rows: dict[str, int] = {}
        self._arrays: ScoringArrays | None = None
        self._columns: tuple[str, ...] = ()

    def node_filter(self, nodes: Sequence[Node], generation: int) -> tuple[NodeFilter, dict[str, int]]:
        key = (generation, len(nodes))
        if self._filter is None or key != self._filter_key:
            self._filter = NodeFilter(nodes)
            self._filter_key = key
            self._rows = {n.name: i for i, n in enumerate(nodes)}
        return self._filter, self._rows

    def scoring_arrays(self, columns: tuple[str, ...]) -> ScoringArrays:
        if self._arrays is None or columns != self._columns:
            self._arrays = self.scoring.arrays(columns)
            self._columns = columns
        return self._arrays
