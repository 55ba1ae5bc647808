"""A card a terminating victim still holds is not given to another pod: on a node with whole
and shared cards, room is counted card by card, not by column sums.

Found by the scenario worlds (``tests/world.py``, seed 12 at step 280): a whole-card pod was
bound on node n2 beside a victim still terminating there, its preemptor having gone
elsewhere; two cards carried shares, so the node gave out 7 whole cards on the 6 left.
"""

from __future__ import annotations

from typing import Any

from batchsched.core.model import GPU, parse_node, parse_pod
from batchsched.core.session import Decisions, Session, SessionSettings
from tests.builders import make_node, make_pod
from tests.unit.test_session import Cluster, gpu_pod

CORE = "elasticgpu.io/gpu-core"
CARD_MEMORY = "elasticgpu.io/gpu-memory"


class CardCluster(Cluster):
    """A cluster whose nodes have cards (card memory known) and whose Bindings carry the
    card assignment written on the pod, as the binder writes it."""

    def node(self, name: str, gpus: int) -> None:
        obj = make_node(name).cap({"cpu": "64", "memory": "512Gi", GPU: str(gpus), CORE: str(100 * gpus),
                                   CARD_MEMORY: str(16384 * gpus)}).obj()
        self.nodes[name] = obj
        self.session.on_node("ADDED", parse_node(obj))

    def step(self, *, after: float = 0.0) -> Decisions:
        self.now += after
        d = self.session.step(self.now)
        for b in d.binds:
            obj = self.pods[b.uid]
            obj["metadata"].setdefault("annotations", {}).update(dict(b.annotations))
            obj["metadata"].setdefault("labels", {}).update(dict(b.labels))
            obj["spec"]["nodeName"] = b.node
            obj["status"]["phase"] = "Running"
            self.session.on_bind_result(b, "bound", now=self.now)
            self.session.on_pod("MODIFIED", parse_pod(obj))
        for e in d.evictions:
            self.pods[e.uid]["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
            self.session.on_evict_result(e, "evicted")
            self.session.on_pod("MODIFIED", parse_pod(self.pods[e.uid]))
        return d


def share_pod(name: str) -> dict[str, Any]:
    """A quarter of a card and most of its memory: two such pods share no card."""
    return make_pod(name).req({"cpu": "1", CORE: "25", CARD_MEMORY: "12000"}).obj()


def test_no_whole_card_is_bound_on_a_card_a_victim_still_holds() -> None:
    s = Session(SessionSettings())
    c = CardCluster(s)
    c.node("n0", 3)
    # a share on each of two cards: neither is free for a whole-card ask, though their
    # compute (500 milli in all) and the whole card of the victim leave 1500 milli of 3000
    c.pod(share_pod("shared-0"))
    c.pod(share_pod("shared-1"))
    victim = c.pod(gpu_pod("victim", 1))
    assert len(c.step().binds) == 3
    c.pod(gpu_pod("urgent", 1, priority=100))
    d = c.step(after=1.0)
    assert [e.uid for e in d.evictions] == [victim]

    c.node("n1", 1)  # the urgent pod goes here, where nothing terminates; its hold on n0 ends
    late = c.pod(gpu_pod("late", 1))
    for _ in range(3):
        d = c.step(after=1.0)
        assert late not in [b.uid for b in d.binds if b.node == "n0"], (
            "bound on the card the victim still holds (two cards shared, one whole, of three)")
