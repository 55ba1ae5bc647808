"""Equivalence classes and arrival order on the real control plane.

* A running pod's required anti-affinity against ``app=x`` does not hold back a pending pod
  of ``app=y`` that asks the same as a pending ``app=x`` pod (one class, before).
* Of two gangs (and two pods) of equal priority created in the same second, the first
  created is placed when only one fits: first come, first served. The apiserver gives
  UIDs at random, so the test recreates the second object until its UID sorts before the
  first's (and names the first so that it sorts last by name too): UID order, or name
  order, would pick the second one every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    XK8S,
    create_group,
    create_pods,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HOST = "kubernetes.io/hostname"


def nodes_of(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in pods}


async def test_a_pod_is_not_held_back_by_a_classmate_a_running_pods_anti_affinity_selects(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"cls-{uuid.uuid4().hex[:6]}"
    [node] = await make_nodes(count=1, gpus=0, labels={"pool": pool})
    guard = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": HOST}]}}
    await create_pods(kube, namespace, [pod_body("guard", metadata={"labels": {"app": "guard"}},
                                                 spec={"nodeName": node, "affinity": guard})])
    select = {"nodeSelector": {"pool": pool}}
    await create_pods(kube, namespace, [pod_body("a", metadata={"labels": {"app": "x"}}, spec=select)])
    await asyncio.sleep(1.1)  # a is older: tried first
    await create_pods(kube, namespace, [pod_body("b", metadata={"labels": {"app": "y"}}, spec=select)])
    async with running_scheduler(sandbox, namespace):
        async def b_bound() -> bool:
            return bool(nodes_of(await list_pods(kube, namespace)).get("b"))

        await wait_for(b_bound, timeout=60)

        async def a_told() -> str:
            a = await kube.get(f"/api/v1/namespaces/{namespace}/pods/a")
            return next((str(c.get("message", "")) for c in (a.get("status") or {}).get("conditions") or []
                         if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")

        message = await wait_for(a_told, timeout=30)
    assert nodes_of(await list_pods(kube, namespace))["b"] == node
    assert not nodes_of(await list_pods(kube, namespace))["a"]
    assert "1 node(s) didn't satisfy existing pods anti-affinity rules" in message


async def _same_second_uid_reversed(
    create: Callable[[str], Awaitable[dict[str, Any]]], delete: Callable[[str], Awaitable[None]],
    first_name: str, second_name: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create ``first`` then ``second`` in one second of the apiserver's clock, ``second``
    recreated (under a fresh name suffix) until its UID sorts before ``first``'s."""
    for attempt in range(20):
        await asyncio.sleep(1.0 - time.time() % 1.0 + 0.02)  # at the start of a second
        first = await create(f"{first_name}-{attempt}")
        second: dict[str, Any] | None = None
        for k in range(10):
            if second is not None:
                await delete(second["metadata"]["name"])
            second = await create(f"{second_name}-{attempt}-{k}")
            if second["metadata"]["uid"] < first["metadata"]["uid"]:
                break
        assert second is not None
        if (second["metadata"]["uid"] < first["metadata"]["uid"]
                and second["metadata"]["creationTimestamp"] == first["metadata"]["creationTimestamp"]):
            return first, second
        await delete(first["metadata"]["name"])
        await delete(second["metadata"]["name"])
    raise AssertionError("could not create two objects in one second with their UIDs reversed")


async def test_of_two_gangs_created_in_one_second_the_first_created_is_placed(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    """As the AppWrapper test's two wrappers: 2x3 GPUs then 2x2 GPUs on 8 GPUs, one fits."""
    pool = f"ord-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=1, gpus=8, labels={"pool": pool})

    async def create(name: str) -> dict[str, Any]:
        return await create_group(kube, XK8S, namespace, name, {"minMember": 2})

    async def delete(name: str) -> None:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"{XK8S}/namespaces/{namespace}/podgroups/{name}")

    # the first created sorts last by name and by UID
    first, second = await _same_second_uid_reversed(create, delete, "zz-train", "aa-tune")

    def members(group: dict[str, Any], gpu: int) -> list[dict[str, Any]]:
        name = group["metadata"]["name"]
        return [pod_body(f"{name}-{i}", gpu=gpu, metadata={"labels": {"scheduling.x-k8s.io/pod-group": name}},
                         spec={"nodeSelector": {"pool": pool}}) for i in range(2)]

    # the second's members are created first: a gang's place is its PodGroup's
    await create_pods(kube, namespace, members(second, 2))
    await create_pods(kube, namespace, members(first, 3))
    async with running_scheduler(sandbox, namespace):
        async def any_bound() -> dict[str, str] | None:
            nodes = nodes_of(await list_pods(kube, namespace))
            return nodes if any(nodes.values()) else None

        await wait_for(any_bound, timeout=60)
        await asyncio.sleep(3.0)  # the other gang was tried and left whole
        nodes = nodes_of(await list_pods(kube, namespace))
    placed = sorted(name for name, node in nodes.items() if node)
    assert placed == [f"{first['metadata']['name']}-0", f"{first['metadata']['name']}-1"], (
        f"the gang created second ({second['metadata']['name']}) was placed before the first")


async def test_of_two_pods_created_in_one_second_the_first_created_is_placed(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"ord-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=1, gpus=8, labels={"pool": pool})

    async def create(name: str) -> dict[str, Any]:
        # 6 GPUs for the first, 4 for the second: one of them fits
        body = pod_body(name, gpu=6 if name.startswith("zz") else 4, spec={"nodeSelector": {"pool": pool}})
        created: dict[str, Any] = await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
        return created

    async def delete(name: str) -> None:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)

    first, second = await _same_second_uid_reversed(create, delete, "zz-first", "aa-second")
    async with running_scheduler(sandbox, namespace):
        async def any_bound() -> dict[str, str] | None:
            nodes = nodes_of(await list_pods(kube, namespace))
            return nodes if any(nodes.values()) else None

        await wait_for(any_bound, timeout=60)
        await asyncio.sleep(2.0)
        nodes = nodes_of(await list_pods(kube, namespace))
    assert nodes[first["metadata"]["name"]], "the pod created first was not placed"
    assert not nodes[second["metadata"]["name"]], "the pod created second was placed first"
