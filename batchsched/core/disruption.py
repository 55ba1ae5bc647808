"""PodDisruptionBudgets, as far as preemption needs them: which running work may not be evicted.

The Eviction API refuses (429) to evict a pod when a budget selecting it has no disruption
left. Preemption must not choose such a victim: the preemptor would hold its nomination
while the victim stays. So the scheduler mirrors the budgets (``policy/v1``) and marks a
running unit *protected* when evicting all of its pods would exceed what a budget allows
now (``status.disruptionsAllowed``); :func:`batchsched.core.preemption.select_victims`
never picks a protected unit. A refusal that still happens (a race with the disruption
controller) is reported by the eviction path and the preemption retried later.

Selectors follow ``metav1.LabelSelector``: ``matchLabels`` and ``matchExpressions`` (In,
NotIn, Exists, DoesNotExist) ANDed; in ``policy/v1`` an empty selector selects every pod
of the budget's namespace and a missing one selects none.

Pure: no I/O; one writer (the event loop) applies events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchsched.core.model import LabelSelector, Pod, parse_selector

__all__ = ["DisruptionBook", "DisruptionBudget", "parse_pdb"]


@dataclass(slots=True, frozen=True)
class DisruptionBudget:
    namespace: str
    name: str
    uid: str = ""
    #: None: the budget has no selector and selects nothing (an empty one selects all)
    selector: LabelSelector | None = field(default_factory=LabelSelector)
    allowed: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: Pod) -> bool:
        if pod.namespace != self.namespace or self.selector is None:
            return False
        return self.selector.matches(pod.labels)


def parse_pdb(obj: Mapping[str, Any]) -> DisruptionBudget:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed")
    return DisruptionBudget(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        selector=parse_selector(spec.get("selector")),
        # a budget the disruption controller has not looked at yet allows nothing
        allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
    )


class DisruptionBook:
    """The budgets by namespace; :meth:`protecting` says whether pods may be evicted."""

    def __init__(self) -> None:
        self._by_ns: dict[str, dict[str, DisruptionBudget]] = {}
        #: bumps on every change
        self.version = 0

    def __len__(self) -> int:
        return sum(len(b) for b in self._by_ns.values())

    def get(self, namespace: str, name: str) -> DisruptionBudget | None:
        return self._by_ns.get(namespace, {}).get(name)

    def event(self, kind: str, budget: DisruptionBudget) -> None:
        self.version += 1
        if kind == "DELETED":
            ns = self._by_ns.get(budget.namespace)
            if ns is not None:
                ns.pop(budget.name, None)
                if not ns:
                    del self._by_ns[budget.namespace]
            return
        self._by_ns.setdefault(budget.namespace, {})[budget.name] = budget

    def replace(self, budgets: Iterable[DisruptionBudget]) -> None:
        self.version += 1
        self._by_ns = {}
        for b in budgets:
            self.event("ADDED", b)

    def protecting(self, pods: Sequence[Pod]) -> str:
        """Why evicting every pod of ``pods`` would be refused, or "" when it would not."""
        if not self._by_ns:
            return ""
        namespaces = {p.namespace for p in pods}
        for ns in sorted(namespaces):
            for name in sorted(self._by_ns.get(ns, {})):
                budget = self._by_ns[ns][name]
                hit = sum(1 for p in pods if budget.selects(p))
                if hit > budget.allowed:
                    return (
                        f"PodDisruptionBudget {budget.key} allows {budget.allowed} disruption(s) now"
                    )
        return ""
