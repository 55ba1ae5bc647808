"""The watches list in any order when batchsched starts: a pod with a ResourceClaim read
before the nodes is not left waiting on what was found with no node known."""

from __future__ import annotations

from batchsched.core.dra.objects import parse_resource_slice
from batchsched.core.model import parse_node
from tests.builders import make_node
from tests.unit.test_dra_scheduling import DraWorld, gpu_slice


def test_a_pod_whose_claim_was_read_before_any_node_is_placed_once_the_nodes_are_listed() -> None:
    """At start the watches list in any order: a pod and its claim read before the nodes
    are not told forever that no node has devices."""
    w = DraWorld()
    w.session.on_resource_slices_listed([parse_resource_slice(gpu_slice("n0", 1))])
    w.claim("a")
    a = w.pod("a", "a")
    w.session.on_nodes_listed([parse_node(make_node("n0").cap(cpu="64", memory="512Gi").obj())])
    w.step()
    assert w.node_of(a) == "n0"
