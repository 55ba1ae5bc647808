"""When a unit that did not fit is worth trying again: kube-scheduler's queueing hints, for
classes of pods and for gangs.

A class of single pods (:mod:`batchsched.core.equivalence`) or a gang that failed *sleeps*:
it is not handed to a cycle until an event that could make it fit happens. The events, and
whom they wake:

- **capacity freed on a node** (a pod there ended or was deleted, a binding was undone, the
  node was added or grew): the sleepers that ask no more than that node now has free
  (each resource; a gang by its smallest member); sleepers held back by the quota of the
  queue tree the pod that ended was charged to wake too (its usage fell);
- **the nodes changed** (labels, taints, readiness, cordoning: a node may now pass a
  filter it failed): everyone;
- **queues, namespaces or disruption budgets changed** (quota, lending, which queue a
  unit goes to, what may be preempted): everyone;
- **the unit itself changed** (a pod's spec, a gang's PodGroup or members): that unit, by
  the session, as it sees the change;
- **a reservation or nomination holder left**: everyone (what it held is free to take);
- **the retry interval passed** (the slow safety timer): the sleeper, whatever happened.

A sleeper an event woke is tried once its back-off (1 s after its first failure, doubling
to 10 s) has passed; a change to the unit itself, or to queues, namespaces or disruption
budgets (what a person does to unblock work) makes it worth trying at once.

Over-waking costs one evaluation of the class; missing a wake costs up to the retry
interval of waiting, so every rule above errs on the side of waking.

Back-off saves futile retries; it never gives a turn away. Capacity freed in a cohort is
taken by whoever the cycle is handed, so a queue whose classes back off would lose what the
fair order owes it to a queue whose class just placed pods (and so is awake), and then
reclaim it by eviction, or never get it when it asks beyond its nominal. Hence the *fair
turn* (:mod:`batchsched.core.books.backlog`): when a step hands the cycle a unit of a
queue, a sleeper an event woke that waits out its back-off in another queue of the same
cohort is handed over too when the fair order puts it first
(:func:`~batchsched.core.queues.fair.queue_rank`: it would not borrow where the other
would, or its queue's share with it admitted is lower).
What keeps it cheap with a large backlog: only sleepers that free capacity could hold now
(:func:`~batchsched.core.equivalence.fit_count`), only the first of each queue (by
priority, then age), only while a unit of another queue of the cohort is awake (else the
first back-off to end brings the rest); and a fair turn takes free capacity only: its
victim search, and what its pods are told if it fails, wait for its own try.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Sleeper", "WaitBook"]

IntArray = npt.NDArray[np.int64]

#: more freed nodes than this in one step: wake everyone rather than compare each
WAKE_ALL_NODES = 256


#: a woken sleeper is tried again no sooner than this after it failed, doubling with each
#: failure in a row up to :data:`MAX_BACKOFF` (kube-scheduler's pod back-off, 1 s to 10 s)
INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 10.0


@dataclass(slots=True)
class Sleeper:
    """A unit or class that failed: when, how many times in a row, what one node must have
    free for it to be worth trying (resource name -> amount), whether quota held it back,
    and whether an event woke it since."""

    since: float
    need: Mapping[str, int]
    #: the top of the queue tree whose quota held it back ("" for any; None: not quota)
    quota: str | None = None
    failures: int = 1
    woken: bool = False
    #: the leaf queue it waits in (None: unqueued, or not known)
    queue: str | None = None

    def backoff(self) -> float:
        return float(min(MAX_BACKOFF, INITIAL_BACKOFF * 2.0 ** (self.failures - 1)))


class WaitBook:
    """The sleepers, by key (a class key for single pods, a unit key for gangs).

    Woken by an event, a sleeper is tried once its back-off has passed (so a busy cluster,
    where capacity frees every second, tries each sleeper at most every few seconds);
    :meth:`forget` (the unit itself changed, or it was placed) makes it worth trying now."""

    def __init__(self) -> None:
        self.sleepers: dict[object, Sleeper] = {}
        #: how many times a sleeper was woken by an event (for the metrics and the tests)
        self.woken = 0

    def __len__(self) -> int:
        return len(self.sleepers)

    def __contains__(self, key: object) -> bool:
        return key in self.sleepers

    def sleep(self, key: object, now: float, need: Mapping[str, int], *, quota: str | None = None,
              queue: str | None = None) -> None:
        before = self.sleepers.get(key)
        failures = before.failures + 1 if before is not None else 1
        self.sleepers[key] = Sleeper(now, dict(need), quota, failures, queue=queue)

    def forget(self, key: object) -> None:
        self.sleepers.pop(key, None)

    def forget_all(self) -> None:
        self.sleepers.clear()

    def wake(self, key: object) -> None:
        s = self.sleepers.get(key)
        if s is not None and not s.woken:
            s.woken = True
            self.woken += 1

    def wake_all(self) -> None:
        for s in self.sleepers.values():
            if not s.woken:
                s.woken = True
                self.woken += 1

    def asleep(self, key: object, now: float, interval: float) -> bool:
        """Whether ``key`` is left out at ``now``: it failed, and neither an event woke it
        (its back-off passed) nor ``interval`` went by."""
        s = self.sleepers.get(key)
        if s is None:
            return False
        waited = now - s.since
        return not (waited >= interval or (s.woken and waited >= s.backoff()))

    def backing_off(self, now: float, interval: float) -> dict[object, str]:
        """The queued sleepers an event woke that are left out at ``now`` only because their
        back-off has not passed: key -> the queue each waits in (candidates for a fair turn)."""
        out: dict[object, str] = {}
        for key, s in self.sleepers.items():
            if s.woken and s.queue is not None and now - s.since < min(s.backoff(), interval):
                out[key] = s.queue
        return out

    def next_try(self, now: float) -> float | None:
        """The earliest time after ``now`` at which a woken sleeper's back-off ends (None:
        no woken sleeper waits for one)."""
        ends = [s.since + s.backoff() for s in self.sleepers.values() if s.woken and s.since + s.backoff() > now]
        return min(ends, default=None)

    def freed(self, free: Iterable[IntArray], columns: Mapping[str, int], roots: Collection[str] = ()) -> None:
        """Capacity was freed on some nodes; ``free``: each such node's free capacity now;
        ``roots``: the queue trees whose usage fell. Wakes the sleepers it could be enough
        for, and those the quota of one of those trees held back."""
        rows = list(free)
        if not (rows or roots) or not self.sleepers:
            return
        if len(rows) > WAKE_ALL_NODES:
            self.wake_all()
            return
        matrix = np.stack(rows) if rows else None
        for s in self.sleepers.values():
            if s.woken:
                continue
            if (s.quota is not None and (s.quota in roots or not s.quota)) or (
                    matrix is not None and _fits_any(matrix, s.need, columns)):
                s.woken = True
                self.woken += 1

    def prune(self, keep: Callable[[object], bool]) -> None:
        """Drop the sleepers ``keep`` says are gone (their class or gang has no pods left)."""
        for key in [k for k in self.sleepers if not keep(k)]:
            del self.sleepers[key]


def _fits_any(free: IntArray, need: Mapping[str, int], columns: Mapping[str, int]) -> bool:
    ok = np.ones(free.shape[0], dtype=np.bool_)
    for name, value in need.items():
        col = columns.get(name)
        if value <= 0:
            continue
        if col is None or col >= free.shape[1]:
            return False
        ok &= free[:, col] >= value
    return bool(ok.any())
