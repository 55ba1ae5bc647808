"""batchsched allocates DRA ResourceClaims on the real control plane, with GPUs published as
NVIDIA's DRA driver publishes them (:mod:`batchsched.sandbox.gpudra`).

What a user checks, read from the apiserver: each pod's claim (made from its template by
kube-controller-manager) is allocated on the node the pod is bound to and reserved for
it; no device is handed out twice, and a GPU held whole leaves none of its MIG partitions
free; a gang's pods are bound whole, their claims all allocated or none; a restarted
batchsched reads device use back from the claims.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from batchsched.sandbox import gpudra
from batchsched.sandbox.nodes import SANDBOX_LABEL
from tests.integration.helpers import (
    XK8S,
    create_group,
    events_for,
    queues,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

RESOURCE = "/apis/resource.k8s.io/v1"


@contextlib.asynccontextmanager
async def published(kube: KubeClient, slices: list[dict[str, Any]], *,
                    extended_resource: bool = False) -> AsyncIterator[None]:
    """ResourceSlices and the driver's DeviceClasses (``extended_resource``: with
    ``gpu.nvidia.com`` naming ``nvidia.com/gpu``), there for the block (and deleted after
    it: other tests make the classes as they need them)."""
    made: list[str] = []
    try:
        for c in gpudra.device_classes(extended_resource=extended_resource):
            await kube.create(f"{RESOURCE}/deviceclasses", c)
            made.append(f"{RESOURCE}/deviceclasses/{c['metadata']['name']}")
        for s in slices:
            stored = await kube.create(f"{RESOURCE}/resourceslices", s)
            made.append(f"{RESOURCE}/resourceslices/{stored['metadata']['name']}")
        yield
    finally:
        for path in reversed(made):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)


async def node_uid(kube: KubeClient, name: str) -> str:
    return str((await kube.get(f"/api/v1/nodes/{name}"))["metadata"]["uid"])


async def template(kube: KubeClient, namespace: str, name: str, class_name: str, count: int = 1) -> None:
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
                      gpudra.claim_template(name, class_name, count))


async def pod(kube: KubeClient, namespace: str, name: str, tmpl: str, **labels: str) -> None:
    body = gpudra.pod_with_claims(name, templates={"gpu": tmpl})
    if labels:
        body["metadata"]["labels"] = labels
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


async def claim_of(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The claim made for pod ``name`` (None until its status names it)."""
    p = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    made = {s["name"]: s.get("resourceClaimName") for s in (p.get("status") or {}).get("resourceClaimStatuses") or []}
    if not made.get("gpu"):
        return None
    return await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{made['gpu']}")


async def placed(kube: KubeClient, namespace: str, names: list[str], *,
                 shared: str = "") -> dict[str, tuple[str, list[str]]] | None:
    """Each pod's node and the devices its claim got (``shared``: the claim they all name),
    once every one is bound."""
    out = {}
    for name in names:
        p = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        node = p["spec"].get("nodeName")
        claim = (await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{shared}") if shared
                 else await claim_of(kube, namespace, name))
        if not node or claim is None:
            return None
        alloc = (claim.get("status") or {}).get("allocation") or {}
        reserved = [r["uid"] for r in (claim.get("status") or {}).get("reservedFor") or []]
        if shared:
            assert p["metadata"]["uid"] in reserved, claim.get("status")
        else:
            assert reserved == [p["metadata"]["uid"]], claim.get("status")
        assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        out[name] = (node, [f"{r['pool']}/{r['device']}" for r in alloc["devices"]["results"]])
    return out


async def test_pods_get_their_claims_devices_on_their_nodes_and_none_twice(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    nodes = await make_nodes(2, gpus=0)
    slices = [s for n in nodes for s in gpudra.gpu_node_slices(n, gpus=4, node_uid=await node_uid(kube, n))]
    async with published(kube, slices):
        await template(kube, namespace, "two-gpus", "gpu.nvidia.com", 2)
        names = [f"p{i}" for i in range(5)]  # 10 GPUs asked of 8
        for name in names:
            await pod(kube, namespace, name, "two-gpus")
        async with running_scheduler(sandbox, namespace):
            async def four() -> dict[str, tuple[str, list[str]]] | None:
                got = {}
                for name in names:
                    one = await placed(kube, namespace, [name])
                    if one:
                        got.update(one)
                return got if len(got) == 4 else None

            got = await wait_for(four, timeout=60)
            devices = [d for _, ds in got.values() for d in ds]
            assert len(devices) == len(set(devices)) == 8, got
            for node, ds in got.values():
                assert all(d.startswith(f"{node}/") for d in ds), got  # the pool is named after its node
            [waiting] = [n for n in names if n not in got]
            # told why: its claim not made yet (a moment, before kube-controller-manager makes
            # it), then no GPU left for it
            async def told() -> list[str] | None:
                said = [e["message"] for e in await events_for(kube, namespace, waiting, "FailedScheduling")]
                return said if any("insufficient deviceclass.resource.kubernetes.io/gpu.nvidia.com" in m for m in said) else None

            said = await wait_for(told, timeout=30)
            # (or, for a moment, its claim named in its status before the claim reached our watch)
            assert all("insufficient deviceclass" in m or "to be made from ResourceClaimTemplate two-gpus" in m
                       or ("ResourceClaim" in m and "does not exist yet" in m) for m in said), said
            claim = await claim_of(kube, namespace, waiting)
            assert claim is not None and not (claim.get("status") or {}).get("allocation")


async def test_a_gang_with_claims_is_bound_whole_and_a_gpu_held_whole_leaves_no_partition(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    [node] = await make_nodes(1, gpus=0)
    slices = gpudra.gpu_node_slices(node, gpus=2, mig="partitionable", node_uid=await node_uid(kube, node))
    async with published(kube, slices):
        await template(kube, namespace, "whole", "gpu.nvidia.com", 1)
        await template(kube, namespace, "slice", "mig.nvidia.com", 1)
        await create_group(kube, XK8S, namespace, "pair", {"minMember": 2})
        await create_group(kube, XK8S, namespace, "trio", {"minMember": 3})
        for i in range(2):
            await pod(kube, namespace, f"pair-{i}", "whole", **{"scheduling.x-k8s.io/pod-group": "pair"})
        async with running_scheduler(sandbox, namespace):
            got = await wait_for(lambda: placed(kube, namespace, ["pair-0", "pair-1"]), timeout=60)
            assert len({d for _, ds in got.values() for d in ds}) == 2
            # both GPUs are held whole: a gang of three whole GPUs and a MIG slice both wait
            for i in range(3):
                await pod(kube, namespace, f"trio-{i}", "whole", **{"scheduling.x-k8s.io/pod-group": "trio"})
            await pod(kube, namespace, "mig-0", "slice")
            await wait_for(lambda: events_for(kube, namespace, "mig-0", "FailedScheduling"), timeout=30)
            await wait_for(lambda: events_for(kube, namespace, "trio-0", "FailedScheduling"), timeout=30)
            for name in ("trio-0", "trio-1", "trio-2", "mig-0"):
                p = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
                assert not p["spec"].get("nodeName"), name
                claim = await claim_of(kube, namespace, name)
                assert claim is None or not (claim.get("status") or {}).get("allocation"), name
            # one GPU freed: the MIG slice goes on it, the gang of three still waits
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/pair-1", {"gracePeriodSeconds": 0})
            got = await wait_for(lambda: placed(kube, namespace, ["mig-0"]), timeout=60)
            [(_, [device])] = got.values()
            held = (await placed(kube, namespace, ["pair-0"]) or {})["pair-0"][1][0].split("/")[1]
            assert not device.split("/")[1].startswith(f"{held}-"), (device, held)  # not a slice of the held GPU


async def test_a_restarted_batchsched_reads_device_use_back_from_the_claims(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    [node] = await make_nodes(1, gpus=0)
    async with published(kube, gpudra.gpu_node_slices(node, gpus=2, node_uid=await node_uid(kube, node))):
        await template(kube, namespace, "one", "gpu.nvidia.com", 1)
        await pod(kube, namespace, "first", "one")
        async with running_scheduler(sandbox, namespace):
            first = await wait_for(lambda: placed(kube, namespace, ["first"]), timeout=60)
        await pod(kube, namespace, "second", "one")
        await pod(kube, namespace, "third", "one")
        async with running_scheduler(sandbox, namespace):
            async def one_more() -> dict[str, Any] | None:
                got = {}
                for name in ("second", "third"):
                    got.update(await placed(kube, namespace, [name]) or {})
                return got or None

            more = await wait_for(one_more, timeout=60)
            await wait_for(lambda: events_for(kube, namespace, "third" if "second" in more else "second",
                                              "FailedScheduling"), timeout=30)
            assert len(more) == 1
            [(_, [again])] = more.values()
            assert again != first["first"][1][0]


async def test_an_urgent_pod_preempts_the_pod_holding_its_gpus_and_gets_them(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    """Kubernetes itself has no preemption for DRA devices: batchsched evicts the pod whose
    claim holds them; kube-controller-manager then deallocates that claim, and the urgent
    pod's claim gets the same GPUs."""
    [node] = await make_nodes(1, gpus=0)
    async with published(kube, gpudra.gpu_node_slices(node, gpus=2, node_uid=await node_uid(kube, node))):
        await template(kube, namespace, "both", "gpu.nvidia.com", 2)
        low = gpudra.pod_with_claims("low", templates={"gpu": "both"}, priorityClassName="low-priority")
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", low)
        async with running_scheduler(sandbox, namespace):
            held = await wait_for(lambda: placed(kube, namespace, ["low"]), timeout=60)
            urgent = gpudra.pod_with_claims("urgent", templates={"gpu": "both"}, priorityClassName="high-priority")
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", urgent)
            got = await wait_for(lambda: placed(kube, namespace, ["urgent"]), timeout=90)
            assert sorted(got["urgent"][1]) == sorted(held["low"][1])
            assert await events_for(kube, namespace, "low", "Preempted")


async def test_pods_sharing_one_claim_and_pods_sharing_one_gpu_by_capacity(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    """Three pods naming one ResourceClaim share its device, all on its node; on a GPU shared
    by capacity (40Gi of memory), two claims of 16Gi fit and a third waits."""
    plain, shared = await make_nodes(2, gpus=0)
    slices = [*gpudra.gpu_node_slices(plain, gpus=2, node_uid=await node_uid(kube, plain)),
              *gpudra.shared_gpu_slices(shared, gpus=1, node_uid=await node_uid(kube, shared))]
    async with published(kube, slices):
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                          gpudra.resource_claim("team-gpu", "gpu.nvidia.com",
                                                selectors=["device.attributes['gpu.nvidia.com'].type == 'gpu' && "
                                                           "!device.allowMultipleAllocations"]))
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
                          gpudra.claim_template("16g", "gpu.nvidia.com", capacity={"memory": "16Gi"},
                                                selectors=["device.allowMultipleAllocations"]))
        for i in range(3):
            await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                              gpudra.pod_with_claims(f"team-{i}", claims={"gpu": "team-gpu"}))
        for i in range(3):
            await pod(kube, namespace, f"slice-{i}", "16g")
        async with running_scheduler(sandbox, namespace):
            team = await wait_for(lambda: placed(kube, namespace, [f"team-{i}" for i in range(3)], shared="team-gpu"),
                                  timeout=60)
            assert {node for node, _ in team.values()} == {plain}
            assert len({d for _, ds in team.values() for d in ds}) == 1
            claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/team-gpu")
            assert len(claim["status"]["reservedFor"]) == 3

            async def two_slices() -> dict[str, Any] | None:
                got = {}
                for i in range(3):
                    got.update(await placed(kube, namespace, [f"slice-{i}"]) or {})
                return got if len(got) == 2 else None

            got = await wait_for(two_slices, timeout=60)
            assert {node for node, _ in got.values()} == {shared}
            [waiting] = [f"slice-{i}" for i in range(3) if f"slice-{i}" not in got]
            await wait_for(lambda: events_for(kube, namespace, waiting, "FailedScheduling"), timeout=30)
            for name in got:
                claim = await claim_of(kube, namespace, name)
                assert claim is not None
                [result] = claim["status"]["allocation"]["devices"]["results"]
                assert result["consumedCapacity"]["memory"] == "16Gi" and result["shareID"]


async def test_a_gang_preempts_dra_work_whole_and_a_queue_quota_over_a_class_holds(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    """Two low-priority pods hold the GPUs of two nodes; an urgent gang of two takes both
    nodes (both victims evicted, then both members bound). Meanwhile a queue whose quota is
    one GPU of the class runs one 1-GPU pod on a node of two, and keeps the next waiting,
    told why."""
    pool, spare = f"{namespace}-g", f"{namespace}-t"
    nodes = [*await make_nodes(2, gpus=0, prefix=pool), *await make_nodes(1, gpus=0, prefix=spare)]
    slices = [s for n in nodes for s in gpudra.gpu_node_slices(n, gpus=2, node_uid=await node_uid(kube, n))]
    column = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
    quota = f"q-{namespace}"
    async with published(kube, slices), queues(kube, (quota, {"resources": [{"name": column, "nominal": 1}]})):
        await template(kube, namespace, "two", "gpu.nvidia.com", 2)
        await template(kube, namespace, "one", "gpu.nvidia.com", 1)
        for i in range(2):
            low = gpudra.pod_with_claims(f"low-{i}", templates={"gpu": "two"}, priorityClassName="low-priority",
                                         nodeSelector={SANDBOX_LABEL: pool})
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", low)
        async with running_scheduler(sandbox, namespace):
            lows = await wait_for(lambda: placed(kube, namespace, ["low-0", "low-1"]), timeout=60)
            await create_group(kube, XK8S, namespace, "urgent", {"minMember": 2})
            for i in range(2):
                body = gpudra.pod_with_claims(f"urgent-{i}", templates={"gpu": "two"}, priorityClassName="high-priority",
                                              nodeSelector={SANDBOX_LABEL: pool})
                body["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "urgent"}
                await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
            for i in range(2):
                body = gpudra.pod_with_claims(f"team-{i}", templates={"gpu": "one"}, nodeSelector={SANDBOX_LABEL: spare})
                body["metadata"]["labels"] = {"batchsched.io/queue": quota}
                await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
            urgent = await wait_for(lambda: placed(kube, namespace, ["urgent-0", "urgent-1"]), timeout=120)
            assert {n for n, _ in urgent.values()} == {n for n, _ in lows.values()}
            for i in range(2):
                assert await events_for(kube, namespace, f"low-{i}", "Preempted")

            async def one_team() -> dict[str, Any] | None:
                got = {}
                for i in range(2):
                    got.update(await placed(kube, namespace, [f"team-{i}"]) or {})
                return got or None

            team = await wait_for(one_team, timeout=60)
            assert len(team) == 1, team
            [waiting] = [f"team-{i}" for i in range(2) if f"team-{i}" not in team]

            async def told_quota() -> bool:
                return any(f"queue {quota}" in e["message"]
                           for e in await events_for(kube, namespace, waiting, "FailedScheduling"))

            await wait_for(told_quota, timeout=30)
