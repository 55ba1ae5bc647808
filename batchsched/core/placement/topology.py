"""Topology-aware gang placement: keep a gang's pods in one rack, else one block.

Distributed training talks most between the members of one gang, and the network is
fastest inside a rack, then inside a block (a group of racks on one spine). Nodes say
where they sit with labels, one label key per *level*, narrowest first
(:class:`TopologyLevels`, by default ``batchsched.io/rack`` then ``batchsched.io/block``).
A *domain* is the set of nodes sharing one value of one level's label.

:func:`place_gang_topology` wraps the placement kernel
(:func:`batchsched.core.placement.kernels.place`, or its twin): for each level, narrowest
first, it tries the level's domains one by one with the members' masks restricted to the
domain's nodes, and keeps the first domain that holds the gang's quorum (members
``0..min_count-1``). Domains are tried tightest first: least free of the quorum's dominant
resource that still covers the quorum's total (leftover capacity stays in big pieces for
the next big gang), ties by domain name. A domain whose free capacity, summed over the
nodes the quorum may use, is short of the quorum's total in any resource is skipped
without calling the kernel. When no domain holds the quorum, a *preferred* topology falls
back to the whole cluster and a *required* one fails with a message saying how far off the
biggest domain is.

Elastic members (from ``min_count`` on) ride along, best effort: inside the winning domain
first; under a preferred topology those that do not fit there go anywhere.

Users choose per gang with one annotation (:func:`topology_policy`):
``batchsched.io/topology: rack`` (required) or ``batchsched.io/topology-preferred: block``.

Nodes without a level's label belong to no domain of that level: they are used only by the
cluster-wide fallback. An empty label value counts as no label.

Pure and deterministic, like the kernels: plain arrays in, the same placement out.
:class:`Domains` is derived from the node list only; :class:`DomainCache` keeps the last
one so a cycle over unchanged nodes does not rebuild it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from batchsched.core.devices import internal, shown
from batchsched.core.model import PODS, Node
from batchsched.core.placement.problem import Place, PlacementProblem
from batchsched.core.placement.scoring import BoolArray, IntArray
from batchsched.core.quantity import format_units

__all__ = [
    "BLOCK_LABEL",
    "CLUSTER",
    "RACK_LABEL",
    "TOPOLOGY_ANNOTATION",
    "TOPOLOGY_PREFERRED_ANNOTATION",
    "DomainCache",
    "Domains",
    "TopologyLevels",
    "place_gang_topology",
    "topology_placer",
    "topology_policy",
]

RACK_LABEL: Final = "batchsched.io/rack"
BLOCK_LABEL: Final = "batchsched.io/block"
TOPOLOGY_ANNOTATION: Final = "batchsched.io/topology"
"""``rack`` or ``block``: the gang must be placed inside one domain of that level."""
TOPOLOGY_PREFERRED_ANNOTATION: Final = "batchsched.io/topology-preferred"
"""``rack`` or ``block``: keep the gang together if possible, else place it anywhere."""
CLUSTER: Final = "cluster"
"""The label :func:`place_gang_topology` returns for a placement by the cluster fallback."""


@dataclass(slots=True, frozen=True)
class TopologyLevels:
    """Node label keys, one per topology level, from the narrowest to the widest.

    A level's short name (``rack``) is its key after the last ``/``; users name levels by
    it in annotations and messages, so short names must be distinct.
    """

    keys: tuple[str, ...] = (RACK_LABEL, BLOCK_LABEL)

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("topology needs at least one level")
        names = [_short(k) for k in self.keys]
        if any(not n for n in names):
            raise ValueError(f"topology level keys must not be empty or end in '/': {self.keys}")
        if len(set(names)) != len(names):
            raise ValueError(f"topology levels need distinct names, got {', '.join(names)}")

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(_short(k) for k in self.keys)

    def name(self, level: int) -> str:
        return _short(self.keys[level])

    def index(self, name: str) -> int:
        """The level called ``name`` (``rack``); ValueError if there is none."""
        try:
            return self.names.index(name)
        except ValueError:
            known = ", ".join(self.names)
            raise ValueError(f"{name!r} is not a topology level; use one of {known}") from None


    def level_of_key(self, key: str) -> int:
        """The level whose node label key is ``key`` (a ``scheduling.k8s.io`` PodGroup's
        topology constraint names the label); ValueError if none is."""
        try:
            return self.keys.index(key)
        except ValueError:
            known = ", ".join(self.keys)
            raise ValueError(
                f"topology key {key!r} is not one of the configured topology levels ({known}); "
                "add it to topology.levels in the configuration"
            ) from None


def _short(key: str) -> str:
    return key.rsplit("/", 1)[-1]


# -- domains ------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True, eq=False)
class Domains:
    """Which domain of each level every node belongs to. Build with :meth:`build`.

    Per level ``j``: ``ids[j]`` is an ``[N]`` array of domain ids (-1: the node has no such
    label) and ``names[j][d]`` the label value of domain ``d``. Ids follow the sorted
    names, so ordering by id is ordering by name.
    """

    levels: TopologyLevels
    ids: tuple[IntArray, ...]
    names: tuple[tuple[str, ...], ...]
    #: per level, the labelled nodes grouped by domain, and where each domain starts
    _order: tuple[IntArray, ...] = field(repr=False)
    _starts: tuple[IntArray, ...] = field(repr=False)
    #: per level, ``[D, L]``: the domain of level k that holds all of domain d, or -1
    _within: tuple[IntArray, ...] = field(repr=False)

    @classmethod
    def build(cls, nodes: Sequence[Node], levels: TopologyLevels | None = None) -> Domains:
        levels = levels if levels is not None else TopologyLevels()
        ids: list[IntArray] = []
        names: list[tuple[str, ...]] = []
        orders: list[IntArray] = []
        starts: list[IntArray] = []
        for key in levels.keys:
            values = [node.labels.get(key) or "" for node in nodes]
            level_names = tuple(sorted({v for v in values if v}))
            index = {name: d for d, name in enumerate(level_names)}
            level_ids = np.array([index.get(v, -1) for v in values], dtype=np.int64)
            order = np.argsort(level_ids, kind="stable")
            order = order[level_ids[order] >= 0].astype(np.int64)
            counts = np.bincount(level_ids[order], minlength=len(level_names))
            ids.append(level_ids)
            names.append(level_names)
            orders.append(order)
            starts.append((np.cumsum(counts) - counts).astype(np.int64))
        within: list[IntArray] = []
        for j in range(len(levels)):
            table = np.full((len(names[j]), len(levels)), -1, dtype=np.int64)
            if len(names[j]):
                for k in range(len(levels)):
                    seg = ids[k][orders[j]]
                    low = np.minimum.reduceat(seg, starts[j])
                    high = np.maximum.reduceat(seg, starts[j])
                    table[:, k] = np.where((low == high) & (low >= 0), low, -1)
            within.append(table)
        return cls(levels, tuple(ids), tuple(names), tuple(orders), tuple(starts), tuple(within))

    @property
    def n_nodes(self) -> int:
        return int(self.ids[0].shape[0])

    def count(self, level: int) -> int:
        """How many domains the level has."""
        return len(self.names[level])

    def nodes_of(self, level: int, domain: int) -> BoolArray:
        """``[N]``: the nodes of one domain."""
        mask: BoolArray = self.ids[level] == domain
        return mask

    def domain_of(self, level: int, node: int) -> int:
        """The domain id of ``node`` at ``level``, -1 when it has no such label."""
        return int(self.ids[level][node])

    def label(self, level: int, domain: int) -> str:
        """``rack r-07``: how the domain is named in results and messages."""
        return f"{self.levels.name(level)} {self.names[level][domain]}"

    def within(self, level: int, wider: int) -> IntArray:
        """``[D]`` for the domains of ``level``: the domain of level ``wider`` holding all of
        its nodes, or -1 when its nodes straddle several (or some lack the wider label)."""
        column: IntArray = self._within[level][:, wider]
        return column

    def totals(self, level: int, values: IntArray) -> IntArray:
        """``[D, R]``: ``values[N, R]`` summed over each domain's nodes (exact int64)."""
        if not len(self.names[level]):
            return np.zeros((0, values.shape[1]), dtype=np.int64)
        out: IntArray = np.add.reduceat(values[self._order[level]], self._starts[level], axis=0)
        return out


class DomainCache:
    """The :class:`Domains` of the last node list asked for, rebuilt only when it changes.

    Node values are immutable and the cluster mirror keeps the same object for a node
    until an event replaces it, so "the same nodes" is checked by identity, element by
    element (cheap next to reading every label). One per :class:`~batchsched.core.cycle.Cycle`.
    """

    __slots__ = ("_domains", "_levels", "_nodes")

    def __init__(self) -> None:
        self._nodes: tuple[Node, ...] = ()
        self._levels: TopologyLevels | None = None
        self._domains: Domains | None = None

    def get(self, nodes: Sequence[Node], levels: TopologyLevels | None = None) -> Domains:
        levels = levels if levels is not None else TopologyLevels()
        cached = self._domains
        if (
            cached is not None
            and levels == self._levels
            and len(nodes) == len(self._nodes)
            and all(map(operator.is_, nodes, self._nodes))
        ):
            return cached
        domains = Domains.build(nodes, levels)
        self._nodes, self._levels, self._domains = tuple(nodes), levels, domains
        return domains


# -- the policy a gang asks for -------------------------------------------------------------


def topology_policy(
    annotations: Mapping[str, str], levels: TopologyLevels | None = None
) -> tuple[int | None, bool]:
    """``(level, required)`` from a gang's annotations; ``(None, False)`` when it asks nothing.

    ``batchsched.io/topology: rack`` -> ``(0, True)``;
    ``batchsched.io/topology-preferred: block`` -> ``(1, False)`` (default levels).
    Raises ValueError with a one-line message for an unknown level or both annotations set.
    """
    levels = levels if levels is not None else TopologyLevels()
    required = annotations.get(TOPOLOGY_ANNOTATION)
    preferred = annotations.get(TOPOLOGY_PREFERRED_ANNOTATION)
    if required is not None and preferred is not None:
        raise ValueError(
            f"set only one of the annotations {TOPOLOGY_ANNOTATION} and "
            f"{TOPOLOGY_PREFERRED_ANNOTATION}"
        )
    key, value = (
        (TOPOLOGY_ANNOTATION, required)
        if required is not None
        else (TOPOLOGY_PREFERRED_ANNOTATION, preferred)
    )
    if value is None:
        return None, False
    try:
        level = levels.index(value.strip().lower())
    except ValueError:
        known = " or ".join(levels.names)
        raise ValueError(f"annotation {key}: {value!r} is not {known}") from None
    return level, required is not None


# -- placement ----------------------------------------------------------------------------


def place_gang_topology(
    problem: PlacementProblem,
    out: IntArray,
    domains: Domains,
    *,
    required_level: int | None,
    place: Place,
    columns: Sequence[str] = (),
) -> tuple[int, str]:
    """Place a gang inside one domain, narrowest level first; ``(members placed, where)``.

    ``problem`` as ``place`` (the kernel or its twin) takes it, with ``domains`` built for
    the same node rows. ``columns`` names the resource columns, for messages.

    ``required_level=None`` (a preferred topology): every level is tried, then the whole
    cluster. ``required_level=k``: levels ``0..k`` only, a domain of a narrower level only
    when it lies inside one domain of level k, and no fallback.

    On success ``problem.used`` holds the placed members, ``out[m]`` each member's node (-1
    for an extra that found none) and ``where`` is the domain (``rack r-07``, ``block b-1``)
    or :data:`CLUSTER`. On failure nothing is changed, ``out[:M]`` is -1, the count is 0
    and ``where`` says why, in a line for the user.

    With ``min_count == 0`` there is no quorum to keep together: the members are placed by
    ``place`` over ``masks`` as given (a caller placing the extras of a gang whose quorum is
    already bound restricts ``masks`` to that quorum's domain itself).
    """
    _check_arguments(problem, out, domains, required_level)
    min_count = problem.min_count
    n_members = problem.reqs.shape[0]
    out[:n_members] = -1
    if min_count > n_members:
        return 0, f"the gang needs {min_count} members and has {n_members}"

    if min_count <= 0:
        placed = place(problem, out)
        return placed, CLUSTER if placed else "none of the members fits on any node"

    quorum = _Quorum.of(problem, columns)
    # The kernel gives ``scratch`` back unchanged whenever the quorum does not fit, so one
    # copy serves every attempt; it reaches ``used`` only once a placement is kept.
    scratch = problem.used.copy()
    on_scratch = problem._replace(used=scratch)
    placed, where, level_free, fitting = _search_domains(
        on_scratch, out, domains, quorum, required_level=required_level, place=place,
    )
    if placed:
        problem.used[...] = scratch
        return placed, where

    if required_level is None:
        placed = place(on_scratch, out)
        if placed:
            problem.used[...] = scratch
            return placed, CLUSTER
        return 0, f"the gang's {min_count} members do not fit on the nodes together"
    k = required_level
    return 0, _no_domain_message(
        domains, k, level_free[k], fitting[k], quorum.demand, quorum.dominant, min_count,
        quorum.allowed, columns,
    )


def _check_arguments(problem: PlacementProblem, out: IntArray, domains: Domains,
                     required_level: int | None) -> None:
    levels = domains.levels
    if required_level is not None and not 0 <= required_level < len(levels):
        raise ValueError(f"required topology level {required_level} is not 0..{len(levels) - 1}")
    if domains.n_nodes != problem.alloc.shape[0]:
        raise ValueError("domains were built for another node list")
    if out.shape[0] < problem.reqs.shape[0]:
        raise ValueError("out must have one entry per member")


@dataclass(slots=True, frozen=True)
class _Quorum:
    """What a gang's quorum asks for in total and the room it may use, to rank domains."""

    demand: IntArray
    """The quorum's requests summed (card columns 0: the kernel checks cards one by one)."""
    allowed: BoolArray
    """The nodes some quorum member may use."""
    free: IntArray
    """Each node's free room (0 on nodes not allowed)."""
    dominant: int
    """The column domains are ordered by (:func:`_dominant`)."""

    @classmethod
    def of(cls, problem: PlacementProblem, columns: Sequence[str]) -> _Quorum:
        alloc, min_count = problem.alloc, problem.min_count
        demand: IntArray = problem.reqs[:min_count].sum(axis=0)
        for c, name in enumerate(columns):
            if internal(name):
                demand[c] = 0
        allowed: BoolArray = np.asarray(problem.masks[np.unique(problem.sig[:min_count])].any(axis=0))
        free: IntArray = np.maximum(alloc - problem.used, 0)
        free[~allowed] = 0
        capacity: IntArray = np.maximum(alloc, 0)[allowed].sum(axis=0)
        return cls(demand, allowed, free, _dominant(demand, capacity, columns))


def _search_domains(
    problem: PlacementProblem, out: IntArray, domains: Domains, quorum: _Quorum, *,
    required_level: int | None, place: Place,
) -> tuple[int, str, list[IntArray], list[int]]:
    """Try the domains level by level, narrowest first, each level's by free dominant
    resource (ties by name), those with room for the quorum in total only.

    Returns the members placed in the first domain that takes the quorum and its label
    (``0, ""`` when none does), with each level's free totals and number of domains with
    room, for the message. A preferred topology (``required_level`` None) spills the extras
    that do not fit there onto the other nodes (:func:`_spill`).
    """
    n_members = problem.reqs.shape[0]
    last = len(domains.levels) - 1 if required_level is None else required_level
    level_free: list[IntArray] = []
    fitting: list[int] = []  # per level, domains with enough free capacity in total
    for j in range(last + 1):
        totals = domains.totals(j, quorum.free)
        level_free.append(totals)
        ok = (totals >= quorum.demand).all(axis=1)
        if required_level is not None and j < required_level:
            ok &= domains.within(j, required_level) >= 0
        candidates = np.flatnonzero(ok)
        fitting.append(int(candidates.shape[0]))
        # stable sort of ids (= name order) by free dominant resource: ties go by name
        for d in candidates[np.argsort(totals[candidates, quorum.dominant], kind="stable")]:
            placed = place(problem._replace(masks=problem.masks & domains.nodes_of(j, int(d))), out)
            if placed == 0:
                continue
            if required_level is None and placed < n_members:
                placed += _spill(place, problem, out)
            return placed, domains.label(j, int(d)), level_free, fitting
    return 0, "", level_free, fitting


def topology_placer(
    domains: Domains,
    *,
    required_level: int | None,
    place: Place,
    columns: Sequence[str] = (),
) -> Place:
    """``place`` made topology-aware, with ``place``'s own signature.

    For code that takes a placement and should respect a gang's topology, such as
    :func:`batchsched.core.preemption.select_victims`: the victims it picks then make room
    inside one domain. The domain is not reported.
    """

    def placer(problem: PlacementProblem, out: IntArray, /) -> int:
        placed, _ = place_gang_topology(
            problem, out, domains, required_level=required_level, place=place, columns=columns,
        )
        return placed

    return placer


def _spill(place: Place, problem: PlacementProblem, out: IntArray) -> int:
    """Place the extras that found no node in the winning domain anywhere they may go
    (``problem``: the gang over the usage its quorum was placed on)."""
    reqs, min_count = problem.reqs, problem.min_count
    rest = np.flatnonzero(out[min_count : reqs.shape[0]] < 0) + min_count
    if not rest.shape[0]:
        return 0
    sub = np.full(rest.shape[0], -1, dtype=np.int64)
    rows = np.ascontiguousarray(reqs[rest])
    placed = place(problem._replace(reqs=rows, sig=np.ascontiguousarray(problem.sig[rest]), min_count=0), sub)
    reqs[rest] = rows  # with the cards the kernel gave them
    out[rest] = sub
    return placed


def _dominant(quorum: IntArray, capacity: IntArray, columns: Sequence[str]) -> int:
    """The quorum's dominant resource: the largest share of what its nodes have.

    ``pods`` only when nothing else is asked for; a resource the nodes do not have at all
    dominates (nothing can fit). Ties go to the lower column.
    """
    asked = [r for r in range(quorum.shape[0]) if quorum[r] > 0]
    named = [r for r in asked if r < len(columns) and columns[r] != PODS]
    if len(columns) == quorum.shape[0] and named:
        asked = named
    if not asked:
        return 0
    best = asked[0]
    for r in asked[1:]:
        # quorum[r] / capacity[r] > quorum[best] / capacity[best], in exact integers
        if int(quorum[r]) * int(capacity[best]) > int(quorum[best]) * int(capacity[r]):
            best = r
    return best


def _amount(r: int, value: int, columns: Sequence[str]) -> str:
    if r < len(columns):
        return f"{format_units(columns[r], value)} {columns[r]}"
    return f"{value} of resource #{r}"


def _no_domain_message(
    domains: Domains,
    level: int,
    free: IntArray,
    fitting: int,
    quorum: IntArray,
    dom: int,
    min_count: int,
    allowed: BoolArray,
    columns: Sequence[str],
) -> str:
    """Why a gang requiring one domain of ``level`` got none, in one line."""
    name = domains.levels.name(level)
    named = shown({columns[r]: int(quorum[r]) for r in range(min(quorum.shape[0], len(columns)))
                   if quorum[r] > 0 and columns[r] != PODS})
    needs = ", ".join(_amount(columns.index(c), v, columns) for c, v in named.items()) or "nothing"
    head = f"no {name} can hold the gang's {min_count} members together (they need {needs})"
    if not bool((domains.ids[level][allowed] >= 0).any()):
        return f"{head}: no node it may use has the label {domains.levels.keys[level]}"
    best = int(np.argmax(free[:, dom]))  # first of the largest: the lowest name
    text = (
        f"{head}; largest free in one {name}: {_amount(dom, int(free[best, dom]), columns)} "
        f"({domains.label(level, best)})"
    )
    if fitting:
        return (
            f"{text}; {fitting} {name}(s) have enough free in total, "
            f"but not on nodes where each member fits"
        )
    if free[best, dom] >= quorum[dom]:
        short = next(r for r in range(quorum.shape[0]) if free[best, r] < quorum[r])
        text += f" but only {_amount(short, int(free[best, short]), columns)} there"
    return text
