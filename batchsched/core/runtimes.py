"""How long pods like a given one ran: the ends a start estimate uses when a running pod
declares none.

A pod that declares how long it runs (``activeDeadlineSeconds`` or the annotation
``batchsched.io/expected-runtime``, :func:`~batchsched.core.reservation.declared_runtime`)
needs nothing here. For one that does not, the pods *like* it that ran to completion tell:
the members of the same PodGroup (a job's pods restarted, or its other replicas), else the
pods of its namespace whose names differ only after the last dash (one Job's, one
ReplicaSet's, one training job's replicas). The book keeps the last few run times of each
kind and answers their median.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque

from batchsched.core.model import Pod

__all__ = ["RunTimes", "like_key"]

#: run times kept per kind of pod
KEEP = 16
#: kinds of pod remembered at most (the oldest forgotten first)
KINDS = 4096


def like_key(pod: Pod, group: str | None) -> str:
    """What pods count as alike: the same PodGroup, else the same name stem."""
    if group:
        return group
    stem = pod.name.rsplit("-", 1)[0] if "-" in pod.name else pod.name
    return f"{pod.namespace}/{stem}"


class RunTimes:
    """Observed run times (seconds from start to success) by :func:`like_key`."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def record(self, key: str, seconds: float) -> None:
        if seconds <= 0:
            return
        kept = self._seen.get(key)
        if kept is None:
            kept = self._seen[key] = deque(maxlen=KEEP)
            while len(self._seen) > KINDS:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(key)
        kept.append(seconds)

    def typical(self, key: str) -> float | None:
        """The median run time of the pods of ``key`` seen to succeed, None when none was."""
        kept = self._seen.get(key)
        return statistics.median(kept) if kept else None
