"""A backlog on the real control plane: alike pods decided once, sleeping until room frees."""

from __future__ import annotations

import asyncio

import pytest

from batchsched.kube.client import KubeClient
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


def _scheduled(pod: dict[str, object]) -> dict[str, str]:
    for c in (pod.get("status") or {}).get("conditions") or []:  # type: ignore[union-attr]
        if c.get("type") == "PodScheduled":
            return dict(c)
    return {}


async def test_a_backlog_that_cannot_fit_is_told_why_then_sleeps_and_wakes_when_room_frees(  # type: ignore[no-untyped-def]
    sandbox, kube: KubeClient, namespace: str, make_nodes,
) -> None:
    nodes = await make_nodes(count=4, gpus=8, cpu="32", memory="256Gi")
    # the nodes are full of running pods (bound at creation), and behind them wait 200 alike
    # pods and 10 alike gangs, none of which fits
    await create_pods(kube, namespace, [pod_body(f"run-{i:02d}", gpu=1, spec={"nodeName": nodes[i % 4]})
                                        for i in range(32)])
    await create_pods(kube, namespace, [pod_body(f"wait-{i:03d}", gpu=1) for i in range(200)])
    await asyncio.sleep(1.1)  # the gangs come later (creation times are in seconds)
    gangs = []
    for i in range(10):
        await create_group(kube, XK8S, namespace, f"job-{i}", {"minMember": 2})
        gangs += [pod_body(f"job-{i}-{m}", gpu=8, metadata={"labels": {"scheduling.x-k8s.io/pod-group": f"job-{i}"}})
                  for m in range(2)]
    await create_pods(kube, namespace, gangs)
    async with running_scheduler(sandbox, namespace) as sched:
        async def all_told() -> bool:
            pods = [p for p in await list_pods(kube, namespace) if not p["metadata"]["name"].startswith("run-")]
            return len(pods) == 220 and all(_scheduled(p).get("status") == "False" for p in pods)

        await wait_for(all_told, timeout=60, interval=0.5)
        pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
        messages = {name: _scheduled(pods[name])["message"] for name in pods if name.startswith("wait-")}
        # the first in line (creation time, then UID) holds a reservation; the other 199 are
        # told why they wait, all the same, though the cycle tried only a couple of them
        [first] = [n for n, m in messages.items()
                   if m.startswith("0/4 nodes fit: 4 insufficient nvidia.com/gpu; holds a reservation")]
        assert {m for n, m in messages.items() if n != first} == {"0/4 nodes fit: 4 insufficient nvidia.com/gpu."}
        assert "nvidia.com/gpu" in _scheduled(pods["job-7-0"])["message"]

        # nothing changes: the scheduler runs no cycle
        await asyncio.sleep(3)  # back-offs of the arrivals pass
        cycles = sched.cycles
        await asyncio.sleep(5)
        assert sched.cycles == cycles

        # one running pod ends: the first in line takes its GPU, nobody else moves
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/run-05", gracePeriodSeconds=0)

        async def first_bound() -> bool:
            pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
            return bool(pods[first]["spec"].get("nodeName"))

        await wait_for(first_bound, timeout=30, interval=0.3)
        await asyncio.sleep(1)
        pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
        assert [n for n, p in pods.items() if p["spec"].get("nodeName") and not n.startswith("run-")] == [first]
        assert sched.cycles > cycles
