"""Earlier preemptions, as a cycle sees them: the nominations it holds and the victims still
terminating.

A preemption evicts its victims and records a :class:`~batchsched.core.plan.Nomination`
(the nodes and requests held for the preemptor's quorum). Until the victims are gone the
next cycles keep that capacity for it: :func:`held_nominations` gives the nominations to
charge to their nodes and queue, and :class:`Terminating` tracks the victims the mirror
still charges (their capacity is not in the walk's usage any more, but a pod bound there
now would over-commit the node until they are gone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchsched.core.gangs import GroupBook, GroupKey
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.placement.cards import cards_over
from batchsched.core.plan import Nomination, Unit
from batchsched.core.queues import QueueBook, QueueTree

__all__ = ["Held", "Terminating", "held_nominations"]

IntArray = npt.NDArray[np.int64]


@dataclass(slots=True, eq=False)
class Held:
    """A nomination charged in this cycle: its nodes as rows, its requests as a matrix."""

    nomination: Nomination
    rows: list[int]
    reqs: IntArray


def held_nominations(
    nominations: Sequence[Nomination], rows: Mapping[str, int], col: Mapping[str, int], tree: QueueTree,
) -> Iterator[Held]:
    """The nominations that can hold, oldest first (``rows``: node name -> row; ``col``:
    resource -> column): those naming an unknown node or resource, or a queue work may not
    name, are dropped."""
    width = len(col)
    for n in sorted(nominations, key=lambda n: (n.since, n.unit)):
        held = [rows.get(name, -1) for name in n.nodes]
        if -1 in held or (n.queue is not None and tree.leaf_problem(n.queue) is not None):
            continue
        reqs = np.zeros((len(n.requests), width), dtype=np.int64)
        known = True
        for m, req in enumerate(n.requests):
            for name, value in req.items():
                c = col.get(name)
                if c is None:
                    known = False
                    break
                reqs[m, c] = value
        if known:
            yield Held(n, held, reqs)


class Terminating:
    """Victims still charged by the mirror (terminating): taken out of ``used`` (the walk's
    working usage, updated in place), but their nodes are not free to bind on until they
    are gone."""

    def __init__(self, used: IntArray, alloc: IntArray, touch: Callable[[list[int]], None] | None = None,
                 device: IntArray | None = None) -> None:
        self.used = used
        #: the device descriptor: cards are counted card by card (:func:`cards_over`)
        self.device = device
        #: told of every row whose usage changes here
        self.touch = touch
        self.alloc = alloc
        self.term = np.zeros_like(used)
        self.pods: dict[int, set[str]] = {}
        #: the uids of the victims
        self.live: set[str] = set()

    def add(self, uid: str, row: int, req: IntArray) -> None:
        self.used[row] -= req
        if self.touch is not None:
            self.touch([row])
        self.term[row] += req
        self.pods.setdefault(row, set()).add(uid)
        self.live.add(uid)

    def blocked_by(self, rows: Sequence[int]) -> set[str]:
        """Victims still terminating on those of ``rows`` that would be over-committed if
        the pods just charged there were bound now (empty: they may be bound), resource by
        resource and card by card."""
        out: set[str] = set()
        for row in set(rows):
            if row not in self.pods:
                continue
            full = self.used[row] + self.term[row]
            if bool((full > self.alloc[row]).any()) or (
                self.device is not None and cards_over(self.alloc[row], full, self.device)
            ):
                out |= self.pods[row]
        return out


def restored_nominations(
    units: Sequence[Unit], state: ClusterState, groups: GroupBook, queues: QueueBook, snap: Snapshot, now: float,
) -> list[Nomination]:
    """After a restart: a unit whose quorum carries ``status.nominatedNodeName`` (written
    when it preempted) holds those nodes again, its victims being the pods still
    terminating there, so the capacity they free still goes to it."""
    tree = queues.tree(snap.columns)
    out = []
    for unit in units:
        quorum = unit.pods[: max(1, unit.min_count)]
        if unit.blocked or not quorum or not all(p.nominated_node in state.nodes for p in quorum):
            continue
        nodes = tuple(p.nominated_node for p in quorum)
        victims = frozenset(p.uid for node in set(nodes) for p in state.pods_on(node) if p.deleting)
        queue = queues.queue_of(quorum, groups.groups.get(GroupKey(unit.key)), tree)
        out.append(Nomination(
            unit=unit.key, queue=queue if isinstance(queue, str) else None,
            pods=tuple(p.uid for p in quorum), nodes=nodes,
            requests=tuple(dict(p.requests) for p in quorum), victims=victims, since=now,
            priority=unit.priority,
        ))
    return out
