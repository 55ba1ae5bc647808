"""DRA pods among batchsched's other policies, on the real control plane.

GPUs published by DRA (:mod:`batchsched.sandbox.gpudra`) beside device-plugin GPUs
(``nvidia.com/gpu``, ``elasticgpu.io`` card shares): each kind of pod lands only where it
can, nothing is booked twice, and each pod left waiting is told what it lacks. Two queues
asking DRA GPUs share them by their weights, as two asking ``nvidia.com/gpu`` do; a stopped
queue's DRA pods are not placed and their claims stay unallocated until it runs again; and
a pod whose claim a node's devices refuse does not keep another queue's pod from a GPU it
can use.

What is checked is what a user reads: ``spec.nodeName``, the PodScheduled condition,
FailedScheduling Events, a claim's ``status.allocation``, ``batchsched explain``. Every
DRA pod's claim is made from a template by kube-controller-manager; batchsched is started
once every claim exists, so it sees each test's pods together. Queues are cluster-scoped:
each test names its own after its namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.sandbox import gpudra
from tests.integration.helpers import (
    QUEUES,
    create_pods,
    events_for,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)
from tests.integration.test_dra import RESOURCE, claim_of, node_uid, published, template
from tests.integration.test_explain import explained

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"
CORE = "elasticgpu.io/gpu-core"
MEMORY = "elasticgpu.io/gpu-memory"
COLUMN = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
#: every node a test makes carries this label, valued with the test's namespace; its pods select it
POOL = "dra-policies"
MakeNodes = Callable[..., Awaitable[list[str]]]


def dra_pod(namespace: str, name: str, tmpl: str, queue: str = "") -> dict[str, Any]:
    body = gpudra.pod_with_claims(name, templates={"gpu": tmpl}, nodeSelector={POOL: namespace})
    if queue:
        body["metadata"]["labels"] = {"batchsched.io/queue": queue}
    return body


def plugin_pod(namespace: str, name: str, **asks: str) -> dict[str, Any]:
    """A pod asking device-plugin resources (limits = requests, as the apiserver wants)."""
    body = pod_body(name, spec={"nodeSelector": {POOL: namespace}})
    res = body["spec"]["containers"][0]["resources"]
    res["requests"].update(asks)
    res["limits"] = dict(asks)
    return body


async def claims_made(kube: KubeClient, namespace: str, names: list[str]) -> None:
    """Wait until kube-controller-manager made every named pod's claim."""
    async def made() -> bool:
        for name in names:
            claim = await claim_of(kube, namespace, name)
            if claim is None:
                return False
        return True

    await wait_for(made, timeout=60)


async def pods(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
    return {p["metadata"]["name"]: p for p in items}


def unschedulable(pod: dict[str, Any]) -> str:
    """The message of the pod's PodScheduled=False condition ("" when it has none)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or "")
    return ""


async def allocation(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    claim = await claim_of(kube, namespace, name)
    assert claim is not None, name
    return dict((claim.get("status") or {}).get("allocation") or {})


async def test_dra_and_card_pods_land_on_their_own_kind_of_node_and_each_waiting_pod_is_told_why(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: MakeNodes,
) -> None:
    """One node publishes 2 GPUs by DRA, one 2 ``nvidia.com/gpu``, one two elasticgpu.io
    cards; three pods of each whole kind and five half-card shares ask for them."""
    pool = {"labels": {POOL: namespace}}
    [dra] = await make_nodes(1, gpus=0, prefix=f"{namespace}-d", **pool)
    [whole] = await make_nodes(1, gpus=2, prefix=f"{namespace}-w", **pool)
    [cards] = await make_nodes(1, gpus=0, prefix=f"{namespace}-c", extended={CORE: "200", MEMORY: "32768"}, **pool)
    async with published(kube, gpudra.gpu_node_slices(dra, gpus=2, node_uid=await node_uid(kube, dra))):
        await template(kube, namespace, "one", "gpu.nvidia.com", 1)
        kinds = {"dra": dra, "whole": whole, "share": cards}
        bodies = [dra_pod(namespace, f"dra-{i}", "one") for i in range(3)]
        bodies += [plugin_pod(namespace, f"whole-{i}", **{GPU: "1"}) for i in range(3)]
        bodies += [plugin_pod(namespace, f"share-{i}", **{CORE: "50"}) for i in range(5)]
        await create_pods(kube, namespace, bodies)
        await claims_made(kube, namespace, [f"dra-{i}" for i in range(3)])
        async with running_scheduler(sandbox, namespace):
            async def settled() -> dict[str, dict[str, Any]] | None:
                got = await pods(kube, namespace)
                decided = all(p["spec"].get("nodeName") or unschedulable(p) for p in got.values())
                return got if decided and sum(1 for p in got.values() if p["spec"].get("nodeName")) == 8 else None

            got = await wait_for(settled, timeout=60)
            placed = {n: p["spec"]["nodeName"] for n, p in got.items() if p["spec"].get("nodeName")}
            waiting = {n.split("-")[0]: n for n in got if n not in placed}
            assert sorted(placed) == sorted(n for n in got if n not in waiting.values())
            assert set(waiting) == {"dra", "whole", "share"}, placed
            assert all(node == kinds[n.split("-")[0]] for n, node in placed.items()), placed
            # the DRA pods' claims hold the two GPUs, one each, on the DRA node; the third's none
            devices = []
            for name in (n for n in placed if n.startswith("dra-")):
                alloc = await allocation(kube, namespace, name)
                assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [dra]
                devices += [r["device"] for r in alloc["devices"]["results"]]
            assert sorted(devices) == ["gpu-0", "gpu-1"]
            assert not await allocation(kube, namespace, waiting["dra"])
            # the half-card shares, as the node agent reads them: no card past 100 %
            load: dict[str, int] = {}
            for name in (n for n in placed if n.startswith("share-")):
                card = got[name]["metadata"]["annotations"]["elasticgpu.io/container-main"]
                load[card] = load.get(card, 0) + 50
            assert load == {"0": 100, "1": 100}, load
            # each waiting pod is told what it lacks, in its condition and an Event
            lacks = {"dra": f"insufficient {COLUMN}", "whole": f"insufficient {GPU}", "share": f"insufficient {CORE}"}
            for kind, name in waiting.items():
                told = unschedulable(got[name])
                assert lacks[kind] in told, (name, told)
                assert all(other not in told for k, other in lacks.items() if k != kind), (name, told)
                said = [e["message"] for e in await events_for(kube, namespace, name, "FailedScheduling")]
                assert any(lacks[kind] in m for m in said), (name, said)
            assert "2 node(s) had no devices its ResourceClaims can be allocated" in unschedulable(got[waiting["dra"]])
            out = (await explained(sandbox, namespace, "pod", waiting["dra"]))["job"]
            assert out["devices"] == {"gpu.nvidia.com": 1} and lacks["dra"] in out["message"], out
            out = (await explained(sandbox, namespace, "pod", waiting["whole"]))["job"]
            assert not out["devices"] and out["gpus"] == 1 and lacks["whole"] in out["message"], out


@pytest.mark.parametrize("kind", ["dra", GPU])
async def test_two_queues_share_dra_gpus_by_their_weights_as_they_share_device_plugin_gpus(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: MakeNodes, kind: str,
) -> None:
    """Six GPUs on three nodes, by DRA (or as ``nvidia.com/gpu``); queues ``a`` (weight 1)
    and ``b`` (weight 2) of one GPU each, and an idle lender of four, under one root. Both
    ask six: a holds 2, b 4, either way."""
    dra = kind == "dra"
    nodes = await make_nodes(3, gpus=0 if dra else 2, prefix=f"{namespace}-d", labels={POOL: namespace})
    slices = [s for n in nodes for s in gpudra.gpu_node_slices(n, gpus=2, node_uid=await node_uid(kube, n))] if dra else []
    root, a, b, lender = (f"{q}-{namespace}" for q in ("org", "a", "b", "lender"))

    def spec(nominal: int, weight: float = 1.0) -> dict[str, Any]:
        return {"parent": root, "weight": weight, "resources": [{"name": COLUMN if dra else GPU, "nominal": nominal}]}

    def body(name: str) -> dict[str, Any]:
        queue = a if name[0] == "a" else b
        if dra:
            return dra_pod(namespace, name, "one", queue)
        out = plugin_pod(namespace, name, **{GPU: "1"})
        out["metadata"]["labels"] = {"batchsched.io/queue": queue}
        return out

    async with published(kube, slices), queues(kube, (root, {}), (a, spec(1)), (b, spec(1, 2)), (lender, spec(4))):
        await template(kube, namespace, "one", "gpu.nvidia.com", 1)
        names = [f"{q}-{i}" for i in range(6) for q in ("a", "b")]
        await create_pods(kube, namespace, [body(n) for n in names])
        if dra:
            await claims_made(kube, namespace, names)
        async with running_scheduler(sandbox, namespace):
            async def six() -> dict[str, dict[str, Any]] | None:
                got = await pods(kube, namespace)
                return got if sum(1 for p in got.values() if p["spec"].get("nodeName")) == 6 else None

            await wait_for(six, timeout=60)
            await asyncio.sleep(2)  # a seventh bound late would show now
            got = await pods(kube, namespace)
            held = {q: sorted(n for n, p in got.items() if n[0] == q and p["spec"].get("nodeName")) for q in "ab"}
            print(f"\n{kind}: a holds {len(held['a'])}, b {len(held['b'])} of 6 GPUs")
            assert (len(held["a"]), len(held["b"])) == (2, 4), held
            for name in (n for n in names if not got[n]["spec"].get("nodeName")):
                assert unschedulable(got[name]), name  # told why it waits
            if not dra:
                return
            devices = []
            for name in names:
                alloc = await allocation(kube, namespace, name)
                assert bool(alloc) == bool(got[name]["spec"].get("nodeName")), (name, alloc)
                if alloc:
                    devices += [(r["pool"], r["device"]) for r in alloc["devices"]["results"]]
            assert len(devices) == len(set(devices)) == 6


async def test_a_stopped_queues_dra_pods_wait_with_their_claims_unallocated_until_it_runs_again(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: MakeNodes,
) -> None:
    [node] = await make_nodes(1, gpus=0, prefix=f"{namespace}-d", labels={POOL: namespace})
    team = f"team-{namespace}"
    stopped = {"stopPolicy": "Hold", "resources": [{"name": COLUMN, "nominal": 4}]}
    async with published(kube, gpudra.gpu_node_slices(node, gpus=2, node_uid=await node_uid(kube, node))), \
            queues(kube, (team, stopped)):
        await template(kube, namespace, "one", "gpu.nvidia.com", 1)
        names = ["w-0", "w-1"]
        await create_pods(kube, namespace, [dra_pod(namespace, n, "one", team) for n in names])
        await claims_made(kube, namespace, names)
        async with running_scheduler(sandbox, namespace):
            async def told() -> dict[str, dict[str, Any]] | None:
                got = await pods(kube, namespace)
                return got if all(unschedulable(got[n]) for n in names) else None

            got = await wait_for(told, timeout=30)
            await asyncio.sleep(2)  # a cycle or more later: still nothing placed
            got = await pods(kube, namespace)
            for name in names:
                assert not got[name]["spec"].get("nodeName"), name
                assert unschedulable(got[name]) == (f"queue {team} is stopped (stopPolicy Hold): it admits no new "
                                                    "work until its stopPolicy is None"), unschedulable(got[name])
                assert not await allocation(kube, namespace, name)
            await kube.patch(f"{QUEUES}/{team}", {"spec": {"stopPolicy": None}})

            async def placed() -> dict[str, dict[str, Any]] | None:
                got = await pods(kube, namespace)
                return got if all(got[n]["spec"].get("nodeName") for n in names) else None

            got = await wait_for(placed, timeout=30)
            devices = []
            for name in names:
                alloc = await allocation(kube, namespace, name)
                assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
                devices += [r["device"] for r in alloc["devices"]["results"]]
            assert sorted(devices) == ["gpu-0", "gpu-1"]


async def test_a_pod_refused_its_devices_does_not_keep_another_queues_pods_waiting(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: MakeNodes,
) -> None:
    """A node of four GPUs; one of them, chosen by its UUID, is held by a running pod.
    Queue a's pod asks that very GPU (its claim is refused there: the class column counts
    three free), queue b's three pods ask any GPU, created a moment later (so a's pod
    comes first in the fair order). b's three are bound at once, none told to wait for a
    reservation of a's pod, which waits told why, its claim unallocated."""
    [node] = await make_nodes(1, gpus=0, prefix=f"{namespace}-d", labels={POOL: namespace})
    slices = gpudra.gpu_node_slices(node, gpus=4, node_uid=await node_uid(kube, node))
    uuid = next(d["attributes"]["uuid"]["string"] for d in slices[0]["spec"]["devices"] if d["name"] == "gpu-0")
    a, b = f"a-{namespace}", f"b-{namespace}"
    quota = {"resources": [{"name": COLUMN, "nominal": 4}]}
    async with published(kube, slices), queues(kube, (a, quota), (b, quota)):
        await template(kube, namespace, "one", "gpu.nvidia.com", 1)
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", gpudra.claim_template(
            "that-gpu", "gpu.nvidia.com", 1, [f"device.attributes['gpu.nvidia.com'].uuid == '{uuid}'"]))
        await create_pods(kube, namespace, [dra_pod(namespace, "hold", "that-gpu")])
        await claims_made(kube, namespace, ["hold"])
        async with running_scheduler(sandbox, namespace):
            await wait_for(lambda: allocation(kube, namespace, "hold"), timeout=30)
        await create_pods(kube, namespace, [dra_pod(namespace, "a-big", "that-gpu", a)])
        await asyncio.sleep(1.1)  # creation times are in seconds
        names = [f"b-{i}" for i in range(3)]
        await create_pods(kube, namespace, [dra_pod(namespace, n, "one", b) for n in names])
        await claims_made(kube, namespace, ["a-big", *names])
        async with running_scheduler(sandbox, namespace):
            async def decided() -> dict[str, dict[str, Any]] | None:
                got = await pods(kube, namespace)
                done = all(got[n]["spec"].get("nodeName") for n in names) and unschedulable(got["a-big"])
                return got if done else None

            got = await wait_for(decided, timeout=60)
            for name in names:
                said = [e["message"] for e in await events_for(kube, namespace, name, "FailedScheduling")]
                assert said == [], (name, said)
            # refused on the node first; once b's pods hold the other GPUs, short of GPUs there
            told = unschedulable(got["a-big"])
            assert "cannot be allocated on node" in told or f"insufficient {COLUMN}" in told, told
            assert not await allocation(kube, namespace, "a-big")
