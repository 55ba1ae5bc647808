"""Statuses decided while this replica's lease deadline had passed are written once it
leads again (they are not lost until something else about the object changes).

A replica stops writing the moment its lease deadline passes (its fence), and on a busy
machine a renewal can come late: the loop decided a status, the writer found the fence
closed and dropped it. Nothing about the object changed afterwards, so nothing asked for the
status again: a PodGroup whose pods all ran kept showing ``Scheduling, running 0``, and a pod
that can never fit showed no reason at all. These tests close the writers' fence (as a late
renewal does), let the scheduler decide, open it again, and read what users read.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.leader import Fence
from tests.integration.helpers import (
    XK8S,
    create_group,
    create_pods,
    get_group,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"


def _passed() -> Fence:
    """A fence that was open once and whose deadline has passed (a renewal came late)."""
    return Fence(until=1.0)


async def test_a_podgroup_status_decided_behind_a_passed_fence_is_written_once_it_opens(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace) as sched:
        # every status writer is behind the passed fence (as they are when the lease's is)
        fence = sched.status.fence = sched.group_status.fence = _passed()
        # other teams' gangs: the slow sweep that writes every group's status again reaches
        # this one only after about a minute (it writes a share of them at each step)
        for chunk in range(0, 240, 40):
            await asyncio.gather(*(create_group(kube, XK8S, namespace, f"other-{i:03}", {"minMember": 1})
                                   for i in range(chunk, chunk + 40)))
        await create_group(kube, XK8S, namespace, "train", {"minMember": 2})
        await create_pods(kube, namespace, [
            pod_body(f"train-{i}", gpu=8, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "train"}},
                     spec={"nodeSelector": {"pool": pool}})
            for i in range(2)
        ])

        async def running() -> bool:
            pods = await list_pods(kube, namespace)
            return len(pods) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)

        await wait_for(running, timeout=60)
        # the loop steps at least once a second: by now it has decided "Running" and the
        # writer has found its fence passed
        await wait_for(lambda: _settled(sched), timeout=10)
        await asyncio.sleep(3)
        group = await get_group(kube, XK8S, namespace, "train")
        assert (group.get("status") or {}).get("phase") != "Running", "the fence let a write through"
        fence.extend(math.inf)  # the renewal arrives

        async def shows_running() -> dict[str, Any] | None:
            st = (await get_group(kube, XK8S, namespace, "train")).get("status") or {}
            return st if (st.get("phase"), st.get("running")) == ("Running", 2) else None

        # well before the slow sweep of every group's status (once a minute)
        await wait_for(shows_running, timeout=15)


async def test_why_a_pod_waits_decided_behind_a_passed_fence_is_written_once_it_opens(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace) as sched:
        fence = sched.status.fence = _passed()
        await create_pods(kube, namespace, [pod_body("huge", gpu=16, spec={"nodeSelector": {"pool": pool}})])
        await wait_for(lambda: _settled(sched), timeout=10)
        await asyncio.sleep(3)

        async def told() -> dict[str, Any] | None:
            [pod] = await list_pods(kube, namespace)
            return next((c for c in (pod.get("status") or {}).get("conditions") or []
                         if (c.get("type"), c.get("status")) == ("PodScheduled", "False")), None)

        assert await told() is None, "the fence let a write through"
        fence.extend(math.inf)
        cond = await wait_for(told, timeout=15)
        assert cond["reason"] == "Unschedulable" and "nvidia.com/gpu" in cond["message"], cond


async def _settled(sched: Any) -> bool:
    """Nothing queued or in flight in the status writers."""
    return bool(sched.status.pending == 0 and sched.group_status.pending == 0)
