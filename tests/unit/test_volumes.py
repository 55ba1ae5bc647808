"""Volumes and resource claims: the constraint a pod's claims put on it, and when it changes."""

from __future__ import annotations

from typing import Any

from batchsched.core.model import parse_node, parse_pod
from batchsched.core.session import Session
from batchsched.core.volumes import VolumeBook, parse_claim, parse_storage_class, parse_volume
from tests.builders import make_node, make_pod

T0 = 1_800_000_000.0


def _pod(claim: str, **spec: Any) -> dict[str, Any]:
    obj = make_pod("p").req(cpu="1").created(T0 - 10).obj()
    obj["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    obj["spec"].update(spec)
    return obj


def _claim(name: str, storage_class: str = "fast", volume: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"storageClassName": storage_class, "volumeName": volume}}


def _volume(name: str, *hosts: str) -> dict[str, Any]:
    terms = [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(hosts)}]}]
    return {"metadata": {"name": name}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": terms}}}}


def test_a_bound_volume_adds_its_node_affinity_to_the_pods() -> None:
    book = VolumeBook()
    book.claim_event("ADDED", parse_claim(_claim("data", volume="pv-1")))
    book.volume_event("ADDED", *parse_volume(_volume("pv-1", "n1", "n2")))
    zone = {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]}
    pod = book.apply(parse_pod(_pod("data", affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": zone}})))
    assert not pod.invalid
    assert pod.required_terms is not None
    # (zone a OR zone b) AND hostname in (n1, n2): two terms, each with both expressions
    assert [[(r.key, r.values) for r in t.expressions] for t in pod.required_terms] == [
        [("zone", ("a",)), ("kubernetes.io/hostname", ("n1", "n2"))],
        [("zone", ("b",)), ("kubernetes.io/hostname", ("n1", "n2"))],
    ]


def test_claims_that_keep_a_pod_from_being_placed_say_why() -> None:
    book = VolumeBook()
    book.class_event("ADDED", *parse_storage_class(
        {"metadata": {"name": "local"}, "volumeBindingMode": "WaitForFirstConsumer"}))
    book.claim_event("ADDED", parse_claim(_claim("late", storage_class="local")))
    book.claim_event("ADDED", parse_claim(_claim("soon", storage_class="fast")))
    book.claim_event("ADDED", parse_claim(_claim("ghost", volume="pv-missing")))
    assert book.apply(parse_pod(_pod("none"))).invalid == "PersistentVolumeClaim default/none does not exist yet"
    assert book.apply(parse_pod(_pod("late"))).invalid == (
        "PersistentVolumeClaim default/late waits for its first consumer (StorageClass local, "
        "WaitForFirstConsumer): batchsched does not provision volumes yet"
    )
    assert book.apply(parse_pod(_pod("soon"))).invalid == (
        "PersistentVolumeClaim default/soon is not bound to a volume yet"
    )
    assert book.apply(parse_pod(_pod("ghost"))).invalid == (
        "PersistentVolumeClaim default/ghost is bound to PersistentVolume pv-missing, not seen yet"
    )
    dra = make_pod("d").req(cpu="1").obj()
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu-0"}]
    assert not book.apply(parse_pod(dra)).invalid  # ResourceClaims are the device book's


def test_a_waiting_pod_is_placed_once_its_claim_is_bound() -> None:
    s = Session()
    for name in ("n0", "n1", "n2"):
        s.on_node("ADDED", parse_node(make_node(name).cap(cpu="8", memory="8Gi").label(
            **{"kubernetes.io/hostname": name}).obj()))
    s.on_claims_listed([parse_claim(_claim("data"))])
    s.on_pod("ADDED", parse_pod(_pod("data")))
    d = s.step(T0)
    assert d.binds == []
    assert [c.message for c in d.unschedulable] == [
        "pod default/p cannot be scheduled: PersistentVolumeClaim default/data is not bound to a volume yet"
    ]
    s.on_volume("ADDED", parse_volume(_volume("pv-1", "n2")))
    s.on_claim("MODIFIED", parse_claim(_claim("data", volume="pv-1")))
    assert s.wants_step
    d = s.step(T0 + 1)
    assert [(b.name, b.node) for b in d.binds] == [("p", "n2")]
