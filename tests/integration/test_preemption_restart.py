"""Preemption survives a restart: the preemptor's nominatedNodeName holds the freed node."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import create_pods, pod_body, start_process, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HOLD = "batchsched.io/sim-hold"


def _pod(name: str, pool: str, gpu: int, priority_class: str, **annotations: str) -> dict[str, Any]:
    return pod_body(name, gpu=gpu, metadata={"annotations": annotations},
                    spec={"nodeSelector": {"pool": pool}, "priorityClassName": priority_class})


async def _get(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except NotFoundError:
        return None


async def test_killed_between_evictions_and_binding_the_preemptor_still_gets_the_node(
    sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox.cluster import free_port

    pool = uuid.uuid4().hex[:6]
    [node] = await make_nodes(count=1, gpus=8, labels={"pool": pool})
    cfg = tmp_path / "batchsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "leaderElection": {"namespace": namespace, "leaseDurationSeconds": 3, "renewDeadlineSeconds": 2,
                           "retryPeriodSeconds": 0.5},
        "metricsAddress": f"127.0.0.1:{free_port()}",
    }))
    log = tmp_path / "batchsched.log"
    # two low-priority pods fill the node; one of them is slow to shut down
    await create_pods(kube, namespace, [
        _pod("low-0", pool, 4, "low-priority"),
        _pod("low-1", pool, 4, "low-priority", **{HOLD: "true"}),
    ])
    first = start_process(sandbox, cfg, log)
    try:
        async def running(name: str) -> bool:
            pod = await _get(kube, namespace, name)
            return pod is not None and pod["status"].get("phase") == "Running"

        await wait_for(lambda: running("low-0"), timeout=60)
        await wait_for(lambda: running("low-1"), timeout=30)
        await create_pods(kube, namespace, [_pod("urgent", pool, 8, "high-priority")])

        async def nominated() -> bool:
            urgent = await _get(kube, namespace, "urgent")
            held = await _get(kube, namespace, "low-1")
            return (
                urgent is not None and urgent["status"].get("nominatedNodeName") == node
                and await _get(kube, namespace, "low-0") is None
                and held is not None and bool(held["metadata"].get("deletionTimestamp"))
            )

        # it preempted both; one is gone, the other still terminating
        await wait_for(nominated, timeout=30)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # while no scheduler runs, smaller work arrives that would fit in the half-freed node
    await create_pods(kube, namespace, [_pod("small", pool, 1, "low-priority")])
    second = start_process(sandbox, cfg, log)
    try:
        await asyncio.sleep(8)  # several cycles of the restarted scheduler
        small = await _get(kube, namespace, "small")
        assert small is not None and not small["spec"].get("nodeName"), "the held node was given away"
        # the slow victim finishes: the node goes to the preemptor
        await kube.patch(f"/api/v1/namespaces/{namespace}/pods/low-1",
                         {"metadata": {"annotations": {HOLD: None}}})

        async def urgent_bound() -> str | None:
            urgent = await _get(kube, namespace, "urgent")
            return urgent["spec"].get("nodeName") if urgent is not None else None

        assert await wait_for(urgent_bound, timeout=30) == node
        small = await _get(kube, namespace, "small")
        assert small is not None and not small["spec"].get("nodeName")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait()
