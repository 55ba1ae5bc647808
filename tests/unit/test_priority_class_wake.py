"""A PriorityClass that appears (or goes) changes the priority of the gangs whose PodGroup
names it: they are looked at again at once, not after the retry interval."""

from __future__ import annotations

import pytest

from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group
from tests.unit.test_session import Cluster, gpu_pod


@pytest.mark.parametrize("seen_by", ["watch", "relist"])
def test_a_priority_class_created_after_its_gang_went_to_sleep_wakes_the_gang(seen_by: str) -> None:
    s = Session(SessionSettings(gang_report_delay=0.0, retry_unschedulable=60.0))
    c = Cluster(s)
    c.node("n0", 8)
    low = c.pod(gpu_pod("low", 8, priority=0))
    assert [b.uid for b in c.step().binds] == [low]
    # the PodGroup names a class nobody created yet: the gang has its members' priority, 0,
    # and may not preempt "low" (equal priority)
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("g").min_member(2).priority_class("urgent").build()])
    members = [c.pod(gpu_pod(f"g-{i}", 4, priority=0, group="g")) for i in range(2)]
    d = c.step(after=1.0)
    assert d.evictions == [] and d.binds == []
    d = c.step(after=2.0)
    assert d.evictions == []  # asleep: nothing changed

    if seen_by == "watch":
        s.on_priority_class("ADDED", "urgent", 1000)
    else:  # a watch that expired lists the classes again
        s.on_priority_classes_listed({"urgent": 1000})
    d = c.step(after=1.0)
    assert [(e.uid, e.preemptor) for e in d.evictions] == [(low, "x-k8s:default/g")]
    c.delete_pod(low)
    d = c.step(after=1.0)
    assert sorted(b.uid for b in d.binds) == sorted(members)
