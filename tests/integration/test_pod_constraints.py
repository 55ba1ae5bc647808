"""Pod topology spread and required inter-pod (anti-)affinity on the real control plane.

Each test creates the pods a user would write, runs batchsched, and reads ``spec.nodeName``
back from the apiserver. The sandbox nodes carry ``kubernetes.io/hostname`` (their name) and
``batchsched.io/rack``.
"""

from __future__ import annotations

from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.sandbox.nodes import RACK_LABEL
from tests.integration.helpers import (
    XK8S,
    assert_no_overcommit,
    create_group,
    create_pods,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HOST = "kubernetes.io/hostname"


def nodes_of(pods: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    """Pod name -> node, for the bound pods of ``prefix``."""
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in pods if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")
    }


async def bound_all(kube: KubeClient, namespace: str, prefix: str, count: int) -> dict[str, str]:
    async def check() -> dict[str, str] | None:
        got = nodes_of(await list_pods(kube, namespace), prefix)
        return got if len(got) == count else None

    result: dict[str, str] = await wait_for(check, timeout=30)
    return result


async def test_three_pods_with_a_hostname_spread_land_on_three_nodes(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    names = await make_nodes(count=3, gpus=0)
    spread = [{"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "web"}}}]
    bodies = [pod_body(f"web-{i}", metadata={"labels": {"app": "web"}},
                       spec={"topologySpreadConstraints": spread}) for i in range(3)]
    await create_pods(kube, namespace, bodies)
    async with running_scheduler(sandbox, namespace):
        placed = await bound_all(kube, namespace, "web-", 3)
    assert sorted(placed.values()) == sorted(names)
    await assert_no_overcommit(kube)


async def test_a_gang_with_anti_affinity_to_itself_lands_one_per_node(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    names = await make_nodes(count=4, gpus=8)
    await create_group(kube, XK8S, namespace, "ring", {"minMember": 4})
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"job": "ring"}}, "topologyKey": HOST},
    ]}}
    labels = {"job": "ring", "scheduling.x-k8s.io/pod-group": "ring"}
    bodies = [pod_body(f"ring-{i}", gpu=1, metadata={"labels": labels}, spec={"affinity": anti})
              for i in range(4)]
    await create_pods(kube, namespace, bodies)
    async with running_scheduler(sandbox, namespace):
        placed = await bound_all(kube, namespace, "ring-", 4)
    assert sorted(placed.values()) == sorted(names)
    await assert_no_overcommit(kube)


async def test_a_pod_with_affinity_to_another_lands_in_its_rack(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    names = await make_nodes(count=4, gpus=0, nodes_per_rack=2)
    nodes = {n: (await kube.get(f"/api/v1/nodes/{n}"))["metadata"]["labels"][RACK_LABEL] for n in names}
    # the database runs on the last node (bound there directly), in the second rack
    db = pod_body("db", metadata={"labels": {"app": "db"}}, spec={"nodeName": names[-1]})
    follow = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": RACK_LABEL},
    ]}}
    await create_pods(kube, namespace, [db])
    await bound_all(kube, namespace, "db", 1)
    bodies = [pod_body(f"cache-{i}", spec={"affinity": follow}) for i in range(3)]
    await create_pods(kube, namespace, bodies)
    async with running_scheduler(sandbox, namespace):
        placed = await bound_all(kube, namespace, "cache-", 3)
    assert {nodes[n] for n in placed.values()} == {nodes[names[-1]]}
    await assert_no_overcommit(kube)
