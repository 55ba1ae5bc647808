"""A pod whose Binding the apiserver refused is told so (``PodScheduled=False`` and a
FailedScheduling Event), not left silent while it backs off before it is placed again.

Found by the scenario worlds (``tests/world.py``: ``python -m perf world --first 114 --seeds 1
--steps 842``): two pods refused at step 834 waited 8 steps, backing off, with no condition.
"""

from __future__ import annotations

from batchsched.core.session import Session, SessionSettings
from tests.unit.test_session import T0, Cluster, gpu_pod


def test_a_refused_binding_is_told_to_its_pod() -> None:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 8)
    uid = c.pod(gpu_pod("p", 1))
    d = s.step(T0)
    (b,) = d.binds
    out = s.on_bind_result(b, "failed", now=T0)
    told = {x.ref.uid: (x.reason, x.message) for x in out.unschedulable}
    assert told.get(uid) == (
        "BindingRejected", "the Binding to node n0 was refused; the pod will be placed again",
    )
    # the apiserver's reason is passed on when it gave one
    d = s.step(T0 + 30)
    (b,) = d.binds
    out = s.on_bind_result(b, "failed", now=T0 + 30, error="admission webhook denied the request")
    assert [x.message for x in out.unschedulable] == [
        "the Binding to node n0 was refused (admission webhook denied the request); the pod will be placed "
        "again",
    ]
    # a Binding that went through is not told anything of the kind
    d = s.step(T0 + 60)
    (b,) = d.binds
    assert s.on_bind_result(b, "bound", now=T0 + 60).unschedulable == []
