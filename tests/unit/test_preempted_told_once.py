"""A gang preempted by one preemptor is told so once on its PodGroup, however its
members' eviction results and the preemptor's placement interleave."""

from __future__ import annotations

from batchsched.core.decisions import Decisions
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group
from tests.unit.test_session import Cluster, gpu_pod


def _group_preempted(d: Decisions) -> list[str]:
    return [e.message for e in d.events if e.reason == "Preempted" and e.ref.kind == "PodGroup"]


def test_the_podgroup_is_told_once_when_the_preemptor_is_placed_before_the_last_eviction_lands() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("low").min_member(2).build()])
    members = [c.pod(gpu_pod(f"low-{i}", 8, group="low")) for i in range(2)]
    assert sorted(b.uid for b in c.step().binds) == sorted(members)
    c.pod(gpu_pod("urgent", 8, priority=100))
    d = s.step(c.now + 1)
    assert sorted(e.uid for e in d.evictions) == sorted(members)
    first, second = d.evictions
    told = _group_preempted(s.on_evict_result(first, "evicted"))
    # the first victim is gone at once: the preemptor is placed there, its nomination over
    c.delete_pod(first.uid)
    placed = s.step(c.now + 2)
    assert [b.name for b in placed.binds] == ["urgent"]
    # the second victim's eviction is answered only now
    told += _group_preempted(s.on_evict_result(second, "evicted"))
    assert len(told) == 1, told
