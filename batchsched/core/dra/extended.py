"""Extended resources served by DRA devices: a pod asking ``nvidia.com/gpu: 2`` on a node
whose GPUs a DRA driver publishes.

A DeviceClass may name an *extended resource* (``spec.extendedResourceName``); every class
also stands for the implicit one ``deviceclass.resource.kubernetes.io/<class>``. A pod that
asks, in its containers' requests, for such a resource is served two ways, per node, the
way kube-scheduler 1.37 serves it:

- where the node's allocatable has the resource (a device plugin offers it), by count, as
  any extended resource;
- where it does not, by devices of the class: the scheduler makes one ResourceClaim for
  the pod (the *extended-resource claim*: ``<pod>-extended-resources-<random>``, annotated
  ``resource.kubernetes.io/extended-resource-claim: "true"``, owned by the pod), with one
  ``ExactCount`` request per container and resource, allocates it on the node, and writes
  in the pod's ``status.extendedResourceClaimStatus`` which request serves which
  container's resource (the kubelet reads that).

Which class a resource name stands for (:func:`resolve`): the class naming it explicitly,
the newest one when several do (ties: the first name in order); else the class of the
implicit name. The requests and mappings (:func:`claim_requests`) follow upstream's rules:
one request ``container-<i>-request-<j>`` per long-lived container (regular containers and
sidecars; ``i`` its index among init containers then containers, ``j`` the resource's
index among the container's request names in order), and for the init containers that run
to completion before them, one request of the largest count among them, which each of
them uses (after the requests of the long-lived containers that follow it, which it may
reuse).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from batchsched.core.dra.objects import EXTENDED_ANNOTATION, DeviceClass
from batchsched.core.model import DEVICE_CLASS_PREFIX, ContainerAsk

__all__ = ["claim_body", "claim_requests", "resolve"]


def resolve(classes: Iterable[DeviceClass]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass that serves it."""
    explicit: dict[str, DeviceClass] = {}
    out: dict[str, str] = {}
    for c in classes:
        out[DEVICE_CLASS_PREFIX + c.name] = c.name
        name = c.extended_resource_name
        if not name:
            continue
        best = explicit.get(name)
        # the newer class wins; of two made in the same second, the name first in order
        if best is None or (c.created, best.name) > (best.created, c.name):
            explicit[name] = c
    out.update({name: c.name for name, c in explicit.items()})
    return out


def claim_requests(
    asks: Iterable[ContainerAsk], served: Mapping[str, str],
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``(requests, mappings)``: the device requests of the extended-resource claim for the
    resources of ``served`` (name -> class), and which request each container's resource
    uses (``status.extendedResourceClaimStatus.requestMappings``)."""
    asks = sorted(asks, key=lambda a: a.index)
    requests: list[dict[str, Any]] = []
    mappings: list[dict[str, str]] = []
    for resource in sorted(served):
        klass = served[resource]
        long_lived: dict[int, dict[str, Any]] = {}
        long_maps: list[dict[str, str]] = []
        for a in asks:
            if a.runs_to_completion:
                continue
            req, maps = _for_container(a, resource, klass, ())
            if req is not None:
                long_lived[a.index] = req
            long_maps.extend(maps)
        short: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_maps: list[dict[str, str]] = []
        for a in asks:
            if not a.runs_to_completion:
                continue
            later = tuple(long_lived[i] for i in sorted(long_lived) if i >= a.index)
            req, maps = _for_container(a, resource, klass, later)
            if req is not None:
                short_names.add(req["name"])
                if short is None or short["exactly"]["count"] < req["exactly"]["count"]:
                    short = req
            short_maps.extend(maps)
        if short is not None:
            # the init containers run one at a time: the largest request serves each
            short_maps = [
                {**m, "requestName": short["name"]} if m["requestName"] in short_names else m for m in short_maps
            ]
            requests.append(short)
        requests.extend(long_lived[i] for i in sorted(long_lived))
        mappings.extend(long_maps)
        mappings.extend(short_maps)
    requests.sort(key=lambda r: str(r["name"]))
    return requests, mappings


def _for_container(
    a: ContainerAsk, resource: str, klass: str, reusable: tuple[dict[str, Any], ...],
) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """The request container ``a`` needs for ``resource`` beyond those of ``reusable``
    (None when they cover it), and its mappings."""
    want = dict(a.extended).get(resource, 0)
    if want <= 0:
        return None, []
    maps: list[dict[str, str]] = []
    covered = 0
    for r in reusable:
        covered += int(r["exactly"]["count"])
        maps.append(_mapping(a, resource, str(r["name"])))
        if covered >= want:
            return None, maps
    name = f"container-{a.index}-request-{a.request_names.index(resource)}"
    maps.append(_mapping(a, resource, name))
    return {
        "name": name,
        "exactly": {"deviceClassName": klass, "allocationMode": "ExactCount", "count": want - covered},
    }, maps


def _mapping(a: ContainerAsk, resource: str, request: str) -> dict[str, str]:
    return {"containerName": a.name, "resourceName": resource, "requestName": request}


def claim_body(namespace: str, pod_name: str, pod_uid: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The extended-resource claim to create for a pod: owned by it (so it goes with the
    pod), named after it by the apiserver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod_name[:200]}-extended-resources-",
            "namespace": namespace,
            "annotations": {EXTENDED_ANNOTATION: "true"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid, "controller": True,
            }],
        },
        "spec": {"devices": {"requests": requests}},
    }
