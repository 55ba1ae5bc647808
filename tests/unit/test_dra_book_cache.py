"""The device book keeps what it can between events: each node's devices until the devices
or the node's labels change, and the use the claims' status says, a claim written back
added to it. What it keeps must be what it would find again from scratch."""

from __future__ import annotations

from batchsched.core.dra.allocator import in_use_from_claims
from batchsched.core.dra.objects import parse_resource_slice
from batchsched.core.model import parse_node
from batchsched.sandbox import gpudra
from tests.builders import make_node
from tests.unit.test_dra_scheduling import DraWorld


def mig_world() -> DraWorld:
    w = DraWorld()
    for name in ("n0", "n1"):
        w.session.on_node("ADDED", parse_node(make_node(name).cap(cpu="64", memory="512Gi").obj()))
        for s in gpudra.gpu_node_slices(name, gpus=2, mig="partitionable"):
            w.session.on_resource_slice("ADDED", parse_resource_slice(s))
    return w


def test_the_use_kept_across_claims_written_back_is_the_use_rebuilt_from_every_claim() -> None:
    w = mig_world()
    book = w.session.intake.devices
    for i in range(6):
        w.claim(f"slice-{i}", device_class="mig.nvidia.com",
                selectors=[{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'"}}])
        w.pod(f"p{i}", f"slice-{i}")
    w.claim("whole", device_class="gpu.nvidia.com")
    w.pod("pw", "whole")
    book.confirmed()  # known before the claims are written back: from then on, kept
    for _ in range(3):
        w.step()
    kept = book.confirmed()
    rebuilt = in_use_from_claims(book.claims.values(), book.pools)
    assert len(kept.devices) == 7  # 6 of the 8 3g placements and a GPU whole: all there is
    assert kept == rebuilt
    # a claim given back is rebuilt from every claim
    uid = next(u for u, p in w.pods.items() if p["metadata"]["name"] == "pw")
    w.delete(uid)
    assert book.confirmed() == in_use_from_claims(book.claims.values(), book.pools)
    assert len(book.confirmed().devices) == 6


def test_a_node_relabelled_gets_its_devices_found_again() -> None:
    w = DraWorld()
    w.session.on_node("ADDED", parse_node(make_node("n0").obj()))
    selector = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}]}
    rs = gpudra.gpu_node_slices("pool-a", gpus=2)[0]
    del rs["spec"]["nodeName"]
    rs["spec"]["nodeSelector"] = selector
    w.session.on_resource_slice("ADDED", parse_resource_slice(rs))
    book = w.session.intake.devices
    assert book.node_devices("n0").devices == ()
    w.session.on_node("MODIFIED", parse_node(make_node("n0").label({"zone": "a"}).obj()))
    assert len(book.node_devices("n0").devices) == 2
