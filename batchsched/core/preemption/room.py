"""What a gang could have, for its ``minResources``: the free capacity, and the running
work it may preempt or reclaim by the one eviction rule (:func:`entitled`).

A gang's ``minResources`` is weighed against this, not against free capacity alone: a
high-priority training job on a cluster full of lower-priority work is entitled to the
room its preemption frees, and a queue below its nominal to what others borrowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from batchsched.core.gangs import GroupBook, PodGroup, free_capacity
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import Pod
from batchsched.core.plan import RunningUnit
from batchsched.core.preemption.candidates import Claim, entitled
from batchsched.core.queues import QueueBook, QueueTree

__all__ = ["Room"]


class Room:
    """Built once per step; computes lazily, on the first group that has ``minResources``:
    ``snapshot()`` gives the step's snapshot (taken only then), and the free capacity, the
    queue tree and the running units are kept for the other groups of the step."""

    def __init__(
        self, state: ClusterState, groups: GroupBook, queues: QueueBook,
        snapshot: Callable[[], Snapshot], now: float,
    ) -> None:
        self.state, self.groups, self.queues = state, groups, queues
        self.snapshot, self.now = snapshot, now
        self._free: dict[str, int] | None = None
        self._running: tuple[QueueTree, list[RunningUnit]] | None = None

    def __call__(self, group: PodGroup, pods: Sequence[Pod]) -> tuple[dict[str, int], dict[str, int]]:
        """(free capacity, what ``group`` may preempt), per resource."""
        snap = self.snapshot()
        if self._free is None:
            self._free = free_capacity(snap)
        if not self.queues.settings.preemption or self.groups.never_preempts(group, pods):
            return self._free, {}  # it may evict nobody: free capacity is all it could have
        if self._running is None:
            tree = self.queues.tree(snap.columns)
            running = self.queues.running(state=self.state, groups=self.groups, snap=snap, tree=tree, now=self.now)
            self._running = (tree, running)
        tree, running = self._running
        q = self.queues.queue_of(pods, group, tree)
        claim = Claim(
            key=group.key, uid=group.uid or group.key, queue=q if isinstance(q, str) else None,
            priority=self.groups.priority(group, pods), created=group.created, name=group.display,
        )
        vec = entitled(claim, running, tree, len(snap.columns))
        return self._free, {c: int(vec[i]) for i, c in enumerate(snap.columns) if vec[i]}
