"""The nominations: the capacity held for preemptors, from a preemption to its end.

A cycle that preempts returns a :class:`~batchsched.core.plan.Nomination` in its plan (the
nodes and requests held for the preemptor's quorum while its victims terminate); the book
keeps the plan's nominations, and the next cycles charge them (:meth:`NominationBook.live`,
passed in the cycle's queue input). A nomination ends:

- when a cycle no longer returns it (its unit was placed, or gave up holding);
- when it is older than the nomination timeout (:meth:`NominationBook.expired`), or its
  queue (or a cohort above it) is stopped (:meth:`NominationBook.stopped`): its preemptor is
  told, and it is given up before the next cycle;
- when a member of its unit is no longer pending (bound, deleted): dropped silently;
- when a victim's eviction is refused (:meth:`NominationBook.drop`).

After a start the book is empty: units whose quorum carries ``status.nominatedNodeName``
(written when they preempted) hold those nodes again (:meth:`NominationBook.restore`).

The book is a read-only mapping of the nominations held, by unit key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from batchsched.core.gangs import GroupBook
from batchsched.core.mirror import ClusterState, Snapshot
from batchsched.core.model import PodUID
from batchsched.core.plan import Nomination, Plan, Unit
from batchsched.core.preemption import restored_nominations
from batchsched.core.queues import QueueBook, QueueTree, StopPolicy

__all__ = ["Due", "NominationBook"]


@dataclass(slots=True, frozen=True)
class Due:
    """What is due of the nominations before a cycle."""

    #: rebuilt from the pods after a start (their Events go to their units again)
    restored: Sequence[Nomination]
    #: given up because they timed out (their preemptors are told)
    expired: Sequence[Nomination]
    #: given up because their queue is stopped, each with the policy (their preemptors are told)
    stopped: Sequence[tuple[Nomination, StopPolicy]]
    #: still held: charged by the cycle
    live: Sequence[Nomination]


class NominationBook(Mapping[str, Nomination]):
    """The nominations held, by unit key (one writer: this module)."""

    def __init__(self, timeout: float) -> None:
        #: a nomination older than this (seconds) is given up
        self.timeout = timeout
        self._held: dict[str, Nomination] = {}
        #: nominations were rebuilt from the pods' nominatedNodeName (first cycle after a start)
        self.restored = False

    def __getitem__(self, unit: str) -> Nomination:
        return self._held[unit]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def before_cycle(
        self, units: Sequence[Unit], state: ClusterState, groups: GroupBook, queues: QueueBook, snap: Snapshot,
        now: float,
    ) -> Due:
        """Before a cycle over ``units``: the nominations restored (after a start), those to
        give up (expired, of a stopped queue) and those the cycle charges (the rest)."""
        structure = queues.structure()
        restored = self.restore(units, state, groups, queues, snap, now)
        expired, stopped = self.expired(state, now), self.stopped(state, structure, now)
        return Due(restored, expired, stopped, self.live(state, structure, now))

    def restore(
        self, units: Sequence[Unit], state: ClusterState, groups: GroupBook, queues: QueueBook, snap: Snapshot,
        now: float,
    ) -> list[Nomination]:
        """After a start (once): the units whose quorum carries ``status.nominatedNodeName``
        hold those nodes again (:func:`~batchsched.core.preemption.restored_nominations`);
        returns the nominations restored."""
        if self.restored:
            return []
        self.restored = True
        found = restored_nominations(units, state, groups, queues, snap, now)
        for n in found:
            self._held.setdefault(n.unit, n)
        return found

    def expired(self, state: ClusterState, now: float) -> list[Nomination]:
        """The nominations the next :meth:`live` gives up because they timed out."""
        return [
            n for n in self._held.values()
            if now - n.since > self.timeout and all(PodUID(u) in state.pending for u in n.pods)
        ]

    def stopped(self, state: ClusterState, tree: QueueTree, now: float) -> list[tuple[Nomination, StopPolicy]]:
        """The nominations the next :meth:`live` gives up because their queue (or a cohort
        above it) is stopped in ``tree`` (the queues' structure), each with that policy
        (those that also timed out are left to :meth:`expired`). A stopped queue admits
        nothing: not even a preemptor whose victims are gone, so the capacity held for it is
        freed at once."""
        out: list[tuple[Nomination, StopPolicy]] = []
        for n in self._held.values():
            stop = _stop_of(n, tree)
            if stop is not StopPolicy.NONE and now - n.since <= self.timeout and all(
                    PodUID(u) in state.pending for u in n.pods):
                out.append((n, stop))
        return out

    def live(self, state: ClusterState, tree: QueueTree, now: float) -> tuple[Nomination, ...]:
        """The nominations still worth holding (the rest are given up): younger than the
        timeout, of a queue not stopped in ``tree``, every member of its unit pending."""
        self._held = {
            key: n for key, n in self._held.items()
            if now - n.since <= self.timeout and _stop_of(n, tree) is StopPolicy.NONE
            and all(PodUID(uid) in state.pending for uid in n.pods)
        }
        return tuple(self._held.values())

    def settle(self, plan: Plan) -> None:
        """After a cycle: the nominations it returned are the ones held."""
        self._held = {n.unit: n for n in plan.nominations}

    def drop(self, unit: str) -> Nomination | None:
        """Give up ``unit``'s nomination (an eviction for it was refused)."""
        return self._held.pop(unit, None)


def _stop_of(n: Nomination, tree: QueueTree) -> StopPolicy:
    return tree.stop_policy(n.queue) if n.queue is not None else StopPolicy.NONE
