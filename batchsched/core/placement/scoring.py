"""How nodes are scored for a pod: kube-scheduler's NodeResourcesFit scoring strategy.

:class:`ScoringConfig` holds the strategy the way a ``KubeSchedulerConfiguration`` writes it
(``scoringStrategy``: a type, weighted resources and, for RequestedToCapacityRatio, a shape
of ``utilization -> score`` points with scores in 0..10). :meth:`ScoringConfig.arrays` turns
it into the plain integer arrays the placement kernels in :mod:`batchsched.core.placement.kernels`
(and their twins in :mod:`batchsched.core.placement.reference`) take, for one resource column order.

The default bin-packs GPUs: RequestedToCapacityRatio on ``nvidia.com/gpu`` with the shape
0:0, 100:10, so the fuller a node's GPUs would be after placing the pod, the higher it
scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

IntArray: TypeAlias = npt.NDArray[np.int64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]

# Strategy codes, as the kernels take them.
RTCR: Final = 0
LEAST_ALLOCATED: Final = 1
MOST_ALLOCATED: Final = 2

STRATEGY_CODES: Final[dict[str, int]] = {
    "RequestedToCapacityRatio": RTCR,
    "LeastAllocated": LEAST_ALLOCATED,
    "MostAllocated": MOST_ALLOCATED,
}

MAX_NODE_SCORE: Final = 100
"""The score range of one node, as kube-scheduler's ``framework.MaxNodeScore``."""
MAX_CUSTOM_PRIORITY_SCORE: Final = 10
"""The score range of a shape point in the configuration (``config.MaxCustomPriorityScore``)."""
MAX_RESOURCE_WEIGHT: Final = 100
"""kube-scheduler rejects resource weights outside 1..100."""

NON_SCALAR: Final = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})
"""Resources kube-scheduler does not count as scalar (extended, hugepages, ...) resources.

A scalar resource the pod does not request is left out of the node score; a non-scalar
one is scored even when the pod asks for none of it.
"""

NEVER_SCORED: Final = frozenset({"pods"})
"""Resources NodeResourcesFit accepts in its configuration but never scores.

kube-scheduler reads allocatable for cpu, memory, ephemeral-storage and the scalar
resources only; a configured ``pods`` finds an allocatable of 0 and is skipped.
"""


@dataclass(slots=True, frozen=True, eq=False)
class ScoringArrays:
    """A :class:`ScoringConfig` laid out for one resource column order (see the kernels)."""

    strategy: int
    weights: IntArray
    """``[R]``: the weight of each column, 0 for a column that is not scored."""
    scalar: BoolArray
    """``[R]``: true for a scalar resource (skipped when the pod does not request it)."""
    shape_u: IntArray
    """``[K]``: shape utilizations, strictly increasing within 0..100."""
    shape_s: IntArray
    """``[K]``: shape scores scaled to 0..100 (the configured 0..10 times 10)."""
    device: IntArray = field(default_factory=lambda: _no_cards())
    """The GPU card descriptor (:mod:`batchsched.core.placement.cards`)."""


def _no_cards() -> IntArray:
    from batchsched.core.placement.cards import no_cards

    return no_cards()


@dataclass(slots=True, frozen=True)
class ScoringConfig:
    """NodeResourcesFit's ``scoringStrategy``, validated by :meth:`validate`."""

    strategy: str = "RequestedToCapacityRatio"
    resources: tuple[tuple[str, int], ...] = (("nvidia.com/gpu", 1), ("batchsched.io/gpu", 1))
    """``(resource name, weight)`` pairs."""
    shape: tuple[tuple[int, int], ...] = ((0, 0), (100, 10))
    """``(utilization 0..100, score 0..10)`` points; used by RequestedToCapacityRatio only."""

    def validate(self) -> None:
        """Raise :class:`ValueError` with a one-line reason when kube-scheduler would refuse it."""
        if self.strategy not in STRATEGY_CODES:
            known = ", ".join(STRATEGY_CODES)
            raise ValueError(f"scoring strategy {self.strategy!r} is not one of {known}")
        if not self.resources:
            raise ValueError("scoring strategy needs at least one resource")
        seen: set[str] = set()
        for name, weight in self.resources:
            if not name:
                raise ValueError("scoring resource with an empty name")
            if name in seen:
                raise ValueError(f"scoring resource {name!r} is listed twice")
            seen.add(name)
            if not 1 <= weight <= MAX_RESOURCE_WEIGHT:
                raise ValueError(
                    f"weight of scoring resource {name!r} is {weight}, want 1..{MAX_RESOURCE_WEIGHT}"
                )
        if self.strategy != "RequestedToCapacityRatio":
            return
        if not self.shape:
            raise ValueError("RequestedToCapacityRatio needs at least one shape point")
        previous = -1
        for utilization, score in self.shape:
            if not 0 <= utilization <= 100:
                raise ValueError(f"shape utilization {utilization} is outside 0..100")
            if utilization <= previous:
                raise ValueError(
                    f"shape utilizations must increase strictly, got {previous} then {utilization}"
                )
            previous = utilization
            if not 0 <= score <= MAX_CUSTOM_PRIORITY_SCORE:
                raise ValueError(
                    f"shape score {score} at utilization {utilization} is outside "
                    f"0..{MAX_CUSTOM_PRIORITY_SCORE}"
                )

    def arrays(self, columns: Sequence[str]) -> ScoringArrays:
        """The kernel arrays for resources laid out as ``columns``.

        A configured resource that is not a column scores nothing, as in kube-scheduler where
        a node without allocatable for a resource skips it. Does not validate: call
        :meth:`validate` once when the configuration is loaded.
        """
        configured = dict(self.resources)
        weights = np.array(
            [0 if name in NEVER_SCORED else configured.get(name, 0) for name in columns],
            dtype=np.int64,
        )
        scalar = np.array([name not in NON_SCALAR for name in columns], dtype=np.bool_)
        scale = MAX_NODE_SCORE // MAX_CUSTOM_PRIORITY_SCORE
        shape_u = np.array([u for u, _ in self.shape], dtype=np.int64)
        shape_s = np.array([s * scale for _, s in self.shape], dtype=np.int64)
        return ScoringArrays(
            strategy=STRATEGY_CODES[self.strategy],
            weights=weights,
            scalar=scalar,
            shape_u=shape_u,
            shape_s=shape_s,
        )
