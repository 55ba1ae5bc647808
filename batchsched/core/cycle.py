"""One scheduling cycle: a snapshot and the units waiting for nodes in, a :class:`Plan` out.

Pure and deterministic: the same snapshot and units give the same plan; no I/O, no clock.

A *unit* is what is placed all at once: a gang of pods, or a single pod (a gang of one).
The algorithm, in order:

1. Order units by priority (high first), then creation time, then UID.
2. Walk them in that order against a private copy of the snapshot's usage. Runs of
   consecutive single pods that share their constraints are handed to the placement kernel
   together (best effort, one kernel call); a gang is handed over alone with
   ``min_count`` = its quorum, so the kernel places all of its first ``min_count`` members
   or none of them, and its extra (elastic) members only as room allows.
3. Each placed member becomes a :class:`Binding`; each pod that could not be placed
   becomes an :class:`Unschedulable` with a message a person can act on.

Since usage grows as the walk goes, a lower unit never takes what a higher one got, and a
gang never ends up partly placed while another takes the rest: no interleaving deadlock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core import kernels, reference
from batchsched.core.model import Pod
from batchsched.core.predicates import NodeFilter
from batchsched.core.quantity import format_units
from batchsched.core.scoring import ScoringArrays, ScoringConfig
from batchsched.core.state import Snapshot

IntArray = npt.NDArray[np.int64]


@dataclass(slots=True, frozen=True)
class Unit:
    """Pods placed together: the first ``min_count`` all or none, the rest as room allows."""

    key: str
    pods: tuple[Pod, ...]
    min_count: int
    priority: int
    created: float
    uid: str
    #: why the unit may not be placed at all, when that is known before placement
    blocked: str = ""

    @property
    def single(self) -> bool:
        return len(self.pods) == 1 and self.min_count == 1

    def order(self) -> tuple[int, float, str]:
        return (-self.priority, self.created, self.uid)


def single_unit(pod: Pod) -> Unit:
    return Unit(
        key=pod.key, pods=(pod,), min_count=1, priority=pod.priority,
        created=pod.created, uid=pod.uid,
    )


@dataclass(slots=True, frozen=True)
class Binding:
    uid: str
    namespace: str
    name: str
    node: str
    unit: str


@dataclass(slots=True, frozen=True)
class Eviction:
    """A bound pod to remove through the Eviction API, with the reason told to its owner."""

    uid: str
    namespace: str
    name: str
    node: str
    unit: str
    reason: str


@dataclass(slots=True, frozen=True)
class Unschedulable:
    pod: Pod
    message: str
    unit: str


@dataclass(slots=True)
class Plan:
    bindings: list[Binding] = field(default_factory=list)
    unschedulable: list[Unschedulable] = field(default_factory=list)
    #: unit key -> message, for units that were not placed (gang status)
    failed_units: dict[str, str] = field(default_factory=dict)
    #: unit key -> number of members placed, for units that were placed
    placed_units: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


Kernel = Callable[..., int]


class Cycle:
    """Holds what survives between cycles (node filter, scoring arrays) and runs one."""

    def __init__(self, scoring: ScoringConfig, *, use_jit: bool = True) -> None:
        scoring.validate()
        self.scoring = scoring
        self._place: Kernel = kernels.place_members if use_jit else reference.place_members
        self._insufficient: Callable[..., Any] = (
            kernels.insufficient_counts if use_jit else reference.insufficient_counts
        )
        self._filter: NodeFilter | None = None
        self._filter_key: tuple[int, int] = (-1, -1)
        self._arrays: ScoringArrays | None = None
        self._arrays_columns: tuple[str, ...] = ()

    def _node_filter(self, snap: Snapshot) -> NodeFilter:
        key = (snap.node_generation, len(snap.nodes))
        if self._filter is None or key != self._filter_key:
            self._filter = NodeFilter(snap.nodes)
            self._filter_key = key
        return self._filter

    def _scoring_arrays(self, columns: tuple[str, ...]) -> ScoringArrays:
        if self._arrays is None or columns != self._arrays_columns:
            self._arrays = self.scoring.arrays(columns)
            self._arrays_columns = columns
        return self._arrays

    def run(self, snap: Snapshot, units: Sequence[Unit]) -> Plan:
        t0 = time.perf_counter()
        plan = Plan()
        filt = self._node_filter(snap)
        arrays = self._scoring_arrays(snap.columns)
        used = snap.used.copy()
        col = {c: i for i, c in enumerate(snap.columns)}
        ordered = sorted(units, key=Unit.order)
        t1 = time.perf_counter()
        plan.timings["order"] = t1 - t0

        explain_cache: dict[tuple[Any, ...], str] = {}
        kernel_time = 0.0

        def request_matrix(pods: Sequence[Pod]) -> IntArray | None:
            reqs = np.zeros((len(pods), len(snap.columns)), dtype=np.int64)
            for m, pod in enumerate(pods):
                for name, value in pod.requests.items():
                    c = col.get(name)
                    if c is None:
                        return None
                    reqs[m, c] = value
            return reqs

        def explain(
            pod: Pod, req: IntArray | None, mask: npt.NDArray[np.bool_], usage: IntArray | None = None
        ) -> str:
            """Why ``pod`` fits no node, against ``usage`` (the walk's usage by default)."""
            key = (pod.constraint_key(), pod.pod_affinity, None if req is None else req.tobytes())
            cached = explain_cache.get(key) if usage is None else None
            if cached is not None:
                return cached
            if req is None:
                missing = sorted(set(pod.requests) - set(col))
                message = f"0/{len(snap.nodes)} nodes fit: no node has any {', '.join(missing)}."
            else:
                counts = self._insufficient(snap.alloc, used if usage is None else usage, req, mask)
                insufficient = {snap.columns[r]: int(n) for r, n in enumerate(counts) if n > 0}
                message = filt.explain(pod, insufficient)
            if usage is None:
                explain_cache[key] = message
            return message

        i = 0
        while i < len(ordered):
            unit = ordered[i]
            if unit.blocked:
                plan.failed_units[unit.key] = unit.blocked
                for pod in unit.pods:
                    plan.unschedulable.append(Unschedulable(pod, unit.blocked, unit.key))
                i += 1
                continue
            if unit.single:
                # a run of single pods with the same constraints goes to the kernel at once
                j = i + 1
                ckey = unit.pods[0].constraint_key()
                while (
                    j < len(ordered)
                    and ordered[j].single
                    and not ordered[j].blocked
                    and ordered[j].pods[0].constraint_key() == ckey
                ):
                    j += 1
                batch = ordered[i:j]
                pods = [u.pods[0] for u in batch]
                min_count = 0
                gang = False
                i = j
            else:
                batch = [unit]
                pods = list(unit.pods)
                min_count = unit.min_count
                gang = True
                i += 1
            if not pods:
                continue

            # a gang's quorum, or a lone pod, with an unreadable request cannot be placed
            core = pods[:min_count] if gang else pods if len(pods) == 1 else []
            invalid = next((p for p in core if p.invalid), None)
            if invalid is not None:
                message = f"pod {invalid.key} cannot be scheduled: {invalid.invalid}"
                for u in batch:
                    plan.failed_units[u.key] = message
                    for pod in u.pods:
                        plan.unschedulable.append(Unschedulable(pod, message, u.key))
                continue

            reqs = request_matrix(pods)
            sig_keys: dict[tuple[Any, ...], int] = {}
            sig = np.empty(len(pods), dtype=np.int64)
            rep: list[Pod] = []
            for m, pod in enumerate(pods):
                k = (pod.constraint_key(), pod.pod_affinity, bool(pod.invalid))
                s = sig_keys.get(k)
                if s is None:
                    s = sig_keys[k] = len(rep)
                    rep.append(pod)
                sig[m] = s
            masks = np.zeros((len(rep), len(snap.nodes)), dtype=np.bool_)
            static = np.zeros((len(rep), len(snap.nodes)), dtype=np.int64)
            for s, pod in enumerate(rep):
                if not pod.invalid:
                    masks[s] = filt.mask(pod)
                    static[s] = filt.static_score(pod)
            out = np.full(len(pods), -1, dtype=np.int64)
            if reqs is not None:
                k0 = time.perf_counter()
                placed = self._place(
                    snap.alloc, used, reqs, sig, masks, static, arrays.weights, arrays.scalar,
                    arrays.shape_u, arrays.shape_s, arrays.strategy, min_count, out,
                )
                kernel_time += time.perf_counter() - k0
            else:
                placed = 0

            if gang:
                if placed == 0 and min_count > 0:
                    message = self._gang_message(unit, pods, reqs, sig, masks, explain, snap, used)
                    plan.failed_units[unit.key] = message
                    for pod in pods:
                        plan.unschedulable.append(Unschedulable(pod, message, unit.key))
                    continue
                # the quorum is placed (or was placed before): extras go where they fit
                if placed:
                    plan.placed_units[unit.key] = placed
                for m, pod in enumerate(pods):
                    if out[m] >= 0:
                        plan.bindings.append(
                            Binding(pod.uid, pod.namespace, pod.name, snap.nodes[out[m]].name, unit.key)
                        )
                        continue
                    if pod.invalid:
                        message = f"pod {pod.key} cannot be scheduled: {pod.invalid}"
                    else:
                        message = explain(pod, None if reqs is None else reqs[m], masks[sig[m]])
                    message = f"elastic member beyond the gang's quorum: {message}"
                    if not placed:
                        plan.failed_units.setdefault(unit.key, message)
                    plan.unschedulable.append(Unschedulable(pod, message, unit.key))
                continue
            for m, (u, pod) in enumerate(zip(batch, pods, strict=True)):
                if out[m] >= 0:
                    plan.placed_units[u.key] = 1
                    plan.bindings.append(
                        Binding(pod.uid, pod.namespace, pod.name, snap.nodes[out[m]].name, u.key)
                    )
                else:
                    message = explain(pod, None if reqs is None else reqs[m], masks[sig[m]])
                    plan.failed_units[u.key] = message
                    plan.unschedulable.append(Unschedulable(pod, message, u.key))

        plan.timings["kernel"] = kernel_time
        plan.timings["total"] = time.perf_counter() - t0
        return plan

    def _gang_message(
        self,
        unit: Unit,
        pods: Sequence[Pod],
        reqs: IntArray | None,
        sig: IntArray,
        masks: npt.NDArray[np.bool_],
        explain: Callable[..., str],
        snap: Snapshot,
        used: IntArray,
    ) -> str:
        """Why a gang was not placed: how many members fit at most, and what stopped the rest."""
        if len(pods) < unit.min_count:
            return (
                f"waiting for pods: {len(pods)} of {unit.min_count} required members exist"
            )
        if reqs is None:
            return explain(pods[0], None, masks[sig[0]])
        # how many of the quorum fit on their own (best effort, on a scratch copy)
        scratch_used = used.copy()
        out = np.full(len(pods), -1, dtype=np.int64)
        arrays = self._scoring_arrays(snap.columns)
        placeable = self._place(
            snap.alloc, scratch_used, reqs, sig, masks, np.zeros_like(masks, dtype=np.int64),
            arrays.weights, arrays.scalar, arrays.shape_u, arrays.shape_s, arrays.strategy, 0, out,
        )
        first_missing = int(np.argmax(out < 0)) if placeable < len(pods) else 0
        # the first member that did not fit, next to the members placed before it
        detail = explain(
            pods[first_missing], reqs[first_missing], masks[sig[first_missing]], scratch_used
        )
        need = {}
        for c, name in enumerate(snap.columns):
            total = int(reqs[: unit.min_count, c].sum())
            if total and name != "pods":
                need[name] = total
        needs = ", ".join(f"{format_units(k, v)} {k}" for k, v in sorted(need.items()))
        return (
            f"gang needs {unit.min_count} pods ({needs}) placed together; "
            f"only {placeable} fit now. Member {pods[first_missing].name}: {detail}"
        )
