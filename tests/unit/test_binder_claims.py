"""A Binding that carries ResourceClaims: each claim's allocation and reservation is written
on its status first, with the claim's UID and resourceVersion as preconditions; a claim that
cannot be written keeps the pod unbound; a Binding refused after its claims were written
puts them back as they were read. Against the in-memory FakeKube."""

from __future__ import annotations

import dataclasses

from batchsched.core.plan import Binding, ClaimWrite
from batchsched.kube.claims import claim_status_path
from batchsched.kube.errors import ConflictError, InvalidError
from batchsched.kube.fake import FakeKube
from tests.unit.test_binder_cards import BIND_PATH, outcomes, requests, stored_pod

CLAIM = claim_status_path("ns", "p-gpu")
OTHER = claim_status_path("ns", "p-mig")
ME = {"resource": "pods", "name": "p", "uid": "u1"}
ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"}]},
              "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                  {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}
WRITE = ClaimWrite(namespace="ns", name="p-gpu", uid="c1", resource_version="41", allocation=ALLOCATION,
                   reserved_for=(ME,))
SHARED = ClaimWrite(namespace="ns", name="p-mig", uid="c2", resource_version="7", allocation=None,
                    reserved_for=({"resource": "pods", "name": "q", "uid": "u9"}, ME),
                    reserved_before=({"resource": "pods", "name": "q", "uid": "u9"},))
BINDING = Binding(uid="u1", namespace="ns", name="p", node="n1", unit="ns/p", claims=(WRITE, SHARED))


def stored_claims(kube: FakeKube) -> None:
    kube.objects[CLAIM] = {"metadata": {"name": "p-gpu", "uid": "c1", "resourceVersion": "41"}, "status": {}}
    kube.objects[OTHER] = {"metadata": {"name": "p-mig", "uid": "c2", "resourceVersion": "7"},
                           "status": {"allocation": {"devices": {"results": []}},
                                      "reservedFor": [{"resource": "pods", "name": "q", "uid": "u9"}]}}


def test_the_claims_are_allocated_and_reserved_before_the_binding_with_preconditions() -> None:
    kube = FakeKube()
    stored_pod(kube)
    stored_claims(kube)
    assert [o for o, _ in outcomes(kube, BINDING)] == ["bound"]
    assert requests(kube) == [("PATCH", CLAIM), ("PATCH", OTHER), ("POST", BIND_PATH)]
    first = kube.calls[0].body
    assert first["metadata"] == {"uid": "c1", "resourceVersion": "41"}
    assert first["status"]["reservedFor"] == [ME]
    assert first["status"]["allocation"]["devices"] == ALLOCATION["devices"]
    assert first["status"]["allocation"]["allocationTimestamp"].endswith("Z")
    shared = kube.calls[1].body
    assert "allocation" not in shared["status"]  # allocated already: only reserved for the pod too
    assert shared["status"]["reservedFor"][-1] == ME


def test_a_claim_changed_since_it_was_read_keeps_the_pod_unbound_and_the_first_claim_is_put_back() -> None:
    kube = FakeKube()
    stored_pod(kube)
    stored_claims(kube)
    kube.fail[f"PATCH {OTHER}"] = [ConflictError(409, "Conflict", "the object has been modified")]
    assert [o for o, _ in outcomes(kube, BINDING)] == ["conflict"]
    assert BIND_PATH not in kube.paths()
    put_back = [c.body for c in kube.calls if c.path == CLAIM][-1]
    assert put_back["status"] == {"reservedFor": None, "allocation": None}
    assert kube.objects[CLAIM]["status"] == {}


def test_a_refused_binding_puts_every_claim_back_as_it_was_read() -> None:
    kube = FakeKube()
    stored_pod(kube)
    stored_claims(kube)
    before = dataclasses.replace(BINDING)
    kube.fail[BIND_PATH] = [InvalidError(422, "Invalid", "pod is being deleted")]
    assert [o for o, _ in outcomes(kube, before)] == ["failed"]
    assert kube.objects[CLAIM]["status"] == {}
    assert kube.objects[OTHER]["status"]["reservedFor"] == [{"resource": "pods", "name": "q", "uid": "u9"}]
    assert kube.objects[OTHER]["status"]["allocation"] == {"devices": {"results": []}}
