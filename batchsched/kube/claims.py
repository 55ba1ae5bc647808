"""The ResourceClaim writes that go before a pod's Binding (dynamic resource allocation).

A pod whose claims this scheduler allocated is bound only after each claim's status says
so, as kube-scheduler does: ``status.allocation`` (the devices chosen, the node selector
they imply, the configuration of their class and claim) and ``status.reservedFor`` with the
pod added. Each write is a merge patch of the claim's ``status`` subresource carrying the
claim's UID and the resourceVersion it was read at: a claim deleted and made again, or
changed since (allocated for another pod meanwhile), answers 409 and nothing is
overwritten.

The claim made for a pod's extended resources (``nvidia.com/gpu`` served by DRA devices,
:mod:`batchsched.core.dra.extended`) is created first (once: a retry after a lost answer
could make a second), then written the same way, then named with its request mappings in
the pod's ``status.extendedResourceClaimStatus``; if the pod is not bound it is deleted
(with its UID as a precondition), not put back.

If a later write or the Binding itself fails, the claims already written are put back as
they were read (the allocation removed when this scheduler wrote it, ``reservedFor``
restored), so nothing stays allocated for a pod that is not bound. When the Binding's
outcome is unknown (it may have landed), or the replica's lease deadline passed, nothing is
put back: a claim reserved for a pod that is still pending keeps the pod to its devices, as
the scheduler that reads it next will see.
"""

from __future__ import annotations

from datetime import UTC, datetime

from batchsched.core.plan import ClaimWrite
from batchsched.kube.api import JSON

__all__ = [
    "claim_delete_body",
    "claim_path",
    "claim_status_path",
    "claims_path",
    "extended_status_patch",
    "release_patch",
    "reserve_patch",
]


def claims_path(namespace: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


def claim_path(namespace: str, name: str) -> str:
    return f"{claims_path(namespace)}/{name}"


def claim_status_path(namespace: str, name: str) -> str:
    return f"{claim_path(namespace, name)}/status"


def claim_delete_body(uid: str) -> JSON:
    """Delete options that refuse to delete a claim made again under the same name."""
    return {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}


def extended_status_patch(pod_uid: str, w: ClaimWrite) -> JSON:
    """The pod's ``status.extendedResourceClaimStatus`` naming the claim made for its
    extended resources and which request serves which container (the kubelet reads it)."""
    return {
        "metadata": {"uid": pod_uid},
        "status": {"extendedResourceClaimStatus": {
            "resourceClaimName": w.name, "requestMappings": [dict(m) for m in w.mappings],
        }},
    }


def reserve_patch(w: ClaimWrite, now: float) -> JSON:
    """The claim allocated (when ``w`` allocates it, stamped ``allocationTimestamp`` at
    ``now`` as kube-scheduler stamps it) and reserved for the pod."""
    status: JSON = {"reservedFor": [dict(r) for r in w.reserved_for]}
    if w.allocation is not None:
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status["allocation"] = {**w.allocation, "allocationTimestamp": stamp}
    return {"metadata": {"uid": w.uid, "resourceVersion": w.resource_version}, "status": status}


def release_patch(w: ClaimWrite) -> JSON:
    """The claim as it was read: the pod out of ``reservedFor``, and the allocation this
    scheduler wrote removed."""
    status: JSON = {"reservedFor": [dict(r) for r in w.reserved_before] or None}
    if w.allocation is not None:
        status["allocation"] = None
    return {"metadata": {"uid": w.uid}, "status": status}
