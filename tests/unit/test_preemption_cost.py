"""The victims a preemption costs, through the session on a fake clock: the fewest
GPU-hours of work already done (GPUs x time since ``status.startTime``), as the README
promises, even when the cheapest victims one by one add up to the dearer set."""

from __future__ import annotations

from batchsched.core.session import Session, SessionSettings
from tests.builders import make_pod
from tests.unit.test_session import GPU, T0, Cluster, events

HOUR = 3600.0


def running(name: str, gpus: int, node: str, *, hours: float) -> dict[str, object]:
    """A pod bound to ``node`` that started ``hours`` before the test's clock."""
    return (make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(T0 - hours * HOUR - 5)
            .running(node).started(T0 - hours * HOUR).obj())


def test_one_pod_an_hour_old_is_evicted_rather_than_eight_of_seven_hours() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    c.node("n1", 8)
    fresh = c.pod(running("fresh", 8, "n0", hours=1))
    old = [c.pod(running(f"old-{i}", 1, "n1", hours=7)) for i in range(8)]
    c.step()
    urgent = c.pod(make_pod("urgent").req(cpu="1", **{GPU: "8"}).priority(100).created(T0).obj())
    d = c.step(after=1.0)
    assert [e.uid for e in d.evictions] == [fresh]
    assert events(d, "Preempting") == [
        "preempting 1 pod(s) of default/fresh to place its 1 pod(s) on node(s) n0"
    ]
    assert all(c.node_of(u) == "n1" for u in old)
    c.delete_pod(fresh)
    d = c.step(after=1.0)
    assert [(b.uid, b.node) for b in d.binds] == [(urgent, "n0")]
