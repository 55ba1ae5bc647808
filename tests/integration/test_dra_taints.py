"""DeviceTaintRules on the real control plane, with GPUs published as NVIDIA's DRA driver
publishes them (:mod:`batchsched.sandbox.gpudra`).

What a user checks, read from the apiserver: a GPU a rule taints ``NoSchedule`` goes to no
new claim (the pod gets the other GPU, or waits told why); a claim whose request tolerates
the taint may get it. A GPU a rule taints ``NoExecute`` under a running gang member: kube-
controller-manager's device-taint-eviction-controller deletes that member, and batchsched
restarts the gang whole (its other member evicted at once, the PodGroup told why); the gang
submitted again waits whole while only one GPU is untainted, and runs whole once the rule
is deleted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from batchsched.sandbox import gpudra
from tests.integration.helpers import (
    XK8S,
    events_for,
    list_pods,
    running_scheduler,
    wait_for,
)
from tests.integration.test_dra import RESOURCE, claim_of, node_uid, placed, pod, published

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

RULES = f"{RESOURCE}/devicetaintrules"
TAINT_KEY = "example.com/unhealthy"


def taint_rule(name: str, pool: str, device: str, effect: str) -> dict[str, Any]:
    """A rule tainting one GPU of the driver's pool ``pool`` (pools are named after nodes)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": gpudra.DRIVER, "pool": pool, "device": device},
                     "taint": {"key": TAINT_KEY, "value": "xid-79", "effect": effect}}}


@contextlib.asynccontextmanager
async def ruled(kube: KubeClient, body: dict[str, Any]) -> AsyncIterator[str]:
    """The rule, there for the block (rules are cluster-wide: deleted after it)."""
    await kube.create(RULES, body)
    path = f"{RULES}/{body['metadata']['name']}"
    try:
        yield path
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(path)


async def tolerant_template(kube: KubeClient, namespace: str, name: str) -> None:
    body = gpudra.claim_template(name, "gpu.nvidia.com", 1)
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", body)


async def test_a_gpu_tainted_no_schedule_goes_only_to_a_claim_that_tolerates_it(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    [node] = await make_nodes(1, gpus=0)
    slices = gpudra.gpu_node_slices(node, gpus=2, node_uid=await node_uid(kube, node))
    async with published(kube, slices), ruled(kube, taint_rule(f"{namespace}-drain", node, "gpu-0", "NoSchedule")):
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
                          gpudra.claim_template("one", "gpu.nvidia.com", 1))
        await tolerant_template(kube, namespace, "tolerant")
        async with running_scheduler(sandbox, namespace):
            await pod(kube, namespace, "first", "one")
            got = await wait_for(lambda: placed(kube, namespace, ["first"]), timeout=60)
            assert got["first"] == (node, [f"{node}/gpu-1"])
            # the untainted GPU is held: the next pod waits, told why
            await pod(kube, namespace, "second", "one")

            async def told() -> list[str] | None:
                said = [e["message"] for e in await events_for(kube, namespace, "second", "FailedScheduling")]
                return said if any("deviceclass.resource.kubernetes.io/gpu.nvidia.com" in m for m in said) else None

            await wait_for(told, timeout=30)
            # a claim tolerating the taint gets the tainted GPU; the other still waits
            await pod(kube, namespace, "tolerant", "tolerant")
            got = await wait_for(lambda: placed(kube, namespace, ["tolerant"]), timeout=60)
            assert got["tolerant"] == (node, [f"{node}/gpu-0"])
            second = await kube.get(f"/api/v1/namespaces/{namespace}/pods/second")
            assert not second["spec"].get("nodeName")
            claim = await claim_of(kube, namespace, "second")
            assert claim is None or not (claim.get("status") or {}).get("allocation")


async def test_a_gang_member_evicted_for_a_no_execute_device_taint_restarts_the_gang_whole(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any,
) -> None:
    [node] = await make_nodes(1, gpus=0)
    slices = gpudra.gpu_node_slices(node, gpus=2, node_uid=await node_uid(kube, node))
    label = {"scheduling.x-k8s.io/pod-group": "train"}
    async with published(kube, slices):
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
                          gpudra.claim_template("one", "gpu.nvidia.com", 1))
        await kube.create(f"{XK8S}/namespaces/{namespace}/podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "train", "annotations": {"batchsched.io/whole-job-restart": "true"}},
            "spec": {"minMember": 2},
        })
        async with running_scheduler(sandbox, namespace):  # the schedule timeout stays 300 s
            for i in range(2):
                await pod(kube, namespace, f"train-{i}", "one", **label)
            got = await wait_for(lambda: placed(kube, namespace, ["train-0", "train-1"]), timeout=60)

            async def running() -> bool:
                pods = await list_pods(kube, namespace)
                return sum(1 for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")) == 2

            await wait_for(running, timeout=60)
            [device] = got["train-0"][1]
            async with ruled(kube, taint_rule(f"{namespace}-broken", node, device.split("/")[1], "NoExecute")):
                t0 = time.monotonic()

                async def all_gone() -> bool:
                    names = {p["metadata"]["name"] for p in await list_pods(kube, namespace)}
                    return not ({"train-0", "train-1"} & names)

                await wait_for(all_gone, timeout=60)
                print(f"\nthe gang was gone {time.monotonic() - t0:.1f} s after the NoExecute rule was made")
                # the member on the tainted GPU was deleted by kube-controller-manager, the
                # other evicted by batchsched as the gang restarts whole
                assert await events_for(kube, namespace, "train-0", "DeviceTaintManagerEviction")
                assert not await events_for(kube, namespace, "train-1", "DeviceTaintManagerEviction")
                [note] = await events_for(kube, namespace, "train", "WholeJobRestart")
                assert note["message"].startswith("a running member was lost: 1 of 2 required members remain")
                [evicted] = await events_for(kube, namespace, "train", "GangEvicted")
                assert "train-1" in evicted["message"] and "restarts whole" in evicted["message"]
                # submitted again (as its job controller would): one GPU is untainted, so the
                # gang of two waits whole, no member bound
                for i in range(2):
                    await pod(kube, namespace, f"again-{i}", "one", **label)
                await wait_for(lambda: events_for(kube, namespace, "again-0", "FailedScheduling"), timeout=30)
                for i in range(2):
                    p = await kube.get(f"/api/v1/namespaces/{namespace}/pods/again-{i}")
                    assert not p["spec"].get("nodeName"), p["metadata"]["name"]
            # the rule deleted: both GPUs are free, the gang runs whole
            again = await wait_for(lambda: placed(kube, namespace, ["again-0", "again-1"]), timeout=60)
            assert sorted(d for _, ds in again.values() for d in ds) == [f"{node}/gpu-0", f"{node}/gpu-1"]
