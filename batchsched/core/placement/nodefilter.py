"""The node filters and soft scores of every pod against every node of a cycle, at once.

:class:`NodeFilter` applies the rules of :mod:`batchsched.core.placement.predicates` (its
reference, one node at a time) to a whole pod at once with numpy. It is built once per
cycle over every node: label values are encoded per key as small integer codes, so a
requirement becomes a lookup table over the distinct values of one key, indexed by the
node codes; nodes are grouped by their hard conditions (deleting, cordoned, ready,
NoSchedule/NoExecute taints) and by their PreferNoSchedule taints, so tolerations are
checked once per group, not once per node. Results are cached by
:meth:`Pod.constraint_key`, because the pods of one job share their constraints. Property
tests hold it equal to the per-node rules.

Soft scores follow kube-scheduler's default profile: TaintToleration (weight 3) and
NodeAffinity preferred terms (weight 2), each normalised to 0..100 over the feasible nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core.model import Node, Pod, Requirement, Taint, Term, Toleration
from batchsched.core.placement.predicates import (
    _HARD_EFFECTS,
    _NAME_FIELD,
    PREFER_NO_SCHEDULE,
    REASON_AFFINITY,
    REASON_DEVICES,
    REASON_DRA_GPUS,
    _add_insufficient,
    _bound,
    _dra_gpus,
    _empty,
    _hard_reason,
    _message,
    _parse_int64,
    _tolerated,
    names_cards,
    unsupported_reason,
)

__all__ = [
    "AFFINITY_WEIGHT",
    "MAX_NODE_SCORE",
    "TAINT_WEIGHT",
    "NodeFilter",
]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

MAX_NODE_SCORE = 100
TAINT_WEIGHT = 3
AFFINITY_WEIGHT = 2


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
        "_all",
        "_columns",
        "_expr_masks",
        "_hard_codes",
        "_hard_groups",
        "_hard_ok",
        "_masks",
        "_names",
        "_no_cards",
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
        self._all = self._frozen(np.ones(n, dtype=np.bool_))
        #: the nodes where DRA devices serve nvidia.com/gpu (no card can be named there)
        self._no_cards = self._frozen(np.array([not _dra_gpus(node) for node in self._nodes], dtype=np.bool_))
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

    def label_codes(self, key: str) -> tuple[npt.NDArray[np.intp], int]:
        """Per node, a code for its value of label ``key`` (-1 without it); how many values."""
        column = self._column(key)
        return column.codes, len(column.values)

    def affinity_mask(self, pod: Pod) -> BoolArray:
        """Per node, whether ``nodeSelector`` and required node affinity hold."""
        return self._affinity_mask(pod)

    def tolerated_mask(self, pod: Pod) -> BoolArray:
        """Per node, whether it passes every filter but node affinity (taints, cordon...)."""
        return self._hard(pod.tolerations)[1]

    def mask(self, pod: Pod) -> BoolArray:
        """Per node, whether it passes every filter for ``pod`` (all False when
        :func:`unsupported_reason`)."""
        if (pod.affinity_terms or pod.anti_affinity_terms) and unsupported_reason(pod):
            return self._none
        key = pod.constraint_key()
        cached = self._masks.get(key)
        if cached is not None:
            return cached
        _, ok = self._hard(pod.tolerations)
        mask = self._frozen(ok & self._affinity_mask(pod) & self._devices_mask(pod)) if ok.any() else self._none
        self._masks[key] = mask
        return mask

    def _devices_mask(self, pod: Pod) -> BoolArray:
        """Per node, whether the pod's ResourceClaims can be allocated there (all True when
        it has none to allocate), and the cards it names can be given there."""
        if pod.device_nodes is None:
            return self._no_cards if names_cards(pod) else self._all
        names = self._names
        table = names.table()
        table[[c for c in (names.index.get(n) for n in pod.device_nodes) if c is not None]] = True
        result: BoolArray = table[names.codes]
        return result & self._no_cards if names_cards(pod) else result

    def static_score(self, pod: Pod) -> IntArray:
        """Per node, ``3 * TaintToleration + 2 * NodeAffinity`` on feasible nodes, else 0.

        TaintToleration: ``100 - count * 100 // max_count`` where count is the number of
        PreferNoSchedule taints the pod does not tolerate and max_count the largest count
        over the feasible nodes (100 everywhere when that is 0). NodeAffinity: the sum of
        the weights of the preferred terms a node matches, as ``sum * 100 // max_sum`` (0
        everywhere when the max is 0). Terms with weight 0 or no requirements are skipped,
        as kube-scheduler does; weights below 0 (which the apiserver refuses) are too.
        """
        if unsupported_reason(pod):
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
        unsupported = unsupported_reason(pod)
        if unsupported:
            if n:
                counts[unsupported] = n
            return counts
        group_reasons, ok = self._hard(pod.tolerations)
        per_group = np.bincount(self._hard_codes, minlength=len(self._hard_groups)).tolist()
        for reason, count in zip(group_reasons, per_group, strict=True):
            if reason is not None and count:
                counts[reason] += count
        affinity = self._affinity_mask(pod)
        off_affinity = int(np.count_nonzero(ok & ~affinity))
        if off_affinity:
            counts[REASON_AFFINITY] += off_affinity
        claims = self._devices_mask(pod) | ~self._no_cards if names_cards(pod) else self._devices_mask(pod)
        off_devices = int(np.count_nonzero(ok & affinity & ~claims))
        if off_devices:
            counts[REASON_DEVICES] += off_devices
        if names_cards(pod):
            off_cards = int(np.count_nonzero(ok & affinity & claims & ~self._no_cards))
            if off_cards:
                counts[REASON_DRA_GPUS] += off_cards
        return counts

    def explain(self, pod: Pod, insufficient: Mapping[str, int] | None = None,
                other: Mapping[str, int] | None = None) -> str:
        """:func:`explain` for these nodes, without looking at them one by one."""
        total = len(self._nodes)
        unsupported = unsupported_reason(pod)
        if unsupported:
            return f"0/{total} nodes fit: {unsupported}."
        if total == 0:
            return "0/0 nodes fit: the cluster has no nodes."
        counts = self.reasons(pod)
        _add_insufficient(counts, insufficient, other)
        return _message(total, counts)
