"""A preemptor waiting for its victims to terminate takes room that frees elsewhere in the
meantime, instead of holding on while pods behind it (alike, submitted after it) take that
room.

Found by the scenario worlds (``python -m perf world --features bursts --known fifo
--first 602 --seeds 1 --steps 48``): of three alike pods submitted together, the first
preempted a pod and waited for it to go, while the two behind it were bound on room that
freed in between.
"""

from __future__ import annotations

from batchsched.core.session import Session, SessionSettings
from tests.unit.test_session import Cluster, gpu_pod


def test_a_preemptor_takes_room_that_frees_while_its_victim_terminates() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 4)
    c.node("n1", 4)
    low = c.pod(gpu_pod("low", 4, priority=0))
    mid = c.pod(gpu_pod("mid", 4, priority=50))
    c.step()
    assert {c.node_of(low), c.node_of(mid)} == {"n0", "n1"}

    urgent = c.pod(gpu_pod("urgent", 4, priority=100))
    d = c.step(after=1.0)
    assert [e.uid for e in d.evictions] == [low]  # it preempts; low terminates

    free = c.node_of(mid)
    c.delete_pod(mid)  # mid ends: its node is free while low still terminates
    d = c.step(after=1.0)
    assert [(b.uid, b.node) for b in d.binds] == [(urgent, free)]
