"""NVIDIA's GPUs through Dynamic Resource Allocation on the real control plane.

What the fixtures of :mod:`batchsched.sandbox.gpudra` are worth rests on three things the
sandbox's Kubernetes v1.37.2 does itself: its apiserver validates the ResourceSlices and
DeviceClasses (and refuses a malformed one), kube-controller-manager's resourceclaim
controller makes a pod's claim from its template, and kube-scheduler allocates a claim
from these slices. The last one prints the claim's status as kube-scheduler wrote it: the
shape batchsched's own claim writes are to match.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, InvalidError, NotFoundError
from batchsched.sandbox import gpudra
from tests.integration.helpers import running_kube_scheduler, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

RESOURCE = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE}/resourceslices"
CLASSES = f"{RESOURCE}/deviceclasses"


@contextlib.asynccontextmanager
async def created(kube: KubeClient, objects: list[tuple[str, dict[str, Any]]]) -> AsyncIterator[list[dict[str, Any]]]:
    """Cluster-scoped objects (collection, body) created for the block, as the apiserver
    stored them, deleted after it."""
    stored: list[tuple[str, dict[str, Any]]] = []
    try:
        for path, body in objects:
            try:
                made = await kube.create(path, body)
            except ConflictError:  # left by a test that failed before its cleanup: made anew
                await kube.delete(f"{path}/{body['metadata']['name']}")
                made = await wait_for(functools.partial(_create_when_gone, kube, path, body), timeout=30)
            stored.append((path, made))
        yield [obj for _, obj in stored]
    finally:
        for path, obj in reversed(stored):
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{path}/{obj['metadata']['name']}")


async def _create_when_gone(kube: KubeClient, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return await kube.create(path, body)
    except ConflictError:
        return None


async def node_uid(kube: KubeClient, name: str) -> str:
    return str((await kube.get(f"/api/v1/nodes/{name}"))["metadata"]["uid"])


async def test_apiserver_stores_the_drivers_slices_and_classes(kube: KubeClient, make_nodes: Any) -> None:
    """Every form the driver publishes is stored as written (quantities already in their
    canonical form, no field dropped); the DeviceClasses as the chart writes them."""
    nodes = await make_nodes(4)
    forms = {"none": nodes[0], "static": nodes[1], "partitionable": nodes[2]}
    bodies = [s for mig, node in forms.items()
              for s in gpudra.gpu_node_slices(node, mig=mig, node_uid=await node_uid(kube, node))]
    bodies += gpudra.shared_gpu_slices(nodes[3], gpus=2, node_uid=await node_uid(kube, nodes[3]))
    async with created(kube, [(SLICES, b) for b in bodies]) as slices, \
            created(kube, [(CLASSES, c) for c in gpudra.device_classes()]) as classes:
        assert [s["spec"] for s in slices] == [b["spec"] for b in bodies]
        assert [s["metadata"]["ownerReferences"] for s in slices] == [b["metadata"]["ownerReferences"] for b in bodies]
        assert [c["spec"] for c in classes] == [c["spec"] for c in gpudra.device_classes()]
        listed, _ = await kube.list(SLICES, fieldSelector=f"spec.nodeName={forms['partitionable']}")
        assert len(listed) == 9  # the counter sets, then one slice per GPU
        print(f"\nstored {len(slices)} ResourceSlices ({sum(len(s['spec'].get('devices', [])) for s in slices)} "
              f"devices) and {len(classes)} DeviceClasses")


@pytest.mark.parametrize(("what", "change", "field"), [
    # the driver removes the dots of a MIG profile from device names: a name is a DNS label
    ("a device name with a dot", lambda s: s["spec"]["devices"][0].update(name="gpu-0-mig-1g.5gb-19-0"),
     "spec.devices[0].name"),
    # the driver's combined form, for Kubernetes 1.34: counter sets beside devices in one slice
    ("counter sets beside devices", lambda s: s["spec"].update(
        sharedCounters=[{"name": "gpu-0-counter-set", "counters": {"memory": {"value": "40Gi"}}}]),
     "spec"),
    ("a capacity's request policy on a device not shared",
     lambda s: s["spec"]["devices"][0]["capacity"]["memory"].update(requestPolicy={"default": "1Gi"}),
     "requestPolicy"),
])
async def test_apiserver_refuses_a_malformed_slice(kube: KubeClient, what: str, change: Any, field: str) -> None:
    """Validation is the apiserver's: a slice the driver would never publish is refused,
    with the field named."""
    [body] = gpudra.gpu_node_slices("dra-refused", gpus=1, mig="static")
    change(body)
    with pytest.raises(InvalidError) as refused:
        await kube.create(SLICES, body)
    print(f"\n{what}: {refused.value.message}")
    assert field in refused.value.message


async def test_claim_made_from_the_pods_template(kube: KubeClient, namespace: str) -> None:
    """kube-controller-manager's resourceclaim controller makes the pod's claim from its
    template, owned by the pod, and names it in the pod's status."""
    ns = f"/api/v1/namespaces/{namespace}"
    template = gpudra.claim_template("one-gpu", "gpu.nvidia.com")
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", template)
    pod = await kube.create(f"{ns}/pods", gpudra.pod_with_claims("trainer", templates={"gpu": "one-gpu"},
                                                                 scheduler="nobody"))

    async def statuses() -> list[dict[str, Any]]:
        got = await kube.get(f"{ns}/pods/trainer")
        return list((got.get("status") or {}).get("resourceClaimStatuses") or [])

    [status] = await wait_for(statuses, timeout=30)
    assert status["name"] == "gpu"
    claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}")
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "trainer", pod["metadata"]["uid"])
    assert claim["spec"] == template["spec"]["spec"]
    assert "allocation" not in (claim.get("status") or {})
    print(f"\nclaim {status['resourceClaimName']} made for pod trainer")


@pytest.fixture(scope="module")
def kube_scheduler(sandbox: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The sandbox's kube-scheduler under a scheduler name of its own; yields that name."""
    with running_kube_scheduler(sandbox, tmp_path_factory.mktemp("kube-scheduler"), name="kube-scheduler-dra",
                                scheduler_name="dra-scheduler") as name:
        yield name


async def test_kube_scheduler_allocates_a_gpu_of_the_node(kube: KubeClient, namespace: str, make_nodes: Any,
                                                          kube_scheduler: str) -> None:
    """kube-scheduler allocates one ``gpu.nvidia.com`` device of the one node whose slices
    publish GPUs, reserves the claim for the pod and binds the pod there."""
    [node] = await make_nodes(1)
    slices = gpudra.gpu_node_slices(node, gpus=2, node_uid=await node_uid(kube, node))
    ns = f"/api/v1/namespaces/{namespace}"
    async with created(kube, [(SLICES, s) for s in slices]), \
            created(kube, [(CLASSES, c) for c in gpudra.device_classes(extended_resource=False)]):
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
                          gpudra.claim_template("one-a100", "gpu.nvidia.com", selectors=[
                              "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-40GB'"]))
        pod = await kube.create(f"{ns}/pods", gpudra.pod_with_claims(
            "trainer", templates={"gpu": "one-a100"}, scheduler=kube_scheduler))

        async def bound() -> dict[str, Any] | None:
            got = await kube.get(f"{ns}/pods/trainer")
            return got if got["spec"].get("nodeName") else None

        placed = await wait_for(bound, timeout=60)
        [status] = placed["status"]["resourceClaimStatuses"]
        claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}")
        print("\nclaim status written by kube-scheduler:\n" + json.dumps(claim["status"], indent=2))

    assert placed["spec"]["nodeName"] == node
    [result] = claim["status"]["allocation"]["devices"]["results"]
    published = {d["name"] for s in slices for d in s["spec"]["devices"]}
    assert (result["driver"], result["pool"], result["request"]) == (gpudra.DRIVER, node, "gpu")
    assert result["device"] in published
    [reserved] = claim["status"]["reservedFor"]
    assert (reserved["resource"], reserved["name"], reserved["uid"]) == ("pods", "trainer", pod["metadata"]["uid"])
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert [f["values"] for t in terms for f in t.get("matchFields", [])] == [[node]]


async def claims_of(kube: KubeClient, namespace: str, pods: list[str]) -> dict[str, dict[str, Any]]:
    """Each pod's one claim, by pod name."""
    out = {}
    for name in pods:
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        [status] = pod["status"]["resourceClaimStatuses"]
        out[name] = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}")
    return out


async def schedule(kube: KubeClient, namespace: str, scheduler: str, template: dict[str, Any],
                   count: int) -> tuple[list[str], list[str]]:
    """``count`` pods of one claim template each, created one after the other, each waited
    for until kube-scheduler bound it or said it cannot; returns (bound, not bound)."""
    ns = f"/api/v1/namespaces/{namespace}"
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", template)
    bound: list[str] = []
    unschedulable: list[str] = []
    for i in range(count):
        name = f"p{i}"
        await kube.create(f"{ns}/pods", gpudra.pod_with_claims(
            name, templates={"gpu": template["metadata"]["name"]}, scheduler=scheduler))

        async def decided(name: str = name) -> str:
            pod = await kube.get(f"{ns}/pods/{name}")
            if pod["spec"].get("nodeName"):
                return "bound"
            for c in pod["status"].get("conditions") or []:
                if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                    print(f"{name}: {c.get('message')}")
                    return "unschedulable"
            return ""

        (bound if await wait_for(decided, timeout=60) == "bound" else unschedulable).append(name)
    return bound, unschedulable


async def test_kube_scheduler_keeps_partitions_within_the_counters(
        kube: KubeClient, namespace: str, make_nodes: Any, kube_scheduler: str) -> None:
    """One A100 published as partitionable devices: kube-scheduler places two 3g.20gb
    devices on it, on their two placements, and refuses a third, which the memory-slice
    counters leave no room for."""
    [node] = await make_nodes(1)
    slices = gpudra.gpu_node_slices(node, gpus=1, mig="partitionable", node_uid=await node_uid(kube, node))
    template = gpudra.claim_template("half-a100", "mig.nvidia.com", selectors=[
        "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'"])
    async with created(kube, [(SLICES, s) for s in slices]), \
            created(kube, [(CLASSES, c) for c in gpudra.device_classes(extended_resource=False)]):
        print()
        bound, unschedulable = await schedule(kube, namespace, kube_scheduler, template, 3)
        claims = await claims_of(kube, namespace, bound)
    print("claim status written by kube-scheduler (partitionable MIG):\n"
          + json.dumps(claims[bound[0]]["status"], indent=2))
    assert (len(bound), len(unschedulable)) == (2, 1)
    devices = sorted(r["device"] for c in claims.values() for r in c["status"]["allocation"]["devices"]["results"])
    assert devices == ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"]


async def test_kube_scheduler_shares_a_gpu_by_capacity(
        kube: KubeClient, namespace: str, make_nodes: Any, kube_scheduler: str) -> None:
    """One 40 GiB GPU that allows several allocations: two claims of 16 GiB share it, each
    with the capacity it consumed (and a share ID) written in its result; a third does
    not fit."""
    [node] = await make_nodes(1)
    slices = gpudra.shared_gpu_slices(node, gpus=1, node_uid=await node_uid(kube, node))
    template = gpudra.claim_template("16g", "gpu.nvidia.com", capacity={"memory": "16Gi"})
    async with created(kube, [(SLICES, s) for s in slices]), \
            created(kube, [(CLASSES, c) for c in gpudra.device_classes(extended_resource=False)]):
        print()
        bound, unschedulable = await schedule(kube, namespace, kube_scheduler, template, 3)
        claims = await claims_of(kube, namespace, bound)
    print("claim status written by kube-scheduler (consumable capacity):\n"
          + json.dumps(claims[bound[0]]["status"], indent=2))
    assert (len(bound), len(unschedulable)) == (2, 1)
    results = [r for c in claims.values() for r in c["status"]["allocation"]["devices"]["results"]]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-0"]
    # a capacity the claim did not ask for is consumed at its policy's default
    assert [r["consumedCapacity"] for r in results] == [{"memory": "16Gi", "multiprocessors": "1"}] * 2
    assert len({r["shareID"] for r in results}) == 2
