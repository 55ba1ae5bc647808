"""Pods asking ``nvidia.com/gpu`` are served by DRA devices on the real control plane, where
NVIDIA's driver classes map that resource (``extendedResourceName``) and the node's GPUs are
published by DRA rather than by a device plugin.

What a user checks, read from the apiserver: each such pod bound to a DRA node has a
ResourceClaim made for it (annotated as the claim of its extended resources, owned by the
pod), allocated on that node and reserved for it, and its ``status.extendedResourceClaimStatus``
names that claim and the request serving each container; pods bound to a device-plugin node
have none; no GPU is handed out twice; a gang is bound whole or gets nothing; a pod deleted
takes its claim with it and frees its GPUs.
"""

from __future__ import annotations

from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.sandbox import gpudra
from tests.integration.helpers import XK8S, create_group, events_for, running_scheduler, wait_for
from tests.integration.test_dra import node_uid, published

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

RESOURCE = "/apis/resource.k8s.io/v1"
#: the production lease timing (the tests' 3 s renew deadline is lost, at times, when this
#: file's first scheduler starts while the differential test's 532 nodes, slices and claims
#: are still being deleted: what that churn costs the event loop is issue 29's to measure)
LEASE = {"leaderElection": {"leaseDurationSeconds": 15, "renewDeadlineSeconds": 10, "retryPeriodSeconds": 2}}
GPU = "nvidia.com/gpu"
MARK = "resource.kubernetes.io/extended-resource-claim"


async def gpu_pod(kube: KubeClient, namespace: str, name: str, gpus: int, **labels: str) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"schedulerName": "batchsched", "containers": [
                {"name": "main", "image": "trainer:latest", "resources": {"requests": {"cpu": "100m", GPU: str(gpus)},
                                                                         "limits": {GPU: str(gpus)}}}]}}
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


async def claims_made(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    """The claims made for pods' extended resources, by the UID of the pod owning each."""
    items, _ = await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")
    out = {}
    for c in items:
        if (c["metadata"].get("annotations") or {}).get(MARK) == "true":
            [owner] = c["metadata"]["ownerReferences"]
            out[owner["uid"]] = c
    return out


async def bound(kube: KubeClient, namespace: str, names: list[str]) -> dict[str, tuple[str, list[str]]]:
    """Each bound pod's node and the GPUs its extended-resource claim got (checked whole)."""
    made = await claims_made(kube, namespace)
    out = {}
    for name in names:
        p = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        node = p["spec"].get("nodeName")
        if not node:
            continue
        claim = made.get(p["metadata"]["uid"])
        if claim is None:
            out[name] = (node, [])
            continue
        status = claim.get("status") or {}
        assert [r["uid"] for r in status.get("reservedFor") or []] == [p["metadata"]["uid"]], status
        alloc = status["allocation"]
        assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        mapped = (p.get("status") or {}).get("extendedResourceClaimStatus") or {}
        assert mapped.get("resourceClaimName") == claim["metadata"]["name"], mapped
        [request] = claim["spec"]["devices"]["requests"]
        assert mapped["requestMappings"] == [
            {"containerName": "main", "resourceName": GPU, "requestName": request["name"]}]
        assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
        out[name] = (node, [f"{r['pool']}/{r['device']}" for r in alloc["devices"]["results"]])
    return out


async def test_pods_asking_nvidia_gpu_get_dra_gpus_where_no_device_plugin_offers_them(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    [dra] = await make_nodes(1, gpus=0)
    [plugin] = await make_nodes(1, gpus=2)
    async with published(kube, gpudra.gpu_node_slices(dra, gpus=4, node_uid=await node_uid(kube, dra)),
                         extended_resource=True):
        names = [f"p{i}" for i in range(7)]  # 7 GPUs asked of 4 (DRA) + 2 (device plugin)
        for name in names:
            await gpu_pod(kube, namespace, name, 1)
        async with running_scheduler(sandbox, namespace, **LEASE):
            async def six() -> dict[str, tuple[str, list[str]]] | None:
                got = await bound(kube, namespace, names)
                return got if len(got) == 6 else None

            got = await wait_for(six, timeout=60)
            on_dra = {n: ds for n, (node, ds) in got.items() if node == dra}
            on_plugin = {n: ds for n, (node, ds) in got.items() if node == plugin}
            assert len(on_dra) == 4 and len(on_plugin) == 2, got
            assert all(ds == [] for ds in on_plugin.values()), "the device plugin serves them: no claim"
            devices = [d for ds in on_dra.values() for d in ds]
            assert len(devices) == len(set(devices)) == 4, got
            [waiting] = [n for n in names if n not in got]

            async def told() -> list[str] | None:
                said = [e["message"] for e in await events_for(kube, namespace, waiting, "FailedScheduling")]
                return said if any(f"insufficient {GPU}" in m for m in said) else None

            await wait_for(told, timeout=30)
            # a pod deleted takes its claim with it (the garbage collector: the pod owns it),
            # and its GPU serves the pod that waited
            gone = next(iter(on_dra))
            uid = (await kube.get(f"/api/v1/namespaces/{namespace}/pods/{gone}"))["metadata"]["uid"]
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{gone}", {"gracePeriodSeconds": 0})

            async def claim_gone() -> bool:
                return uid not in await claims_made(kube, namespace)

            await wait_for(claim_gone, timeout=60)
            now = await wait_for(lambda: _bound_one(kube, namespace, waiting), timeout=60)
            assert now[0] == dra and now[1] == on_dra[gone], (now, on_dra[gone])


async def _bound_one(kube: KubeClient, namespace: str, name: str) -> tuple[str, list[str]] | None:
    got = await bound(kube, namespace, [name])
    return got.get(name)


async def test_a_gang_asking_nvidia_gpu_on_dra_nodes_is_bound_whole_or_gets_nothing(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    nodes = await make_nodes(2, gpus=0)
    slices = [s for n in nodes for s in gpudra.gpu_node_slices(n, gpus=4, node_uid=await node_uid(kube, n))]
    async with published(kube, slices, extended_resource=True):
        await create_group(kube, XK8S, namespace, "trio", {"minMember": 3})
        await create_group(kube, XK8S, namespace, "pair", {"minMember": 2})
        for i in range(3):
            await gpu_pod(kube, namespace, f"trio-{i}", 2, **{"scheduling.x-k8s.io/pod-group": "trio"})
        async with running_scheduler(sandbox, namespace, **LEASE):
            trio = [f"trio-{i}" for i in range(3)]

            async def whole() -> dict[str, tuple[str, list[str]]] | None:
                got = await bound(kube, namespace, trio)
                return got if len(got) == 3 else None

            got = await wait_for(whole, timeout=60)
            devices = [d for _, ds in got.values() for d in ds]
            assert len(devices) == len(set(devices)) == 6, got
            # 2 GPUs left: a pair asking 2 each gets nothing, and no claim is made for it
            for i in range(2):
                await gpu_pod(kube, namespace, f"pair-{i}", 2, **{"scheduling.x-k8s.io/pod-group": "pair"})
            await wait_for(lambda: events_for(kube, namespace, "pair-0", "FailedScheduling"), timeout=30)
            assert await bound(kube, namespace, ["pair-0", "pair-1"]) == {}
            pair_uids = {(await kube.get(f"/api/v1/namespaces/{namespace}/pods/pair-{i}"))["metadata"]["uid"]
                         for i in range(2)}
            assert pair_uids.isdisjoint(await claims_made(kube, namespace))
