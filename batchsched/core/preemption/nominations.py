"""Earlier preemptions, as a cycle sees them: the nominations it holds and the victims still
terminating.

A preemption evicts its victims and records a :class:`~batchsched.core.plan.Nomination`
(the nodes and requests held for the preemptor's quorum). Until the victims are gone the
next cycles keep that capacity for it: :func:`held_nominations` gives the nominations to
charge to their nodes and queue (the victims the mirror still charges are the cycle
statement's: :class:`~batchsched.core.statement.Terminating`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchsched.core.gangs import GroupBook, GroupKey
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.plan import Nomination, Unit
from batchsched.core.queues import QueueBook, QueueTree

__all__ = ["Held", "held_nominations"]

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
    """The nominations that can hold, oldest first, those of one cycle in the order it made
    them (the order ``nominations`` has: a cycle keeps it), as its walk went (``rows``:
    node name -> row; ``col``: resource -> column): those naming an unknown node or
    resource, or a queue work may not name, are dropped."""
    width = len(col)
    for n in sorted(nominations, key=lambda n: n.since):
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


def restored_nominations(
    units: Sequence[Unit], state: ClusterState, groups: GroupBook, queues: QueueBook, snap: Snapshot, now: float,
) -> list[Nomination]:
    """After a restart: a unit whose quorum carries ``status.nominatedNodeName`` (written
    when it preempted) holds those nodes again, its victims being the pods still
    terminating there, so the capacity they free still goes to it."""
    tree = queues.tree(snap.columns)
    out = []
    for unit in units:
        if not unit.pods or not unit.pods[0].nominated_node or unit.blocked:
            continue  # most units: nothing nominated (a restart hands over every one)
        quorum = unit.pods[: max(1, unit.min_count)]
        if not all(p.nominated_node in state.nodes for p in quorum):
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
