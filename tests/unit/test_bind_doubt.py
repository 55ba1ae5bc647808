"""A Binding whose answer was lost (the apiserver killed mid-request, a connection cut) may
have landed: the room it took stays held until the pod is read again. Seen on the real
control plane: nine one-GPU pods on an 8-GPU node after kube-apiserver was killed while a
gang's Bindings were in flight."""

from __future__ import annotations

from batchsched.core.model import PodUID, parse_pod
from batchsched.core.session import Session, SessionSettings
from tests.unit.test_session import GPU, Cluster, gpu_pod


def _world() -> tuple[Cluster, str]:
    s = Session(SessionSettings())
    c = Cluster(s)
    c.node("n0", 1)
    first = c.pod(gpu_pod("first", 1))
    return c, first


def _unanswered(c: Cluster, uid: str) -> None:
    """The step binds ``uid``; the binder hears nothing back."""
    c.now += 1.0
    d = c.session.step(c.now)
    assert [b.uid for b in d.binds] == [uid]
    [b] = d.binds
    out = c.session.on_bind_result(b, "unknown", now=c.now)
    assert [r.uid for r in out.resyncs] == [uid]  # read again


def test_an_unanswered_binding_keeps_its_room_until_the_pod_is_read_bound() -> None:
    c, first = _world()
    _unanswered(c, first)
    second = c.pod(gpu_pod("second", 1))
    for _ in range(5):
        assert c.step(after=5.0).binds == []  # the room is held: it may be taken
    # the read shows the Binding landed
    c.pods[first]["spec"]["nodeName"] = "n0"
    c.pods[first]["status"]["phase"] = "Running"
    c._modified(first)
    c.session.on_pod_read(PodUID(first), now=c.now)
    for _ in range(3):
        assert c.step(after=15.0).binds == []
    assert second in c.session.state.pending
    used = sum(p.requests.get(GPU, 0) for p in map(parse_pod, c.pods.values()) if p.node_name == "n0")
    assert used == parse_pod(c.pods[first]).requests[GPU]  # one pod's GPU, not two


def test_an_unanswered_binding_read_unbound_is_placed_again() -> None:
    c, first = _world()
    _unanswered(c, first)
    c._modified(first)  # read again: still unbound
    c.session.on_pod_read(PodUID(first), now=c.now)
    bound = [b.uid for k in range(6) for b in c.step(after=5.0).binds]
    assert bound == [first]


def test_a_conflict_holds_the_room_until_the_read_too() -> None:
    # an earlier attempt landed, its answer lost; the retry is told 409 (already bound)
    c, _ = _world()
    c.now += 1.0
    [b] = c.session.step(c.now).binds
    c.session.on_bind_result(b, "conflict", now=c.now)
    c.pod(gpu_pod("second", 1))
    assert c.step(after=1.0).binds == []
