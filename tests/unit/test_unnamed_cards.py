"""Whole cards handed out unnamed (``nvidia.com/gpu`` pods: the device plugin picks which) on
a node whose other cards hold KAI-style shares.

A node of 8 cards with a share on each of 4 of them has 4 cards to give out whole. Each
pod placed there must take its cards from that count at once, not only once it is bound
and seen again: otherwise several pods placed in one cycle (a class of alike pods, or the
members of a gang) each see the same 4 free cards, and the node is given 5.
"""

from __future__ import annotations

from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_pod
from tests.unit.test_session import T0, Cluster, gpu_pod


def _node_with_shares(shared_cards: int) -> Cluster:
    c = Cluster(Session(SessionSettings()))
    c.node("n0", 8)
    for i in range(shared_cards):
        obj = make_pod(f"share-{i}").req(cpu="1").annotate(
            {"gpu-fraction": "0.5", "batchsched.io/gpu-cards": f"main={i}"}
        ).created(T0 - 60).obj()
        obj["spec"]["nodeName"] = "n0"
        obj["status"]["phase"] = "Running"
        c.pod(obj)
    return c


def test_alike_pods_placed_in_one_cycle_take_no_more_whole_cards_than_are_free() -> None:
    c = _node_with_shares(4)
    pods = [c.pod(gpu_pod(f"w-{i}", 1)) for i in range(5)]
    c.step()
    c.step(after=20.0)
    assert sum(1 for p in pods if c.node_of(p)) == 4


def test_a_gang_needing_more_whole_cards_than_are_free_is_not_placed() -> None:
    c = _node_with_shares(4)
    c.session.on_podgroup("ADDED", make_group("g").min_member(5).build())
    members = [c.pod(gpu_pod(f"g-{i}", 1, group="g")) for i in range(5)]
    c.step()
    assert [c.node_of(m) for m in members] == [""] * 5


def test_a_gang_that_needs_exactly_the_free_cards_is_placed_and_counted_once() -> None:
    c = _node_with_shares(4)
    c.session.on_podgroup("ADDED", make_group("g").min_member(4).build())
    members = [c.pod(gpu_pod(f"g-{i}", 1, group="g")) for i in range(4)]
    c.step()
    assert all(c.node_of(m) == "n0" for m in members)
    # bound and seen again, the four are counted once: a fifth whole card does not fit,
    # and a share still fits on a card that has room
    late = c.pod(gpu_pod("late", 1))
    c.step(after=20.0)
    assert c.node_of(late) == ""
    half = make_pod("half").req(cpu="1").annotate({"gpu-fraction": "0.5"}).created(T0 - 60).obj()
    c.pod(half)
    c.step(after=20.0)
    assert c.node_of(str(half["metadata"]["uid"])) == "n0"
