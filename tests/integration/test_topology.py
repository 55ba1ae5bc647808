"""Topology-aware gangs on the real control plane: a PodGroup annotated
``batchsched.io/topology: rack`` lands in one rack, and its Events say which."""

from __future__ import annotations

from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.sandbox.nodes import RACK_LABEL, SANDBOX_LABEL
from tests.integration.helpers import (
    XK8S,
    assert_no_overcommit,
    bound,
    condition,
    create_pods,
    events_for,
    get_group,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_a_rack_gang_lands_in_one_rack_after_small_pods_were_scattered(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    # 4 racks of 4 nodes (2 blocks); node i is in rack i // 4
    names = await make_nodes(count=16, gpus=8, nodes_per_rack=4, racks_per_block=2)
    prefix = names[0].rsplit("-", 1)[0]
    pool = {SANDBOX_LABEL: prefix}  # keep every pod of this test on these nodes
    # single-GPU pods on nodes 0, 4, 5 and 12: only rack 2 keeps 4 whole nodes free
    scattered = [0, 4, 5, 12]
    async with running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, [
            pod_body(f"small-{i}", gpu=1, spec={"nodeSelector": {"kubernetes.io/hostname": names[i]}})
            for i in scattered
        ])

        async def small_bound() -> bool:
            return len(bound(await list_pods(kube, namespace), "small")) == len(scattered)

        await wait_for(small_bound, timeout=30)
        await kube.create(f"{XK8S}/namespaces/{namespace}/podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": namespace,
                         "annotations": {"batchsched.io/topology": "rack"}},
            "spec": {"minMember": 4},
        })
        await create_pods(kube, namespace, [
            pod_body(f"train-{i}", gpu=8, cpu="8", memory="64Gi", spec={"nodeSelector": pool},
                     metadata={"labels": {"scheduling.x-k8s.io/pod-group": "train"}})
            for i in range(4)
        ])

        async def whole() -> list[dict[str, Any]] | None:
            pods = [p for p in await list_pods(kube, namespace) if p["metadata"]["name"].startswith("train")]
            return pods if all(p["spec"].get("nodeName") for p in pods) and len(pods) == 4 else None

        gang = await wait_for(whole, timeout=30)
        nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in gang}
        node_objs, _ = await kube.list("/api/v1/nodes")
        racks = {n["metadata"]["name"]: n["metadata"]["labels"][RACK_LABEL] for n in node_objs
                 if n["metadata"]["name"] in names}
        assert {racks[n] for n in nodes.values()} == {f"{prefix}-rack-2"}
        assert sorted(nodes.values()) == sorted(names[8:12])

        rack = f"rack {prefix}-rack-2"
        [event] = await wait_for(lambda: events_for(kube, namespace, "train", "Scheduled"), timeout=10)
        assert event["involvedObject"]["kind"] == "PodGroup"
        assert event["message"] == f"placed 4 members as one gang (quorum 4) within {rack}"
        for pod, node in nodes.items():
            [ev] = await wait_for(lambda pod=pod: events_for(kube, namespace, pod, "Scheduled"), timeout=10)
            assert ev["message"] == f"Successfully assigned {namespace}/{pod} to {node} within {rack}, with its gang"

        async def scheduled() -> bool:
            cond = condition(await get_group(kube, XK8S, namespace, "train"))
            return cond.get("reason") == "Scheduled" and cond.get("status") == "True"

        await wait_for(scheduled, timeout=15)
        await assert_no_overcommit(kube)
