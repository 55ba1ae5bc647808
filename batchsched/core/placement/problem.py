"""The placement problem: what a placement kernel is asked, as one value.

A :class:`PlacementProblem` holds the nodes (``alloc``, ``used``), the members (``reqs``,
``sig``), what each signature may use and how it scores the nodes (``masks``, ``static``),
the scoring strategy with the GPU card descriptor (``scoring``) and the quorum
(``min_count``). A :class:`Place` solves one: it writes each member's node into ``out`` and
returns how many were placed. The kernel (:func:`batchsched.core.placement.kernels.place`),
its twin (:func:`batchsched.core.placement.reference.place`), the topology-aware placement,
the cycle and the victim search all pass this value around; only :func:`~batchsched.core.placement.kernels.place`
spells it out into the numba kernels' positional arguments.

A solver writes into the problem's arrays: placed members are added to ``used``, and the
cards each placed member got are written into its row of ``reqs``. Whoever wants to keep the
arrays unchanged hands over copies (:meth:`PlacementProblem.copy`). See
:mod:`batchsched.core.placement.kernels` for the arrays' shapes, units and dtypes.

A ``NamedTuple`` and not a frozen dataclass: the cycle builds one per kernel call, and a
tuple is built in a fraction of the time (the value is never compared, hashed or iterated).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from batchsched.core.placement.scoring import BoolArray, IntArray, ScoringArrays

__all__ = ["Place", "PlacementProblem"]


class PlacementProblem(NamedTuple):
    """Members to place on nodes; see the module docstring and the kernels' for the layout."""

    alloc: IntArray
    """``[N, R]``: each node's allocatable."""
    used: IntArray
    """``[N, R]``: what is requested on each node; placed members are added to it."""
    reqs: IntArray
    """``[M, R]``: what each member asks for (its card columns are written by the solver)."""
    sig: IntArray
    """``[M]``: each member's signature, a row of ``masks`` and ``static``."""
    masks: BoolArray
    """``[S, N]``: the nodes each signature may use."""
    static: IntArray
    """``[S, N]``: each signature's static score of each node, added to the resource score."""
    scoring: ScoringArrays
    """The scoring strategy and the card descriptor, for the resource columns."""
    min_count: int
    """The quorum: the first ``min_count`` members are placed all together or not at all."""

    def copy(self) -> PlacementProblem:
        """The same problem over copies of the arrays a solver writes (``used``, ``reqs``)."""
        return self._replace(used=self.used.copy(), reqs=self.reqs.copy())


class Place(Protocol):
    """A solver: the kernel, its twin, or a placement built on them (topology, pod rules).

    Places ``problem``'s members, writes each one's node (or -1) into ``out[:M]`` and
    returns the number placed.
    """

    def __call__(self, problem: PlacementProblem, out: IntArray, /) -> int: ...
