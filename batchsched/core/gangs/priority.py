"""The priority classes, as a gang reads its priority and its preemption policy from them.

A ``scheduling.k8s.io`` PodGroup's own ``priority`` and ``preemptionPolicy`` come first
(the apiserver copies them from its class). Otherwise a gang's priority is its PodGroup's
``priorityClassName`` when the class is known, else
the highest of its members' (each pod carries the value its PriorityClass gave it at
creation). Its preemption policy comes from the same place: a gang whose class says
``preemptionPolicy: Never``, or, without a known class, one of whose members does, never
evicts anyone to make room.

Pure: no I/O. One writer (the event intake), like the rest of the gang book.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from batchsched.core.gangs.podgroup import PodGroup
from batchsched.core.model import Pod

__all__ = ["PriorityClasses"]


class PriorityClasses:
    """The priority classes by name, and those whose ``preemptionPolicy`` is ``Never``."""

    def __init__(self) -> None:
        #: name -> value
        self.values: dict[str, int] = {}
        #: the priority classes whose ``preemptionPolicy`` is ``Never``
        self.never: set[str] = set()
        #: bumps whenever a class changes
        self.version = 0

    def event(self, kind: str, name: str, value: int, never: bool = False) -> None:
        """``never``: the class's ``preemptionPolicy`` is ``Never``."""
        self.version += 1
        self.never.discard(name)
        if kind == "DELETED":
            self.values.pop(name, None)
        else:
            self.values[name] = value
            if never:
                self.never.add(name)

    def replace(self, classes: Mapping[str, int], never: Iterable[str] = ()) -> None:
        """A relist: ``never`` names the classes whose ``preemptionPolicy`` is ``Never``."""
        self.version += 1
        self.values = dict(classes)
        self.never = set(never) & set(classes)

    def priority(self, group: PodGroup, members: Iterable[Pod]) -> int:
        if group.upstream is not None and group.upstream.priority is not None:
            return group.upstream.priority
        if group.priority_class and group.priority_class in self.values:
            return self.values[group.priority_class]
        return max((p.priority for p in members), default=0)

    def never_preempts(self, group: PodGroup, members: Iterable[Pod]) -> bool:
        """Whether ``group`` may not evict anyone: its priority class says
        ``preemptionPolicy: Never``, or (when it names no known class) a member does, since
        the gang preempts for all of them (the policy comes from where its priority does)."""
        if group.upstream is not None and (group.upstream.never_preempts or group.upstream.priority is not None):
            return group.upstream.never_preempts
        if group.priority_class and group.priority_class in self.values:
            return group.priority_class in self.never
        return any(p.never_preempts for p in members)
