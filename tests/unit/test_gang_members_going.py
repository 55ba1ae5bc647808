"""A gang whose members are being evicted (preempted, reclaimed) is not topped up with new
members while they terminate: a terminating member does not count for the quorum of the
members placed next, or the new ones run as a partial gang once it is gone.

Found by the scenario worlds (``tests/world.py``, seed 2 at step 35 of the CI world): a
preempted gang's member was recreated by its operator and bound alone, "placed as one gang"
with the member still terminating.
"""

from __future__ import annotations

from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group
from tests.unit.test_session import Cluster, gpu_pod


def test_a_recreated_member_waits_for_the_evicted_members_to_go() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    s.on_groups_listed("scheduling.x-k8s.io", [make_group("train").min_member(2).build()])
    a = c.pod(gpu_pod("train-0", 4, group="train"))
    b = c.pod(gpu_pod("train-1", 4, group="train"))
    assert sorted(x.uid for x in c.step().binds) == sorted([a, b])
    c.node("n1", 4)  # room for one member, not for the urgent pod

    c.pod(gpu_pod("urgent", 8, priority=100))
    d = c.step(after=1.0)
    assert sorted(e.uid for e in d.evictions) == sorted([a, b])  # the gang is preempted whole

    # one member is gone; its operator makes a new one while the other still terminates
    c.delete_pod(a)
    new = c.pod(gpu_pod("train-2", 4, group="train"))
    d = c.step(after=1.0)
    assert new not in [x.uid for x in d.binds], "bound beside a member that is being evicted"
    d = c.step(after=3.0)  # (a gang blocked before placement is told after a short delay)
    assert new not in [x.uid for x in d.binds]
    told = {x.ref.uid: x.message for x in d.unschedulable}
    assert told.get(new) == (
        "gang default/train waits for its 1 member(s) being evicted to go before any member is placed "
        "again, so that it restarts whole"
    )
