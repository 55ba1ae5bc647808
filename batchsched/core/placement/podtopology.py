"""Pod topology spread and required inter-pod (anti-)affinity: where a pod may go, given
where the other pods are.

The node filters of :mod:`batchsched.core.placement.predicates` look at a node alone. These
rules look at the pods around it, by *domain*: the nodes sharing one value of a topology
label (``kubernetes.io/hostname``, ``topology.kubernetes.io/zone``...). They follow
kube-scheduler's PodTopologySpread and InterPodAffinity plugins:

* ``topologySpreadConstraints`` with ``DoNotSchedule`` filter: on node n, ``matching pods
  in n's domain + (1 if the pod matches the selector itself) - the minimum over the
  eligible domains`` must be at most ``maxSkew``; with fewer eligible domains than
  ``minDomains`` the minimum is 0; a node without the topology label fits not. Eligible
  nodes carry every key of the pod's constraints, match its node affinity
  (``nodeAffinityPolicy: Honor``, the default) and tolerate its taints
  (``nodeTaintsPolicy: Honor``; ``Ignore`` is the default). ``matchLabelKeys`` add the
  pod's own values of those keys to the selector. ``ScheduleAnyway`` constraints score:
  fewer matching pods in a node's domain score higher (weight 2, as kube-scheduler's).
* Required pod affinity: every term's topology label on the node, and in its domain a pod
  that matches all the terms; when no pod anywhere matches them all and the pod matches
  them itself, anywhere with the labels (the first of a series that attract each other).
* Required pod anti-affinity: no pod matching a term in the node's domain for that term;
  and the symmetric rule: a running pod whose required anti-affinity term matches the pod
  forbids its domain.

A term's namespaces are its ``namespaces``, else the pod's own; an empty
``namespaceSelector`` (``{}``) selects every namespace; a non-empty one is refused (the pod
is reported, see :func:`~batchsched.core.placement.predicates.unsupported_reason`): the core does not see namespace labels here. A running
pod's anti-affinity term with a non-empty ``namespaceSelector`` is taken to select every
namespace, so that it is never violated.

Counted pods: those bound or assumed on a known node and not terminating, plus those this
cycle placed (:meth:`PodTopology.add`). Pods that carry such rules, or that a running
pod's anti-affinity selects, are placed one member at a time by :meth:`PodTopology.kernel`
(the placement kernel with ``k = 1`` per member, the masks recomputed from the counts so
far), so a gang's members count each other; everything else keeps the batched kernel.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from batchsched.core import explain
from batchsched.core.model import LabelSelector, Pod, PodAffinityTerm, Requirement, SpreadConstraint
from batchsched.core.placement.layout import Layout
from batchsched.core.placement.nodefilter import NodeFilter
from batchsched.core.placement.predicates import _add_insufficient, _message, unsupported_reason
from batchsched.core.placement.problem import Place, PlacementProblem
from batchsched.core.placement.scoring import ScoringArrays

__all__ = [
    "REASON_AFFINITY",
    "REASON_ANTI_AFFINITY",
    "REASON_EXISTING_ANTI_AFFINITY",
    "REASON_SPREAD",
    "REASON_SPREAD_LABEL",
    "SPREAD_WEIGHT",
    "PodSource",
    "PodTopology",
    "TopologyCache",
    "constrained",
]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

REASON_SPREAD = "node(s) didn't match pod topology spread constraints"
REASON_SPREAD_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"
REASON_AFFINITY = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
REASON_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"

#: the weight of the ScheduleAnyway score next to the static scores (kube-scheduler's)
SPREAD_WEIGHT = 2
_MAX_SCORE = 100

#: which pods a clause counts: namespaces (None: every namespace) and a selector (None:
#: no pod); a pod is counted when it matches every clause
Clause = tuple[frozenset[str] | None, LabelSelector | None]


def constrained(pod: Pod) -> bool:
    """Whether ``pod`` carries spread constraints or required pod (anti-)affinity."""
    return bool(pod.spread or pod.affinity_terms or pod.anti_affinity_terms)


def _selector_key(sel: LabelSelector | None) -> Any:
    if sel is None:
        return None
    return (tuple(sorted(sel.match_labels.items())), sel.expressions)


def _with(sel: LabelSelector | None, extra: Sequence[Requirement]) -> LabelSelector | None:
    if not extra:
        return sel
    if sel is None:
        return LabelSelector(expressions=tuple(extra))
    return LabelSelector(match_labels=sel.match_labels, expressions=(*sel.expressions, *extra))


def _spread_selector(pod: Pod, c: SpreadConstraint) -> LabelSelector | None:
    extra = [Requirement(k, "In", (pod.labels[k],)) for k in c.match_label_keys if k in pod.labels]
    return _with(c.selector, extra)


def _term_clause(owner: Pod, t: PodAffinityTerm) -> Clause:
    """What ``t`` of ``owner`` selects: its namespaces and its selector, with
    ``matchLabelKeys`` / ``mismatchLabelKeys`` taken from ``owner``'s labels."""
    extra = [Requirement(k, "In", (owner.labels[k],)) for k in t.match_label_keys if k in owner.labels]
    extra += [Requirement(k, "NotIn", (owner.labels[k],)) for k in t.mismatch_label_keys if k in owner.labels]
    if t.namespace_selector is not None:
        namespaces: frozenset[str] | None = None  # {} selects all; a non-empty one: see refusal
    elif t.namespaces:
        namespaces = frozenset(t.namespaces)
    else:
        namespaces = frozenset((owner.namespace,))
    return namespaces, _with(t.selector, extra)


def _matches(clauses: Iterable[Clause], pod: Pod) -> bool:
    for namespaces, sel in clauses:
        if sel is None or (namespaces is not None and pod.namespace not in namespaces):
            return False
        if not sel.matches(pod.labels):
            return False
    return True


class PodSource(Protocol):
    """Where the running pods are (the mirror, :class:`~batchsched.core.mirror.ClusterState`)."""

    @property
    def pods(self) -> Mapping[Any, Pod]: ...
    @property
    def charges(self) -> Mapping[Any, tuple[str, Any]]: ...
    @property
    def charge_generation(self) -> int: ...


@dataclass(slots=True)
class _Running:
    """The counted pods of a mirror generation, read when first needed: (pod, node row) of
    every pod, and of those with required anti-affinity (the symmetric rule)."""

    source: PodSource | None
    rows: Mapping[str, int]
    _pods: list[tuple[Pod, int]] | None = None
    _holders: list[tuple[Pod, int]] | None = None

    def _row(self, uid: Any) -> tuple[Pod, int] | None:
        assert self.source is not None
        pod = self.source.pods.get(uid)
        charged = self.source.charges.get(uid)
        row = None if charged is None else self.rows.get(charged[0])
        if pod is None or row is None or pod.deleting:
            return None
        return pod, row

    @property
    def holders(self) -> list[tuple[Pod, int]]:
        """Only pods with required anti-affinity are looked at (a pass over the charged
        pods with no allocation: the plain path pays this much in a cycle that tries any
        unit). In no particular order: each is read on its own."""
        if self._holders is None:
            self._holders = []
            if self.source is not None:
                pods = self.source.pods
                for uid in self.source.charges:
                    pod = pods.get(uid)
                    if pod is not None and pod.anti_affinity_terms:
                        hit = self._row(uid)
                        if hit is not None:
                            self._holders.append(hit)
        return self._holders

    @property
    def pods(self) -> list[tuple[Pod, int]]:
        if self._pods is None:
            self._pods = []
            if self.source is not None:
                for uid in self.source.charges:
                    hit = self._row(uid)
                    if hit is not None:
                        self._pods.append(hit)
        return self._pods


@dataclass(slots=True)
class TopologyCache:
    """Survives between cycles: the running pods, read again when the mirror changed."""

    _key: tuple[int, int, int] = (-1, -1, -1)
    _running: _Running | None = None

    def running(self, source: PodSource | None, rows: Mapping[str, int], node_generation: int) -> _Running:
        if source is None:
            return _Running(None, rows)
        key = (id(source), source.charge_generation, node_generation)
        if self._running is None or key != self._key:
            self._running, self._key = _Running(source, rows), key
        return self._running

    def begin(
        self, filt: NodeFilter, rows: Mapping[str, int], source: PodSource | None, snap: Any,
        arrays: ScoringArrays, place: Place, insufficient: Callable[..., IntArray],
    ) -> PodTopology:
        """The rules for one cycle over ``snap`` (a :class:`~batchsched.core.mirror.Snapshot`;
        ``rows``: node name -> row), placing with ``place`` (the kernel or its twin) and
        explaining with ``insufficient`` (:func:`~batchsched.core.placement.kernels.insufficient_counts`
        or its twin)."""
        generation = int(snap.node_generation)
        return PodTopology(
            filt, lambda: self.running(source, rows, generation), snap.alloc, tuple(snap.columns),
            arrays, place, insufficient,
        )


@dataclass(slots=True)
class _Eval:
    """One pod against every node: may it go there, its spread score, and per node the
    first rule it breaks (an index into :data:`_REASONS`, -1 for none)."""

    ok: BoolArray
    score: IntArray
    reason: npt.NDArray[np.int8]


_REASONS = (
    REASON_SPREAD_LABEL, REASON_SPREAD, REASON_AFFINITY, REASON_ANTI_AFFINITY,
    REASON_EXISTING_ANTI_AFFINITY,
)


@dataclass(slots=True)
class PodTopology:
    """The pods of one cycle, counted per node, and the rules above evaluated over them.

    Built lazily: a cycle with no pod carrying these rules and no running pod with
    required anti-affinity only pays for :meth:`affected` (and :meth:`add`, a dict insert)."""

    filt: NodeFilter
    _load: Callable[[], _Running]
    alloc: IntArray
    columns: tuple[str, ...]
    arrays: ScoringArrays
    place: Place
    insufficient: Callable[..., IntArray]
    _placed: dict[Any, tuple[Pod, int]] = field(default_factory=dict)
    _base: _Running | None = None
    _holders: list[tuple[Pod, int]] = field(default_factory=list)
    _counts: dict[Any, tuple[tuple[Clause, ...], IntArray]] = field(default_factory=dict)
    _affected: dict[Any, bool] = field(default_factory=dict)

    # -- the counted pods

    def _ensure(self) -> _Running:
        if self._base is None:
            self._base = self._load()
            self._holders = list(self._base.holders)
            self._holders += [(p, r) for p, r in self._placed.values() if p.anti_affinity_terms]
        return self._base

    def _pods(self) -> Iterator[tuple[Pod, int]]:
        yield from self._ensure().pods
        yield from self._placed.values()

    def add(self, pod: Pod, row: int) -> None:
        """``pod`` is placed on node ``row`` in this cycle: count it from now on."""
        if pod.uid in self._placed:
            return
        self._placed[pod.uid] = (pod, row)
        if self._base is not None:
            self._count(pod, row, 1)

    def remove(self, pod: Pod, row: int) -> None:
        if self._placed.pop(pod.uid, None) is None:
            return
        if self._base is not None:
            self._count(pod, row, -1)

    def _count(self, pod: Pod, row: int, sign: int) -> None:
        for clauses, per_node in self._counts.values():
            if _matches(clauses, pod):
                per_node[row] += sign
        if pod.anti_affinity_terms:
            if sign > 0:
                self._holders.append((pod, row))
            else:
                self._holders.remove((pod, row))
            self._affected.clear()

    def _per_node(self, clauses: tuple[Clause, ...]) -> IntArray:
        """Per node, how many counted pods match every clause."""
        key = tuple((ns, _selector_key(sel)) for ns, sel in clauses)
        hit = self._counts.get(key)
        if hit is not None:
            return hit[1]
        per_node = np.zeros(len(self.filt), dtype=np.int64)
        if all(sel is not None for _, sel in clauses):
            for pod, row in self._pods():
                if _matches(clauses, pod):
                    per_node[row] += 1
        self._counts[key] = (clauses, per_node)
        return per_node

    def affected(self, pods: Sequence[Pod]) -> bool:
        """Whether any of ``pods`` carries these rules or a running pod's required
        anti-affinity selects it: then it is placed one member at a time."""
        if any(constrained(p) for p in pods):
            return True
        self._ensure()
        holders = self._holders
        if not holders:
            return False
        for pod in pods:
            hit = self._affected.get(pod.uid)
            if hit is None:
                hit = self._affected[pod.uid] = any(
                    _matches((_term_clause(h, t),), pod) for h, _ in holders for t in h.anti_affinity_terms
                )
            if hit:
                return True
        return False

    # -- the rules

    def _domains(self, key: str) -> tuple[npt.NDArray[np.intp], int]:
        return self.filt.label_codes(key)

    def evaluate(self, pod: Pod) -> _Eval:
        n = len(self.filt)
        reason = np.full(n, -1, dtype=np.int8)
        score = np.zeros(n, dtype=np.int64)

        def fail(bad: BoolArray, index: int) -> None:
            reason[bad & (reason < 0)] = index

        hard = [c for c in pod.spread if c.when_unsatisfiable != "ScheduleAnyway"]
        soft = [c for c in pod.spread if c.when_unsatisfiable == "ScheduleAnyway"]
        for c in hard:
            codes, _ = self._domains(c.topology_key)
            fail(codes < 0, 0)
        if hard:
            counts = self._spread_counts(pod, hard)
            for c, (codes, per_domain, minimum) in zip(hard, counts, strict=True):
                self_match = int(_matches(((None, _spread_selector(pod, c)),), pod))
                skew = np.where(codes >= 0, per_domain[codes] + self_match - minimum, 0)
                fail((codes >= 0) & (skew > c.max_skew), 1)
        if pod.affinity_terms:
            fail(~self._affinity_ok(pod), 2)
        for t in pod.anti_affinity_terms:
            codes, n_values = self._domains(t.topology_key)
            per_domain = self._domain_sums(codes, n_values, self._per_node((_term_clause(pod, t),)))
            fail((codes >= 0) & (per_domain[np.maximum(codes, 0)] > 0), 3)
        fail(self._forbidden(pod), 4)
        if soft:
            score = self._spread_score(pod, soft)
        return _Eval(reason < 0, score, reason)

    @staticmethod
    def _domain_sums(codes: npt.NDArray[np.intp], n_values: int, per_node: IntArray,
                     where: BoolArray | None = None) -> IntArray:
        keep = codes >= 0 if where is None else (codes >= 0) & where
        return np.bincount(codes[keep], weights=per_node[keep], minlength=max(n_values, 1)).astype(np.int64)

    def _eligible(self, pod: Pod, constraints: Sequence[SpreadConstraint]) -> list[BoolArray]:
        """Per constraint, the nodes whose domains count (kube-scheduler's policies)."""
        n = len(self.filt)
        labelled = np.ones(n, dtype=np.bool_)
        for c in constraints:
            labelled &= self._domains(c.topology_key)[0] >= 0
        out = []
        for c in constraints:
            ok = labelled.copy()
            if c.node_affinity_policy != "Ignore":
                ok &= self.filt.affinity_mask(pod)
            if c.node_taints_policy == "Honor":
                ok &= self.filt.tolerated_mask(pod)
            out.append(ok)
        return out

    def _spread_counts(
        self, pod: Pod, constraints: Sequence[SpreadConstraint]
    ) -> list[tuple[npt.NDArray[np.intp], IntArray, int]]:
        """Per constraint: node domain codes, matching pods per domain, and the minimum."""
        out = []
        for c, eligible in zip(constraints, self._eligible(pod, constraints), strict=True):
            codes, n_values = self._domains(c.topology_key)
            clause: Clause = (frozenset((pod.namespace,)), _spread_selector(pod, c))
            per_domain = self._domain_sums(codes, n_values, self._per_node((clause,)), eligible)
            present = np.zeros(max(n_values, 1), dtype=np.bool_)
            present[codes[eligible & (codes >= 0)]] = True
            n_domains = int(present.sum())
            minimum = int(per_domain[present].min()) if n_domains and n_domains >= c.min_domains else 0
            out.append((codes, per_domain, minimum))
        return out

    def _spread_score(self, pod: Pod, soft: Sequence[SpreadConstraint]) -> IntArray:
        """ScheduleAnyway: per node, fewer matching pods in its domains score higher."""
        n = len(self.filt)
        raw = np.zeros(n, dtype=np.float64)
        labelled = np.ones(n, dtype=np.bool_)
        for c, (codes, per_domain, _) in zip(soft, self._spread_counts(pod, soft), strict=True):
            labelled &= codes >= 0
            weight = math.log(int(np.unique(codes[codes >= 0]).shape[0]) + 2)
            raw += weight * (per_domain[np.maximum(codes, 0)] + c.max_skew - 1)
        if not labelled.any():
            return np.zeros(n, dtype=np.int64)
        hi, lo = float(raw[labelled].max()), float(raw[labelled].min())
        if hi <= 0:
            scores = np.full(n, _MAX_SCORE, dtype=np.int64)
        else:
            scores = (_MAX_SCORE * (hi + lo - raw) / hi).astype(np.int64)
        return np.where(labelled, SPREAD_WEIGHT * scores, 0).astype(np.int64)

    def _affinity_ok(self, pod: Pod) -> BoolArray:
        n = len(self.filt)
        clauses = tuple(_term_clause(pod, t) for t in pod.affinity_terms)
        per_node = self._per_node(clauses)
        labelled = np.ones(n, dtype=np.bool_)
        exist = np.ones(n, dtype=np.bool_)
        total = 0
        for t in pod.affinity_terms:
            codes, n_values = self._domains(t.topology_key)
            per_domain = self._domain_sums(codes, n_values, per_node)
            total += int(per_domain.sum())
            labelled &= codes >= 0
            exist &= per_domain[np.maximum(codes, 0)] > 0
        if total == 0 and _matches(clauses, pod):
            return labelled  # the first of pods that attract each other
        return labelled & exist

    def _forbidden(self, pod: Pod) -> BoolArray:
        """Nodes in the domain of a counted pod whose required anti-affinity selects ``pod``."""
        n = len(self.filt)
        out = np.zeros(n, dtype=np.bool_)
        self._ensure()
        for holder, row in self._holders:
            for t in holder.anti_affinity_terms:
                if not _matches((_term_clause(holder, t),), pod):
                    continue
                codes, _ = self._domains(t.topology_key)
                if codes[row] >= 0:
                    out |= codes == codes[row]
        return out

    # -- placing and explaining

    def alike(self, same: Callable[[Any], bool]) -> Callable[[Any], bool]:
        """``same`` (which units may share one kernel call), less the units :meth:`affected`."""
        return lambda unit: same(unit) and not self.affected(unit.pods)

    def kernel(self, pods: Sequence[Pod]) -> Place:
        """:attr:`place` (the kernel or its twin) for ``pods``, with their rules: member m may
        go only where the rules allow, given the pods counted and members 0..m-1 placed;
        all-or-nothing for the first ``min_count``. ``place`` itself when no member is
        :meth:`affected`. The placed members are not counted afterwards: the caller counts
        them with :meth:`add` once it keeps them."""
        place = self.place
        if not self.affected(pods):
            return place

        def placer(problem: PlacementProblem, out: IntArray, /) -> int:
            placed, added = self._place(pods, place, problem, out)
            for pod, row in added:
                self.remove(pod, row)
            return placed

        return placer

    def _place(
        self, pods: Sequence[Pod], place: Place, problem: PlacementProblem, out: IntArray,
    ) -> tuple[int, list[tuple[Pod, int]]]:
        """Members one at a time; ``used`` and ``out`` as the kernel leaves them, and the
        members counted (for the caller to remove)."""
        reqs, sig, min_count = problem.reqs, problem.sig, problem.min_count
        n_members = reqs.shape[0]
        out[:n_members] = -1
        if min_count > n_members:
            return 0, []
        scratch = problem.used.copy()
        zero = np.zeros(1, dtype=np.int64)
        one = np.full(1, -1, dtype=np.int64)
        added: list[tuple[Pod, int]] = []
        placed = 0
        for m in range(n_members):
            pod = pods[m]
            e = self.evaluate(pod)
            s = int(sig[m])
            alone = problem._replace(
                used=scratch, reqs=np.ascontiguousarray(reqs[m : m + 1]), sig=zero,
                masks=np.ascontiguousarray((problem.masks[s] & e.ok)[None, :]),
                static=np.ascontiguousarray((problem.static[s] + e.score)[None, :]),
                min_count=1 if m < min_count else 0,
            )
            if place(alone, one):
                row = int(one[0])
                out[m] = row
                placed += 1
                if pod.uid not in self._placed:
                    self.add(pod, row)
                    added.append((pod, row))
            elif m < min_count:
                for p, r in added:
                    self.remove(p, r)
                out[:n_members] = -1
                return 0, []
        problem.used[...] = scratch
        return placed, added

    def narrow(self, pods: Sequence[Pod], lay: Layout) -> Layout:
        """``lay`` with each signature's mask cut to the nodes the rules allow its first
        member now, for what looks at masks alone (the victim search's first check, the
        reservation's choice of nodes); ``lay`` itself when no member is :meth:`affected`."""
        if not self.affected(pods):
            return lay
        masks = lay.masks.copy()
        for s in range(masks.shape[0]):
            members = np.flatnonzero(lay.sig[: len(pods)] == s)
            if members.shape[0]:
                masks[s] &= self.evaluate(pods[int(members[0])]).ok
        return replace(lay, masks=masks)

    def explain(self, pod: Pod, req: IntArray, mask: BoolArray, used: IntArray) -> str:
        """``0/N nodes fit: ...`` for ``pod``: the node filters' reasons, then these rules'
        (each node counted once, by the first rule it breaks), then the resources missing
        on the nodes both let through. ``mask``: the nodes the filters let through."""
        total = len(self.filt)
        if total == 0 or unsupported_reason(pod):
            return self.filt.explain(pod)
        counts: Counter[str] = self.filt.reasons(pod)
        e = self.evaluate(pod)
        broken = np.asarray(mask, dtype=np.bool_) & ~e.ok
        for index, n in enumerate(np.bincount(e.reason[broken], minlength=len(_REASONS)).tolist()):
            if n:
                counts[_REASONS[index]] += n
        short = self.insufficient(self.alloc, used, req, np.ascontiguousarray(mask & e.ok))
        _add_insufficient(counts, {self.columns[r]: int(n) for r, n in enumerate(short) if n > 0})
        return _message(total, counts)

    def gang_message(
        self, pods: Sequence[Pod], min_count: int, reqs: IntArray, sig: IntArray, masks: BoolArray,
        used: IntArray,
    ) -> str:
        """Why a gang's quorum does not fit: how many members fit at most, placed one at a
        time under the rules, and why the first that did not failed next to them."""
        scratch = used.copy()
        out = np.full(len(pods), -1, dtype=np.int64)
        problem = PlacementProblem(
            self.alloc, scratch, reqs, sig, masks, np.zeros_like(masks, dtype=np.int64), self.arrays, 0,
        )
        placeable, added = self._place(pods, self.place, problem, out)
        try:
            first = int(np.argmax(out < 0)) if placeable < len(pods) else 0
            detail = self.explain(pods[first], reqs[first], masks[sig[first]], scratch)
        finally:
            for p, r in added:
                self.remove(p, r)
        need = {name: int(reqs[:min_count, c].sum()) for c, name in enumerate(self.columns)
                if name != "pods" and int(reqs[:min_count, c].sum())}
        return explain.gang_short(min_count, need, placeable, pods[first].name, detail)
