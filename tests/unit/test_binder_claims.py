"""A Binding that carries ResourceClaims: each claim's allocation and reservation is written
on its status first, with the claim's UID and resourceVersion as preconditions; a claim that
cannot be written keeps the pod unbound; a Binding refused after its claims were written
puts them back as they were read. Against the in-memory FakeKube."""

from __future__ import annotations

import asyncio
import dataclasses

from batchsched.core.plan import Binding, ClaimWrite
from batchsched.kube.claims import claim_path, claim_status_path, claims_path
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


def gang_outcomes(kube: FakeKube, members: list[Binding]) -> dict[str, str]:
    results: dict[str, str] = {}

    async def main() -> None:
        from batchsched.kube.binder import Binder
        from batchsched.kube.fake import FakeSleep
        from tests.unit.test_binder_cards import fast

        binder = Binder(kube, retries=2, on_result=lambda b, o, err: results.__setitem__(b.name, o))
        fast(binder, FakeSleep())
        binder.submit_all(members)
        assert await binder.drain(1.0)

    asyncio.run(main())
    return results


def two_members(kube: FakeKube) -> list[Binding]:
    members = []
    for i in range(2):
        path = claim_status_path("ns", f"m{i}-gpu")
        kube.objects[path] = {"metadata": {"name": f"m{i}-gpu", "uid": f"c{i}", "resourceVersion": "5"}, "status": {}}
        kube.objects[f"/api/v1/namespaces/ns/pods/m{i}"] = {"metadata": {"name": f"m{i}", "namespace": "ns", "uid": f"u{i}"}}
        w = dataclasses.replace(WRITE, name=f"m{i}-gpu", uid=f"c{i}", resource_version="5",
                                reserved_for=({"resource": "pods", "name": f"m{i}", "uid": f"u{i}"},))
        members.append(Binding(uid=f"u{i}", namespace="ns", name=f"m{i}", node="n1", unit="ns:gang", claims=(w,)))
    return members


def test_a_gangs_claims_are_all_written_before_any_member_is_bound() -> None:
    kube = FakeKube()
    members = two_members(kube)
    assert gang_outcomes(kube, members) == {"m0": "bound", "m1": "bound"}
    kinds = [("claim" if "resourceclaims" in c.path else "binding") for c in kube.calls]
    assert kinds == ["claim", "claim", "binding", "binding"]


def test_a_gang_member_whose_claim_cannot_be_written_leaves_the_whole_gang_unbound() -> None:
    kube = FakeKube()
    members = two_members(kube)
    kube.fail[f"PATCH {claim_status_path('ns', 'm1-gpu')}"] = [ConflictError(409, "Conflict", "modified")]
    assert gang_outcomes(kube, members) == {"m0": "failed", "m1": "conflict"}
    assert not [c for c in kube.calls if c.path.endswith("/binding")]
    assert kube.objects[claim_status_path("ns", "m0-gpu")]["status"] == {}  # put back


# -- the claim made for a pod's extended resources ------------------------------------------

CLAIMS = claims_path("ns")
MAPPINGS = ({"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"},)
MADE = ClaimWrite(
    namespace="ns", name="<extended-resources>/u1", uid="", resource_version="", allocation=ALLOCATION,
    reserved_for=(ME,), mappings=MAPPINGS,
    create={"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"generateName": "p-extended-resources-", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}},
)
EXTENDED = Binding(uid="u1", namespace="ns", name="p", node="n1", unit="ns/p", claims=(MADE,))


def test_the_claim_for_extended_resources_is_made_allocated_and_named_in_the_pod_before_the_binding() -> None:
    kube = FakeKube()
    stored_pod(kube)
    assert [o for o, _ in outcomes(kube, EXTENDED)] == ["bound"]
    made = kube.calls[0].body
    name = f"p-extended-resources-{1:05d}"
    assert requests(kube) == [
        ("POST", CLAIMS), ("PATCH", claim_status_path("ns", name)), ("PATCH", "/api/v1/namespaces/ns/pods/p/status"),
        ("POST", BIND_PATH),
    ]
    assert made["metadata"]["generateName"] == "p-extended-resources-"
    status = kube.calls[1].body
    assert status["metadata"] == {"uid": "uid-1", "resourceVersion": "1"}, "the claim made, as the apiserver named it"
    assert status["status"]["reservedFor"] == [ME] and status["status"]["allocation"]["devices"] == ALLOCATION["devices"]
    pod = kube.calls[2].body
    assert pod["metadata"] == {"uid": "u1"}
    assert pod["status"]["extendedResourceClaimStatus"] == {
        "resourceClaimName": name, "requestMappings": [dict(m) for m in MAPPINGS]}


def test_a_refused_binding_deletes_the_claim_made_for_the_pod() -> None:
    kube = FakeKube()
    stored_pod(kube)
    kube.fail[BIND_PATH] = [InvalidError(422, "Invalid", "pod is being deleted")]
    assert [o for o, _ in outcomes(kube, EXTENDED)] == ["failed"]
    [delete] = [c for c in kube.calls if c.method == "DELETE"]
    assert delete.path == claim_path("ns", f"p-extended-resources-{1:05d}")
    assert delete.body["preconditions"] == {"uid": "uid-1"}, "never a claim made again under the name"


def test_a_gang_member_whose_extended_claim_cannot_be_written_leaves_the_gang_unbound_and_deletes_both() -> None:
    kube = FakeKube()
    stored_pod(kube)
    other = dataclasses.replace(
        MADE, name="<extended-resources>/u2", reserved_for=({"resource": "pods", "name": "q", "uid": "u2"},),
        create={**dict(MADE.create or {}), "metadata": {"generateName": "q-extended-resources-", "namespace": "ns"}})
    q = Binding(uid="u2", namespace="ns", name="q", node="n1", unit="ns/p", claims=(other,))
    first, second = f"p-extended-resources-{1:05d}", f"q-extended-resources-{2:05d}"
    kube.fail[f"PATCH {claim_status_path('ns', second)}"] = [ConflictError(409, "Conflict", "modified")]
    assert gang_outcomes(kube, [EXTENDED, q]) == {"p": "failed", "q": "conflict"}
    assert not [c for c in kube.calls if c.path.endswith("/binding")]
    deleted = sorted(c.path for c in kube.calls if c.method == "DELETE")
    assert deleted == [claim_path("ns", first), claim_path("ns", second)]


def test_a_pods_writes_hold_one_slot_so_the_first_bindings_leave_after_a_few_requests() -> None:
    """Twenty pods of four writes each (claim made, its status, the pod's status, the
    Binding) through two slots: a pod's chain goes to its end before another starts, so
    the first Binding is among the first eight requests, not behind every pod's first
    writes (request 41 with one queue for every write)."""
    kube = FakeKube()
    members = []
    for i in range(20):
        me = {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"}
        w = dataclasses.replace(
            MADE, name=f"<extended-resources>/u{i}", reserved_for=(me,),
            create={**dict(MADE.create or {}), "metadata": {"generateName": f"p{i}-extended-resources-", "namespace": "ns"}})
        members.append(Binding(uid=f"u{i}", namespace="ns", name=f"p{i}", node="n1", unit=f"ns/p{i}", claims=(w,)))
    results: dict[str, str] = {}

    async def main() -> None:
        from batchsched.kube.binder import Binder
        from batchsched.kube.fake import FakeSleep
        from tests.unit.test_binder_cards import fast

        binder = Binder(kube, concurrency=2, retries=2, on_result=lambda b, o, err: results.__setitem__(b.name, o))
        fast(binder, FakeSleep())
        binder.submit_all(members)
        assert await binder.drain(1.0)
        assert kube.peak_total <= 2

    asyncio.run(main())
    assert set(results.values()) == {"bound"} and len(results) == 20
    first = next(i for i, c in enumerate(kube.calls) if c.path.endswith("/binding"))
    assert first < 8, [c.path for c in kube.calls[: first + 1]]
