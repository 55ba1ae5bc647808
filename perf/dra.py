"""GPUs through Dynamic Resource Allocation in the perf suite.

A workload whose nodes say ``dra: true`` gets, on its fresh control plane, the
``resource.k8s.io/v1`` objects NVIDIA's DRA GPU driver would publish
(:mod:`batchsched.sandbox.gpudra`): its DeviceClasses, and per node the ResourceSlices of
eight whole A100s, or, on the ``mig_share`` of nodes :func:`perf.workload.mig_node` picks,
of eight partitionable H100s (every MIG placement, made on allocation). Its pods ask their
GPUs through one ResourceClaimTemplate per pod class instead of ``nvidia.com/gpu`` (whole
GPUs of the A100s, by product, or MIG devices of one profile), and
kube-controller-manager makes each pod's claim from it. Every scheduler gets the same
objects; only ``schedulerName`` differs.

A class with ``extended: true`` asks its GPUs the other way DRA serves them: as
``nvidia.com/gpu`` in the container's requests and limits, with no claim of its own. The
``gpu.nvidia.com`` DeviceClass then names that extended resource (``extendedResourceName``,
as the driver's chart sets it), and the scheduler makes one claim for each such pod
(annotated :data:`EXTENDED_MARK`, owned by the pod), allocates it, writes the pod's
``status.extendedResourceClaimStatus`` and binds (DRAExtendedResource); making the claim is
part of what is measured.

Before the scheduler starts, the harness waits until every template pod's claim is made
(its ``status.resourceClaimStatuses`` names it): how fast the controller makes claims is not
what is measured. After the run, :func:`device_use` reads every claim back and counts the
devices handed out twice, which must be none, and the bound pods of extended classes without
exactly one allocated claim made for them on their node with the GPUs they asked, which
must be none too.

The Binding ceiling of a DRA workload (:mod:`perf.ceiling`) writes, for each pod, what a
scheduler writes with no scheduling logic: its claim's status (allocation + reservedFor,
with the claim's UID and resourceVersion as preconditions) then the Binding.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.sandbox import gpudra
from perf.workload import GPU_CLASS, GPU_PRODUCT, MIG_PRODUCT, Expanded, NodeSpec, PodSpec, mig_node

RESOURCE = "/apis/resource.k8s.io/v1"
#: the pod-level name of the one claim each pod of a DRA workload has
CLAIM = "gpu"
#: how long kube-controller-manager may take to make the claims of a run's pods
CLAIMS_TIMEOUT = 300.0
#: the annotation of the claim a scheduler makes for a pod's extended resources
EXTENDED_MARK = "resource.kubernetes.io/extended-resource-claim"

Objects = list[tuple[str, dict[str, Any]]]


def template_name(klass: str) -> str:
    return f"{klass}-claim"


def mig_selector(profile: str) -> str:
    """The CEL selector of MIG devices of one profile (an attribute the driver sets)."""
    return f"device.attributes['{gpudra.DRIVER}'].profile == '{profile}'"


def product_selector(product: str) -> str:
    """The CEL selector of the devices of one board (whole GPUs of the non-MIG nodes)."""
    return f"device.attributes['{gpudra.DRIVER}'].productName == '{product}'"


def templates(ex: Expanded, namespace: str) -> Objects:
    """One ResourceClaimTemplate per pod class that asks a claim: MIG devices of its
    profile, or whole GPUs of the boards of the nodes without MIG."""
    out: Objects = []
    for c in ex.workload.classes:
        if not c.device_class or c.extended:
            continue
        selectors = [mig_selector(c.mig_profile) if c.mig_profile else product_selector(GPU_PRODUCT)]
        body = gpudra.claim_template(template_name(c.name), c.device_class, c.gpus, selectors, request=CLAIM)
        out.append((f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", body))
    return out


def pod(spec: PodSpec, scheduler_name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The pod of ``spec``, its GPUs asked by a claim made from its class's template."""
    body = gpudra.pod_with_claims(spec.name, templates={CLAIM: template_name(spec.klass)},
                                  scheduler=scheduler_name, terminationGracePeriodSeconds=0)
    body["metadata"]["labels"] = labels
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": spec.cpu, "memory": spec.memory}
    return body


def cluster_objects(nodes: Iterable[tuple[str, str]], node: NodeSpec, *, extended: bool = False) -> Objects:
    """The driver's DeviceClasses (with ``extended``, ``gpu.nvidia.com`` naming
    ``nvidia.com/gpu``), then the ResourceSlices of each (name, uid) node, in name order
    (the ``mig_share`` of them partitionable)."""
    out: Objects = [(f"{RESOURCE}/deviceclasses", c) for c in gpudra.device_classes(extended_resource=extended)]
    for i, (name, uid) in enumerate(sorted(nodes)):
        mig = mig_node(i, node.mig_share)
        for s in gpudra.gpu_node_slices(name, gpus=node.gpus, mig="partitionable" if mig else "none", node_uid=uid,
                                        product=MIG_PRODUCT if mig else GPU_PRODUCT):
            out.append((f"{RESOURCE}/resourceslices", s))
    return out


async def publish(client: KubeClient, node: NodeSpec, *, extended: bool = False) -> int:
    """Create the DeviceClasses and every node's slices; returns how many slices."""
    from perf.live import create_all

    items, _ = await client.list("/api/v1/nodes", page=1000)
    objects = cluster_objects(((n["metadata"]["name"], n["metadata"]["uid"]) for n in items), node, extended=extended)
    await create_all(client, objects)
    return sum(1 for path, _ in objects if path.endswith("/resourceslices"))


async def wait_claims(client: KubeClient, namespace: str, pods: int, timeout: float = CLAIMS_TIMEOUT) -> float:
    """Seconds until ``pods`` pods of ``namespace`` have their claim made (named in their
    status); TimeoutError after ``timeout``."""
    t0 = time.monotonic()
    while True:
        items, _ = await client.list(f"/api/v1/namespaces/{namespace}/pods", page=1000)
        made = sum(
            1 for p in items
            if any(s.get("resourceClaimName") for s in (p.get("status") or {}).get("resourceClaimStatuses") or ())
        )
        if made >= pods:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"only {made} of {pods} pods had their ResourceClaim made after {timeout:.0f} s")
        await asyncio.sleep(1.0)


_MIG_NAME = re.compile(r"^(gpu-\d+)-mig-([a-z0-9-]+-\d+)-(\d+)$")
#: "<profile>-<GI profile id>" as in a MIG device's name -> memory slices (the same on both boards)
_MIG_SIZES = {f"{gpudra.rfc1123(p.name.replace('.', ''))}-{p.profile_id}": p.size
              for m in gpudra.MODELS.values() for p in m.profiles}


def held(device: str) -> tuple[str, set[int]]:
    """The GPU a device of the driver sits on and the memory slices it holds (a whole GPU:
    all eight)."""
    m = _MIG_NAME.match(device)
    if m is None:
        return device, set(range(8))
    start = int(m.group(3))
    return m.group(1), set(range(start, start + _MIG_SIZES.get(m.group(2), 8)))


def overlaps(claims: Iterable[dict[str, Any]]) -> list[str]:
    """Devices handed out twice among the allocated ``claims``: the same device, a GPU and
    a MIG device of it, or two MIG devices sharing a memory slice; as ``pool/device``."""
    taken: dict[tuple[str, str, str], set[int]] = {}
    twice: list[str] = []
    for claim in claims:
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or ():
            gpu, slices = held(str(r["device"]))
            key = (str(r["driver"]), str(r["pool"]), gpu)
            have = taken.setdefault(key, set())
            if have & slices:
                twice.append(f"{r['pool']}/{r['device']}")
            have |= slices
    return sorted(twice)


def _allocated_on(claim: dict[str, Any]) -> tuple[str, int] | None:
    """The node a claim's devices are on (their pool: the driver names each pool after its
    node) and how many devices; None while it is not allocated."""
    alloc = (claim.get("status") or {}).get("allocation")
    if not alloc:
        return None
    results = (alloc.get("devices") or {}).get("results") or ()
    pools = {str(r.get("pool")) for r in results}
    return (pools.pop() if len(pools) == 1 else ",".join(sorted(pools))), len(results)


def extended_faults(pods: Iterable[dict[str, Any]], claims: Iterable[dict[str, Any]],
                    asked: dict[str, int]) -> list[str]:
    """Why each bound pod named in ``asked`` (pod name -> GPUs it asks as ``nvidia.com/gpu``)
    is not served as it must be: exactly one allocated claim made for it (annotated
    :data:`EXTENDED_MARK`, owned by the pod's UID), its devices on the pod's node, as many
    as the pod asks. One line per pod at fault, in pod name order."""
    made: dict[str, list[dict[str, Any]]] = {}
    for c in claims:
        meta = c["metadata"]
        if (meta.get("annotations") or {}).get(EXTENDED_MARK) != "true":
            continue
        for ref in meta.get("ownerReferences") or ():
            if ref.get("kind") == "Pod":
                made.setdefault(str(ref["uid"]), []).append(c)
    faults: list[str] = []
    for p in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        name, node = str(p["metadata"]["name"]), (p.get("spec") or {}).get("nodeName")
        if name not in asked or not node:
            continue
        held = [a for a in map(_allocated_on, made.get(str(p["metadata"]["uid"]), ())) if a is not None]
        if len(held) != 1:
            faults.append(f"{name}: {len(held)} allocated claims made for it")
        elif held[0] != (node, asked[name]):
            faults.append(f"{name} on {node} asks {asked[name]} GPUs, its claim holds {held[0][1]} on {held[0][0]}")
    return faults


async def device_use(client: KubeClient, namespace: str, extended: dict[str, int] | None = None) -> dict[str, Any]:
    """The run's claims read back: how many, how many allocated, the devices handed out
    twice; with ``extended`` (pod name -> GPUs asked as ``nvidia.com/gpu``), the claims made
    for those pods and the bound ones not served by exactly one (:func:`extended_faults`)."""
    # the pods first: a scheduler still running at a timeout goes on binding, and a pod bound
    # when they were read had its claim allocated before its Binding, so the claims read after
    # hold it (read the other way round, a pod bound in between shows no claim)
    pods, _ = await client.list(f"/api/v1/namespaces/{namespace}/pods", page=1000) if extended else ([], None)
    items, _ = await client.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", page=1000)
    allocated = [c for c in items if (c.get("status") or {}).get("allocation")]
    twice = overlaps(allocated)
    out: dict[str, Any] = {"claims": len(items), "allocated": len(allocated), "devices_twice": len(twice),
                           "devices_twice_first": twice[:5]}
    if extended:
        faults = extended_faults(pods, items, extended)
        out["extended_claims"] = sum(
            1 for c in items if (c["metadata"].get("annotations") or {}).get(EXTENDED_MARK) == "true")
        out["extended_faults"] = len(faults)
        out["extended_faults_first"] = faults[:5]
    return out


# -- the ceiling's claim write ----------------------------------------------------------


def reserve_patch(claim: dict[str, Any], pod_name: str, pod_uid: str, node: str, device: str,
                  request: str = CLAIM) -> dict[str, Any]:
    """What a scheduler writes to a claim before the Binding (as :mod:`batchsched.kube.claims`
    does): ``device`` of ``node``'s pool allocated to ``request``, the claim reserved for the
    pod, under the claim's UID and resourceVersion."""
    meta = claim["metadata"]
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    allocation = {
        "devices": {"results": [{"request": request, "driver": gpudra.DRIVER, "pool": node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        "allocationTimestamp": stamp,
    }
    return {
        "metadata": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
        "status": {"allocation": allocation, "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]},
    }


def claims_by_pod(claims: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod UID -> its claim (kube-controller-manager makes the pod the claim's owner)."""
    out: dict[str, dict[str, Any]] = {}
    for c in claims:
        for ref in c["metadata"].get("ownerReferences") or ():
            if ref.get("kind") == "Pod":
                out[str(ref["uid"])] = c
    return out


#: the request of a one-container pod's extended-resource claim (upstream's naming: the
#: container's index, the resource's index among its requests)
EXTENDED_REQUEST = "container-0-request-0"


def extended_claim(pod_name: str, pod_uid: str, gpus: int) -> dict[str, Any]:
    """The claim a scheduler makes for a one-container pod asking ``gpus`` ``nvidia.com/gpu``
    (as :func:`batchsched.core.dra.extended.claim_body` makes it): owned by the pod, marked
    :data:`EXTENDED_MARK`, one request of that many ``gpu.nvidia.com`` devices."""
    return {
        "apiVersion": gpudra.API_VERSION, "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod_name}-extended-resources-",
            "annotations": {EXTENDED_MARK: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid,
                                 "controller": True}],
        },
        "spec": {"devices": {"requests": [{"name": EXTENDED_REQUEST, "exactly": {
            "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": gpus}}]}},
    }


def extended_status_patch(pod_uid: str, claim_name: str, container: str = "main") -> dict[str, Any]:
    """The pod's ``status.extendedResourceClaimStatus`` naming its claim (the scheduler's
    write between the claim's status and the Binding)."""
    return {"metadata": {"uid": pod_uid}, "status": {"extendedResourceClaimStatus": {
        "resourceClaimName": claim_name,
        "requestMappings": [{"containerName": container, "resourceName": "nvidia.com/gpu",
                             "requestName": EXTENDED_REQUEST}],
    }}}
