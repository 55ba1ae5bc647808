"""Which nodes a pod may use, how much it prefers each, and why none would do.

These are the node-level filters kube-scheduler applies to a pod before it looks at free
capacity, with the same semantics, decided per (pod, node):

* the node is not being deleted (a batchsched rule; kube-scheduler has no such filter);
* NodeUnschedulable: a cordoned node only takes pods that tolerate
  ``node.kubernetes.io/unschedulable:NoSchedule``;
* a node that is not Ready only takes pods that tolerate
  ``node.kubernetes.io/not-ready:NoSchedule`` (the taint the node lifecycle controller
  would put there);
* TaintToleration: every ``NoSchedule`` / ``NoExecute`` taint must be tolerated;
* NodeAffinity: ``nodeSelector`` and the required node affinity terms must both hold.

Resources are not decided here: the kernels do that over the nodes this module lets
through. Required inter-pod (anti-)affinity is not evaluated at all: a pod that carries it
fits no node, and the explanation says so.

Two implementations of the same rules live here. The plain functions
(:func:`reject_reason`, :func:`matches_affinity`, ...) look at one node at a time and are
the reference. :class:`NodeFilter` is built once per cycle over every node and answers for
a whole pod at once with numpy: label values are encoded per key as small integer codes,
so a requirement becomes a lookup table over the distinct values of one key, indexed by
the node codes; nodes are grouped by their hard conditions (deleting, cordoned, ready,
NoSchedule/NoExecute taints) and by their PreferNoSchedule taints, so tolerations are
checked once per group, not once per node. Results are cached by
:meth:`Pod.constraint_key`, because the pods of one job share their constraints. Property
tests hold the two equal.

Soft scores follow kube-scheduler's default profile: TaintToleration (weight 3) and
NodeAffinity preferred terms (weight 2), each normalised to 0..100 over the feasible nodes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core.model import Node, Pod, Requirement, Taint, Term, Toleration

__all__ = [
    "AFFINITY_WEIGHT",
    "MAX_NODE_SCORE",
    "NOT_READY_TAINT",
    "REASON_AFFINITY",
    "REASON_DELETING",
    "REASON_NOT_READY",
    "REASON_UNSCHEDULABLE",
    "TAINT_WEIGHT",
    "UNSCHEDULABLE_TAINT",
    "NodeFilter",
    "explain",
    "matches_affinity",
    "matches_term",
    "reject_reason",
    "tolerates",
    "unsupported_reason",
    "untolerated_taint",
]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
PREFER_NO_SCHEDULE = "PreferNoSchedule"
_HARD_EFFECTS = (NO_SCHEDULE, NO_EXECUTE)

UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", effect=NO_SCHEDULE)
NOT_READY_TAINT = Taint(key="node.kubernetes.io/not-ready", effect=NO_SCHEDULE)

REASON_DELETING = "node(s) being deleted"
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NOT_READY = "node(s) were not ready"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"

MAX_NODE_SCORE = 100
TAINT_WEIGHT = 3
AFFINITY_WEIGHT = 2

_NAME_FIELD = "metadata.name"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT_RE = re.compile(r"[+-]?[0-9]+")


# -- one node at a time: the reference rules ------------------------------------------------


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Whether ``toleration`` tolerates ``taint`` (core/v1 ``Toleration.ToleratesTaint``).

    The effect must be empty or equal. An empty key with ``Exists`` tolerates every taint
    (an empty key with any other operator is rejected by the apiserver; here it tolerates
    nothing). Otherwise the keys must be equal, and either the operator is ``Exists`` or it
    is ``Equal`` (or empty) and the values are equal. Unknown operators tolerate nothing.
    """
    if toleration.effect and toleration.effect != taint.effect:
        return False
    operator = toleration.operator or "Equal"
    if not toleration.key:
        return operator == "Exists"
    if toleration.key != taint.key:
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return toleration.value == taint.value
    return False


def _tolerated(taint: Taint, tolerations: Iterable[Toleration]) -> bool:
    return any(tolerates(t, taint) for t in tolerations)


def untolerated_taint(taints: Iterable[Taint], tolerations: Sequence[Toleration]) -> Taint | None:
    """The first ``NoSchedule`` / ``NoExecute`` taint no toleration tolerates, else None."""
    for taint in taints:
        if taint.effect in _HARD_EFFECTS and not _tolerated(taint, tolerations):
            return taint
    return None


def _taint_reason(taint: Taint) -> str:
    return (
        f"untolerated taint {taint.key}={taint.value}"
        if taint.value
        else f"untolerated taint {taint.key}"
    )


def _parse_int64(text: str) -> int | None:
    """A base-10 int64 as Go's ``strconv.ParseInt(text, 10, 64)`` reads it, else None."""
    if not _INT_RE.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _bound(req: Requirement) -> int | None:
    """The integer a ``Gt`` / ``Lt`` requirement compares with; None if it has none."""
    return _parse_int64(req.values[0]) if len(req.values) == 1 else None


def _expression_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    """One ``matchExpressions`` entry against node labels.

    A requirement the apiserver would not have admitted (In/NotIn without values,
    Exists/DoesNotExist with values, Gt/Lt without exactly one integer, an unknown
    operator) matches nothing, which makes its whole term match nothing, as in
    kube-scheduler where such a term fails to parse.
    """
    value = labels.get(req.key)
    op = req.operator
    if op == "In":
        return bool(req.values) and value is not None and value in req.values
    if op == "NotIn":
        return bool(req.values) and (value is None or value not in req.values)
    if op == "Exists":
        return not req.values and value is not None
    if op == "DoesNotExist":
        return not req.values and value is None
    if op in ("Gt", "Lt"):
        bound = _bound(req)
        if bound is None or value is None:
            return False
        have = _parse_int64(value)
        if have is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _field_matches(req: Requirement, node_name: str) -> bool:
    """One ``matchFields`` entry: only ``metadata.name`` with In / NotIn and one value."""
    if req.key != _NAME_FIELD or len(req.values) != 1:
        return False
    if req.operator == "In":
        return node_name == req.values[0]
    if req.operator == "NotIn":
        return node_name != req.values[0]
    return False


def _empty(term: Term) -> bool:
    return not term.expressions and not term.fields


def matches_term(node: Node, term: Term) -> bool:
    """Whether every expression and field requirement of ``term`` holds on ``node``.

    An empty term (no expressions, no fields) matches no node.
    """
    if _empty(term):
        return False
    return all(_expression_matches(r, node.labels) for r in term.expressions) and all(
        _field_matches(r, node.name) for r in term.fields
    )


def matches_affinity(node: Node, pod: Pod) -> bool:
    """``nodeSelector`` and required node affinity (terms ORed; ``()`` matches nothing)."""
    labels = node.labels
    for key, value in pod.node_selector.items():
        if labels.get(key) != value:
            return False
    if pod.required_terms is None:
        return True
    return any(matches_term(node, term) for term in pod.required_terms)


def unsupported_reason(pod: Pod) -> str:
    """Why a pod with required inter-pod (anti-)affinity fits no node."""
    return f"batchsched does not support {pod.pod_affinity} yet"


def _hard_reason(
    *,
    deleting: bool,
    unschedulable: bool,
    ready: bool,
    taints: Iterable[Taint],
    tolerations: Sequence[Toleration],
) -> str | None:
    """Every filter but affinity, in the order the reasons are reported."""
    if deleting:
        return REASON_DELETING
    if unschedulable and not _tolerated(UNSCHEDULABLE_TAINT, tolerations):
        return REASON_UNSCHEDULABLE
    if not ready and not _tolerated(NOT_READY_TAINT, tolerations):
        return REASON_NOT_READY
    taint = untolerated_taint(taints, tolerations)
    if taint is not None:
        return _taint_reason(taint)
    return None


def reject_reason(pod: Pod, node: Node) -> str | None:
    """None if ``node`` passes every filter for ``pod``, else a short reason key.

    Checked in order: deleting, unschedulable, not ready, untolerated taint, node
    affinity/selector. A pod with required inter-pod (anti-)affinity is rejected by every
    node with :func:`unsupported_reason`, before anything else.
    """
    if pod.pod_affinity:
        return unsupported_reason(pod)
    reason = _hard_reason(
        deleting=node.deleting,
        unschedulable=node.unschedulable,
        ready=node.ready,
        taints=node.taints,
        tolerations=pod.tolerations,
    )
    if reason is not None:
        return reason
    if not matches_affinity(node, pod):
        return REASON_AFFINITY
    return None


# -- messages -----------------------------------------------------------------------------


def _message(total: int, counts: Mapping[str, int]) -> str:
    parts = sorted(((c, r) for r, c in counts.items() if c > 0), key=lambda cr: (-cr[0], cr[1]))
    if not parts:
        return f"0/{total} nodes fit."
    return f"0/{total} nodes fit: " + ", ".join(f"{c} {r}" for c, r in parts) + "."


def _add_insufficient(counts: Counter[str], insufficient: Mapping[str, int] | None) -> None:
    for resource, n in (insufficient or {}).items():
        if n > 0:
            counts[f"insufficient {resource}"] += n


def explain(
    pod: Pod,
    nodes: Sequence[Node],
    insufficient: Mapping[str, int] | None = None,
    mask: npt.ArrayLike | None = None,
) -> str:
    """The message for a pod that could not be placed: nodes counted by reason.

    ``"0/40 nodes fit: 32 insufficient nvidia.com/gpu, 8 untolerated taint gpu=broken."``
    Reasons are sorted by count, most first, then by text. ``insufficient`` maps a resource
    to how many statically feasible nodes lack it. ``mask``, when given, is the static mask
    for ``nodes`` (as from :meth:`NodeFilter.mask`): nodes it lets through are not looked
    at again. A message with no reason at all (every node passed the filters and nothing is
    insufficient) is ``"0/N nodes fit."``.
    """
    total = len(nodes)
    if pod.pod_affinity:
        return f"0/{total} nodes fit: {unsupported_reason(pod)}."
    if total == 0:
        return "0/0 nodes fit: the cluster has no nodes."
    passed = np.zeros(total, dtype=np.bool_) if mask is None else np.asarray(mask, dtype=np.bool_)
    if passed.shape != (total,):
        raise ValueError(f"mask has shape {passed.shape}, expected ({total},)")
    counts: Counter[str] = Counter()
    for node, ok in zip(nodes, passed.tolist(), strict=True):
        if ok:
            continue
        reason = reject_reason(pod, node)
        if reason is not None:
            counts[reason] += 1
    _add_insufficient(counts, insufficient)
    return _message(total, counts)


# -- every node at once -------------------------------------------------------------------


class _Column:
    """The values of one label key (or of node names) over every node, as integer codes.

    ``codes[i]`` is the index of node i's value in ``values``, or -1 when the node has no
    such label. A requirement is evaluated as a boolean table of ``len(values) + 1``
    entries, one per distinct value and a last one for "missing", so ``table[codes]`` is the
    per-node answer: code -1 picks the last entry.
    """

    __slots__ = ("_ints", "codes", "index", "values")

    def __init__(self, raw: Iterable[str | None]) -> None:
        index: dict[str, int] = {}
        codes = [-1 if value is None else index.setdefault(value, len(index)) for value in raw]
        self.index = index
        self.values: list[str] = list(index)
        self.codes: npt.NDArray[np.intp] = np.array(codes, dtype=np.intp)
        self._ints: tuple[IntArray, BoolArray] | None = None

    def table(self) -> BoolArray:
        return np.zeros(len(self.values) + 1, dtype=np.bool_)

    def ints(self) -> tuple[IntArray, BoolArray]:
        """Each distinct value as an int64, and whether it parsed."""
        if self._ints is None:
            parsed = [_parse_int64(v) for v in self.values]
            ok = np.array([p is not None for p in parsed], dtype=np.bool_)
            ints = np.array([p if p is not None else 0 for p in parsed], dtype=np.int64)
            self._ints = (ints, ok)
        return self._ints


class NodeFilter:
    """The static filters and soft scores of every pod against a fixed list of nodes.

    Build one per cycle (``NodeFilter(nodes)``); index i of every array is ``nodes[i]``.
    Returned arrays are cached and read-only: copy one before changing it.
    """

    __slots__ = (
        "_affinity",
        "_columns",
        "_expr_masks",
        "_hard_codes",
        "_hard_groups",
        "_hard_ok",
        "_masks",
        "_names",
        "_nodes",
        "_none",
        "_prefer",
        "_scores",
        "_soft_codes",
        "_soft_groups",
        "_term_masks",
    )

    def __init__(self, nodes: Sequence[Node]) -> None:
        self._nodes: tuple[Node, ...] = tuple(nodes)
        n = len(self._nodes)
        hard: dict[tuple[bool, bool, bool, tuple[Taint, ...]], int] = {}
        soft: dict[tuple[Taint, ...], int] = {}
        hard_codes = np.empty(n, dtype=np.intp)
        soft_codes = np.empty(n, dtype=np.intp)
        for i, node in enumerate(self._nodes):
            taints = node.taints
            hard_taints = tuple(t for t in taints if t.effect in _HARD_EFFECTS) if taints else ()
            soft_taints = (
                tuple(t for t in taints if t.effect == PREFER_NO_SCHEDULE) if taints else ()
            )
            key = (node.deleting, node.unschedulable, node.ready, hard_taints)
            hard_codes[i] = hard.setdefault(key, len(hard))
            soft_codes[i] = soft.setdefault(soft_taints, len(soft))
        self._hard_groups = list(hard)
        self._hard_codes = hard_codes
        self._soft_groups = list(soft)
        self._soft_codes = soft_codes
        self._names = _Column(node.name for node in self._nodes)
        self._columns: dict[str, _Column] = {}
        self._none = self._frozen(np.zeros(n, dtype=np.bool_))
        self._expr_masks: dict[Requirement, BoolArray] = {}
        self._term_masks: dict[Term, BoolArray] = {}
        self._hard_ok: dict[tuple[Toleration, ...], tuple[list[str | None], BoolArray]] = {}
        self._prefer: dict[tuple[Toleration, ...], IntArray] = {}
        self._affinity: dict[tuple[Any, ...], BoolArray] = {}
        self._masks: dict[tuple[Any, ...], BoolArray] = {}
        self._scores: dict[tuple[Any, ...], IntArray] = {}

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    @staticmethod
    def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
        array.flags.writeable = False
        return array

    # -- building blocks

    def _column(self, key: str) -> _Column:
        column = self._columns.get(key)
        if column is None:
            column = _Column([node.labels.get(key) for node in self._nodes])
            self._columns[key] = column
        return column

    def _expression_mask(self, req: Requirement) -> BoolArray:
        cached = self._expr_masks.get(req)
        if cached is not None:
            return cached
        column = self._column(req.key)
        table = column.table()  # last entry: the node has no such label
        op, values = req.operator, req.values
        if op == "In" and values:
            for v in values:
                code = column.index.get(v)
                if code is not None:
                    table[code] = True
        elif op == "NotIn" and values:
            table[:] = True
            for v in values:
                code = column.index.get(v)
                if code is not None:
                    table[code] = False
        elif op == "Exists" and not values:
            table[:-1] = True
        elif op == "DoesNotExist" and not values:
            table[-1] = True
        elif op in ("Gt", "Lt"):
            bound = _bound(req)
            if bound is not None:
                ints, ok = column.ints()
                table[:-1] = ok & (ints > bound if op == "Gt" else ints < bound)
        mask = self._frozen(table[column.codes])
        self._expr_masks[req] = mask
        return mask

    def _field_mask(self, req: Requirement) -> BoolArray:
        if req.key != _NAME_FIELD or len(req.values) != 1 or req.operator not in ("In", "NotIn"):
            return self._none
        names = self._names
        table = names.table()
        code = names.index.get(req.values[0])
        if req.operator == "In":
            if code is not None:
                table[code] = True
        else:
            table[:] = True
            if code is not None:
                table[code] = False
        result: BoolArray = table[names.codes]
        return result

    def _term_mask(self, term: Term) -> BoolArray:
        cached = self._term_masks.get(term)
        if cached is not None:
            return cached
        if _empty(term):
            mask = self._none
        else:
            acc = np.ones(len(self._nodes), dtype=np.bool_)
            for req in term.expressions:
                acc &= self._expression_mask(req)
            for req in term.fields:
                acc &= self._field_mask(req)
            mask = self._frozen(acc)
        self._term_masks[term] = mask
        return mask

    def _affinity_mask(self, pod: Pod) -> BoolArray:
        key = (tuple(sorted(pod.node_selector.items())), pod.required_terms)
        cached = self._affinity.get(key)
        if cached is not None:
            return cached
        acc = np.ones(len(self._nodes), dtype=np.bool_)
        for label, value in pod.node_selector.items():
            column = self._column(label)
            code = column.index.get(value)
            if code is None:
                acc[:] = False
                break
            acc &= column.codes == code
        if pod.required_terms is not None and acc.any():
            any_term = np.zeros(len(self._nodes), dtype=np.bool_)
            for term in pod.required_terms:
                any_term |= self._term_mask(term)
            acc &= any_term
        mask = self._frozen(acc)
        self._affinity[key] = mask
        return mask

    def _hard(self, tolerations: tuple[Toleration, ...]) -> tuple[list[str | None], BoolArray]:
        """Per hard-condition group, the reason it rejects these tolerations; per node, ok."""
        cached = self._hard_ok.get(tolerations)
        if cached is not None:
            return cached
        reasons = [
            _hard_reason(
                deleting=deleting,
                unschedulable=unschedulable,
                ready=ready,
                taints=taints,
                tolerations=tolerations,
            )
            for deleting, unschedulable, ready, taints in self._hard_groups
        ]
        group_ok = np.array([r is None for r in reasons], dtype=np.bool_)
        ok = self._frozen(group_ok[self._hard_codes])
        self._hard_ok[tolerations] = (reasons, ok)
        return reasons, ok

    def _prefer_counts(self, tolerations: tuple[Toleration, ...]) -> IntArray:
        """Per node, how many PreferNoSchedule taints these tolerations leave untolerated."""
        cached = self._prefer.get(tolerations)
        if cached is not None:
            return cached
        relevant = [t for t in tolerations if t.effect in ("", PREFER_NO_SCHEDULE)]
        per_group = np.array(
            [
                sum(1 for taint in group if not _tolerated(taint, relevant))
                for group in self._soft_groups
            ],
            dtype=np.int64,
        )
        counts = self._frozen(per_group[self._soft_codes])
        self._prefer[tolerations] = counts
        return counts

    # -- the answers

    def mask(self, pod: Pod) -> BoolArray:
        """Per node, whether it passes every filter for ``pod`` (all False with pod affinity)."""
        if pod.pod_affinity:
            return self._none
        key = pod.constraint_key()
        cached = self._masks.get(key)
        if cached is not None:
            return cached
        _, ok = self._hard(pod.tolerations)
        mask = self._frozen(ok & self._affinity_mask(pod)) if ok.any() else self._none
        self._masks[key] = mask
        return mask

    def static_score(self, pod: Pod) -> IntArray:
        """Per node, ``3 * TaintToleration + 2 * NodeAffinity`` on feasible nodes, else 0.

        TaintToleration: ``100 - count * 100 // max_count`` where count is the number of
        PreferNoSchedule taints the pod does not tolerate and max_count the largest count
        over the feasible nodes (100 everywhere when that is 0). NodeAffinity: the sum of
        the weights of the preferred terms a node matches, as ``sum * 100 // max_sum`` (0
        everywhere when the max is 0). Terms with weight 0 or no requirements are skipped,
        as kube-scheduler does; weights below 0 (which the apiserver refuses) are too.
        """
        if pod.pod_affinity:
            return self._frozen(np.zeros(len(self._nodes), dtype=np.int64))
        key = pod.constraint_key()
        cached = self._scores.get(key)
        if cached is not None:
            return cached
        feasible = self.mask(pod)
        n = len(self._nodes)
        if not feasible.any():
            score = self._frozen(np.zeros(n, dtype=np.int64))
            self._scores[key] = score
            return score

        counts = self._prefer_counts(pod.tolerations)
        max_count = int(counts[feasible].max())
        if max_count == 0:
            taint_score = np.full(n, MAX_NODE_SCORE, dtype=np.int64)
        else:
            taint_score = MAX_NODE_SCORE - counts * MAX_NODE_SCORE // max_count

        weights = np.zeros(n, dtype=np.int64)
        for weight, term in pod.preferred_terms:
            if weight <= 0 or _empty(term):
                continue
            weights += weight * self._term_mask(term).astype(np.int64)
        max_weight = int(weights[feasible].max())
        if max_weight > 0:
            affinity_score = weights * MAX_NODE_SCORE // max_weight
        else:
            affinity_score = np.zeros(n, dtype=np.int64)

        total = TAINT_WEIGHT * taint_score + AFFINITY_WEIGHT * affinity_score
        score = self._frozen(np.where(feasible, total, 0).astype(np.int64))
        self._scores[key] = score
        return score

    def reasons(self, pod: Pod) -> Counter[str]:
        """How many nodes each filter reason rejects for ``pod`` (as :func:`reject_reason`)."""
        n = len(self._nodes)
        counts: Counter[str] = Counter()
        if pod.pod_affinity:
            if n:
                counts[unsupported_reason(pod)] = n
            return counts
        group_reasons, ok = self._hard(pod.tolerations)
        per_group = np.bincount(self._hard_codes, minlength=len(self._hard_groups)).tolist()
        for reason, count in zip(group_reasons, per_group, strict=True):
            if reason is not None and count:
                counts[reason] += count
        off_affinity = int(np.count_nonzero(ok & ~self._affinity_mask(pod)))
        if off_affinity:
            counts[REASON_AFFINITY] += off_affinity
        return counts

    def explain(self, pod: Pod, insufficient: Mapping[str, int] | None = None) -> str:
        """:func:`explain` for these nodes, without looking at them one by one."""
        total = len(self._nodes)
        if pod.pod_affinity:
            return f"0/{total} nodes fit: {unsupported_reason(pod)}."
        if total == 0:
            return "0/0 nodes fit: the cluster has no nodes."
        counts = self.reasons(pod)
        _add_insufficient(counts, insufficient)
        return _message(total, counts)
