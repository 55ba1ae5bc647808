"""One cycle never both places a gang's new members and evicts its running ones: the new
members would be left running as a partial gang once the others are gone.

Found by the scenario worlds (``tests/world.py``, seed 5 at step 558): a gang's elastic
extra was bound in the cycle whose reclaim evicted its running member.
"""

from __future__ import annotations

from typing import Any

from batchsched.core.model import GPU
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group
from tests.unit.test_session import Cluster, gpu_pod


def test_an_extra_is_not_bound_beside_its_gang_evicted_in_the_same_cycle() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("train").min_member(1).build()])
    a = c.pod(gpu_pod("train-0", 4, group="train"))
    assert [x.uid for x in c.step().binds] == [a]
    c.node("n1", 4)  # room for the gang's extra, not for the urgent pod
    extra = c.pod(gpu_pod("train-1", 4, group="train"))
    c.pod(gpu_pod("urgent", 8, priority=100))
    d = c.step(after=1.0)
    assert [e.uid for e in d.evictions] == [a]  # the gang is preempted
    assert extra not in [x.uid for x in d.binds], "an extra bound while its gang is evicted"


def queued(obj: dict[str, Any], queue: str) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {})["batchsched.io/queue"] = queue
    return obj


def test_a_gang_placed_in_a_cycle_is_not_reclaimed_in_it() -> None:
    """Queue b comes first in the fair order (its weight) and places its gang's extra; queue
    a, below its nominal, then reclaims what b borrows: not the gang placed a moment ago."""
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    s.on_queues_listed([
        {"metadata": {"name": "org"}, "spec": {}},
        {"metadata": {"name": "a"}, "spec": {"parent": "org", "resources": [{"name": GPU, "nominal": "8"}]}},
        {"metadata": {"name": "b"}, "spec": {"parent": "org", "weight": 10,
                                             "resources": [{"name": GPU, "nominal": "2"}]}},
        {"metadata": {"name": "lender"}, "spec": {"parent": "org", "resources": [{"name": GPU, "nominal": "2"}]}},
    ])
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("train").min_member(1).build()])
    running = c.pod(queued(gpu_pod("train-0", 4, group="train"), "b"))  # b borrows 2
    c.pod(queued(gpu_pod("x", 4), "a"))
    assert len(c.step().binds) == 2
    c.node("n1", 4)
    extra = c.pod(queued(gpu_pod("train-1", 4, group="train"), "b"))
    c.pod(queued(gpu_pod("a-new", 4), "a"))
    for _ in range(3):
        d = c.step(after=1.0)
        bound, evicted = {x.uid for x in d.binds}, {e.uid for e in d.evictions}
        assert not (extra in bound and running in evicted), "the gang's extra bound while the gang is reclaimed"
