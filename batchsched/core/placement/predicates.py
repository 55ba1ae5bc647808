"""Which nodes a pod may use, and why none would do: the rules, one node at a time.

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
through. Pod topology spread and required inter-pod (anti-)affinity depend on where other
pods are: :mod:`batchsched.core.placement.podtopology` decides them. A pod whose inter-pod
terms cannot be evaluated (:func:`unsupported_reason`) fits no node, and the explanation
says so.

The plain functions here (:func:`reject_reason`, :func:`matches_affinity`, ...) look at one
node at a time and are the reference; :class:`~batchsched.core.placement.nodefilter.NodeFilter`
is their vectorised twin over every node of a cycle, and property tests hold the two
equal. :func:`explain` turns the reasons into the message a user reads.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from batchsched.core.devices import NVIDIA_GPU, shown
from batchsched.core.model import Node, Pod, Requirement, Taint, Term, Toleration

__all__ = [
    "NOT_READY_TAINT",
    "PREFER_NO_SCHEDULE",
    "REASON_AFFINITY",
    "REASON_DELETING",
    "REASON_DEVICES",
    "REASON_DRA_GPUS",
    "REASON_NOT_READY",
    "REASON_UNSCHEDULABLE",
    "UNSCHEDULABLE_TAINT",
    "explain",
    "matches_affinity",
    "matches_term",
    "reject_reason",
    "tolerates",
    "unsupported_reason",
    "untolerated_taint",
]

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
REASON_DEVICES = "node(s) had no devices its ResourceClaims can be allocated"
REASON_DRA_GPUS = "node(s) offer nvidia.com/gpu as DRA devices only (no card can be named there)"


def names_cards(pod: Pod) -> bool:
    """Whether ``pod`` asks for cards by index (a share of one, or whole cards a node agent
    is told): none can be given where DRA devices serve ``nvidia.com/gpu`` (the allocator,
    not the scheduler, picks which GPU a claim gets there)."""
    return any(a.recorded for a in pod.card_asks)


def _dra_gpus(node: Node) -> bool:
    return NVIDIA_GPU in node.dra_served

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
    """Why a pod fits no node because batchsched cannot evaluate what it asks, or ``""``:
    a required inter-pod (anti-)affinity term with a non-empty ``namespaceSelector`` (the
    core does not see namespace labels; ``{}``, every namespace, is supported)."""
    if not pod.affinity_terms and not pod.anti_affinity_terms:
        return ""
    for terms, kind in ((pod.affinity_terms, "affinity"), (pod.anti_affinity_terms, "anti-affinity")):
        for t in terms:
            ns = t.namespace_selector
            if ns is not None and (ns.match_labels or ns.expressions):
                return (
                    f"batchsched does not support a namespaceSelector in required pod {kind} "
                    "terms yet (list the namespaces instead)"
                )
    return ""


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
    affinity/selector, the nodes its ResourceClaims can be allocated on. A pod with :func:`unsupported_reason` is rejected by every node with
    it, before anything else.
    """
    unsupported = unsupported_reason(pod)
    if unsupported:
        return unsupported
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
    if pod.device_nodes is not None and node.name not in pod.device_nodes:
        return REASON_DEVICES
    if names_cards(pod) and _dra_gpus(node):
        return REASON_DRA_GPUS
    return None


# -- messages -----------------------------------------------------------------------------


def _message(total: int, counts: Mapping[str, int]) -> str:
    parts = sorted(((c, r) for r, c in counts.items() if c > 0), key=lambda cr: (-cr[0], cr[1]))
    if not parts:
        return f"0/{total} nodes fit."
    return f"0/{total} nodes fit: " + ", ".join(f"{c} {r}" for c, r in parts) + "."


def _add_insufficient(counts: Counter[str], insufficient: Mapping[str, int] | None,
                      other: Mapping[str, int] | None = None) -> None:
    """Count ``insufficient`` (resource -> nodes) as reasons, and ``other`` reasons as they
    are. The device model's own columns are not named: a pod short of card compute is short
    of the GPU resource it asked for, which is named instead when it is also short."""
    for resource, n in shown({r: n for r, n in (insufficient or {}).items() if n > 0}).items():
        counts[f"insufficient {resource}"] += n
    for reason, n in (other or {}).items():
        if n > 0:
            counts[reason] += n


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
    unsupported = unsupported_reason(pod)
    if unsupported:
        return f"0/{total} nodes fit: {unsupported}."
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
