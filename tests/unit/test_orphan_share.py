"""A running pod holding a share of a card on a node the scheduler does not list (the node
was deleted while the pod still runs, or not seen yet): its usage waits for the node, and
the scheduler goes on scheduling. It raised a KeyError in every step (the card's compute
column existed without its memory column), which stopped the replica each time it came up."""

from __future__ import annotations

from batchsched.core import devices
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_node, make_pod


def test_a_share_held_on_a_node_not_listed_does_not_stop_scheduling() -> None:
    s = Session(SessionSettings(), use_jit=False)
    # no node listed has GPU cards: the share's card exists only in the held pod's usage
    s.on_node("ADDED", parse_node(make_node("n0").cap(cpu="8", memory="32Gi").obj()))
    held = make_pod("held").req(cpu="1", **{devices.ELASTIC_CORE: "50"}).obj()
    held["spec"]["nodeName"] = "gone"
    held["status"]["phase"] = "Running"
    held["metadata"]["annotations"] = {f"elasticgpu.io/container-{held['spec']['containers'][0]['name']}": "0"}
    s.on_pod("ADDED", parse_pod(held))
    waiting = make_pod("next").req(cpu="1").obj()
    s.on_pod("ADDED", parse_pod(waiting))
    d = s.step(1_800_000_000.0)
    assert [b.node for b in d.binds] == ["n0"]
