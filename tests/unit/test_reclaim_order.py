"""A pod that reclaims its queue's quota, through the session on a fake clock: when the room
it goes to is free already (its victims run on other nodes and only held the quota), it is
bound in the cycle that evicts them, not held until they are gone while a pod submitted
after it takes the free room and the rest of the quota the eviction gave back."""

from __future__ import annotations

from batchsched.core.session import Session, SessionSettings
from tests.unit.test_preemption_policy import cohort, pod, queue
from tests.unit.test_session import Cluster


def test_a_reclaiming_pod_with_free_room_is_bound_at_once_and_before_a_later_alike_pod() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    for name in ("n0", "n1", "n2"):
        c.node(name, 4)
    # a and b (nominal 4 each) share a cohort; b borrows a's 4 GPUs; n2 is free
    s.on_queues_listed([cohort("org"), queue("a", 4, parent="org"), queue("b", 4, parent="org")])
    borrowers = [c.pod(pod(f"b-{i}", 4, queue="b")) for i in range(2)]
    assert len(c.step().binds) == 2
    # two alike 1-GPU pods of a, submitted in the same second, first before second
    first = c.pod(pod("first", 1, queue="a"))
    second = c.pod(pod("second", 1, queue="a"))
    d = c.step(after=1.0)
    # one borrower is evicted to give a back its quota: 4 GPUs, room for both on n2
    assert [e.uid for e in d.evictions] in ([borrowers[0]], [borrowers[1]])
    bound = {b.uid: b.node for b in d.binds}
    assert bound.get(first) == "n2", (bound, d.nominated)
    assert bound.get(second) == "n2", (bound, d.nominated)
    # the reclaiming pod is not left nominated now that it is bound
    assert all(node == "" for ref, node in d.nominated if ref.uid == first)
