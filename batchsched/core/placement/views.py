"""What a cycle's kernel calls remember of the nodes: per kind of member, its view of every
node (may it go there, and the node's score), valid while the node's usage is unchanged.

Members of one *kind* (same constraints, same requests) see the nodes alike. A cycle places
many small runs of single pods (a queue of mixed sizes breaks into runs of alike pods), and
each run would otherwise look at every node again; with the views it looks only at the nodes
whose usage changed since its kind last looked. See
:func:`batchsched.core.placement.kernels.place_members_cached`.

Every change of the working usage outside the kernel must be told with :meth:`NodeViews.touch`
(or :meth:`NodeViews.touch_all`); a change not told would leave a stale view.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from batchsched.core.model import Pod

IntArray = npt.NDArray[np.int64]

#: kinds of member whose views are kept (the least recently used is given up)
KINDS = 32


def kind_key(pod: Pod) -> Hashable:
    """Members with equal keys are laid out and placed alike."""
    return (pod.constraint_key(), bool(pod.invalid), tuple(sorted(pod.requests.items())))


class NodeViews:
    """The views of up to :data:`KINDS` kinds over ``n_nodes`` nodes, and node versions."""

    def __init__(self, n_nodes: int, kinds: int = KINDS) -> None:
        self.total = np.zeros((kinds + 1, n_nodes), dtype=np.int64)
        self.ok = np.zeros((kinds + 1, n_nodes), dtype=np.bool_)
        self.stamp = np.full((kinds + 1, n_nodes), -1, dtype=np.int64)
        self.version = np.zeros(n_nodes, dtype=np.int64)
        self._rows: OrderedDict[Hashable, int] = OrderedDict()
        self._capacity = kinds

    def kinds(self, pods: Sequence[Pod]) -> IntArray:
        """The view row of each member's kind (a kind seen first gets a fresh row)."""
        out = np.empty(len(pods), dtype=np.int64)
        prev: Pod | None = None
        taken: set[int] = set()  # rows this call's members use: never given to another kind
        for m, pod in enumerate(pods):
            if prev is not None and pod.requests == prev.requests and pod.constraint_key() == prev.constraint_key():
                out[m] = out[m - 1]
                continue
            prev = pod
            key = kind_key(pod)
            row = self._rows.get(key)
            if row is None:
                row = self._free_row(taken)
                if row >= 0:
                    self._rows[key] = row
                    self.stamp[row] = -1
            else:
                self._rows.move_to_end(key)
            if row >= 0:
                taken.add(row)
            out[m] = row
        return out

    def _free_row(self, taken: set[int]) -> int:
        """A row for a new kind: an unused one, or the least recently used kind's that this
        call does not use; -1 (the kernel's scratch row) when every row is in use here."""
        if len(self._rows) < self._capacity:
            return len(self._rows)
        for key, row in self._rows.items():
            if row not in taken:
                del self._rows[key]
                return row
        return -1

    def touch(self, rows: Any) -> None:
        """Usage changed on these node rows."""
        self.version[rows] += 1

    def touch_all(self) -> None:
        self.version += 1
