"""Reservations on the real control plane: a 16-GPU gang is not starved by a stream of small pods.

Three nodes of 8 GPUs are busy with 1-GPU pods that run 10-20 s (kwok completes each after its
``batchsched.io/sim-duration``) and declare it (``batchsched.io/expected-runtime`` on some,
``activeDeadlineSeconds`` on the others). Then a gang of two 8-GPU pods (a scheduler-plugins
PodGroup, minMember 2) is created, and a new 1-GPU pod arrives every 0.4 s at the same
priority: more than the cluster can run, so without a reservation every GPU that frees goes to
a small pod and the gang waits for good.

``RESERVATION_ENABLED=false`` runs the same test with reservations off (it fails: the gang
does not start within the bound); each run prints the gang's wait.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    arriving,
    create_group,
    create_pods,
    gang_wait,
    list_pods,
    pod_body,
    running_scheduler,
    small_gpu_pod,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

#: the gang must start within this long of its creation
BOUND = 60.0
ENABLED = os.environ.get("RESERVATION_ENABLED", "true").lower() != "false"


async def test_a_large_gang_starts_within_a_bound_under_a_stream_of_small_pods(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    rng = random.Random(7)
    await make_nodes(count=3, gpus=8)
    async with running_scheduler(sandbox, namespace, reservation={"enabled": ENABLED}):  # type: ignore[attr-defined]
        await create_pods(kube, namespace, [
            small_gpu_pod(f"busy-{i:02d}", rng.randint(10, 20), deadline=i % 2 == 0) for i in range(24)
        ])

        async def busy() -> bool:
            return sum(1 for p in await list_pods(kube, namespace) if p["spec"].get("nodeName")) == 24

        await wait_for(busy, timeout=30)
        await create_group(kube, XK8S, namespace, "big", {"minMember": 2})
        await create_pods(kube, namespace, [
            pod_body(f"big-{i}", gpu=8, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "big"}})
            for i in range(2)
        ])
        created = time.monotonic()

        def late(i: int) -> dict[str, Any]:
            return small_gpu_pod(f"late-{i:04d}", rng.randint(10, 20), deadline=i % 2 == 1)

        async with arriving(kube, namespace, late, every=0.4):
            wait, told = await gang_wait(kube, namespace, "big", ["big-0", "big-1"], since=created,
                                         timeout=BOUND, late="late-", what=f"reservation enabled={ENABLED}")
        assert wait <= BOUND
        # while it waited, its pods and its PodGroup said it holds a reservation, and where
        reserved = {who: next((m for r, m in said if r == "Reserved"), "") for who, said in told.items()}
        assert "; holds a reservation on node(s) " in reserved["pod"], told
        assert "expected to start in about" in reserved["pod"]
        assert "; holds a reservation on node(s) " in reserved["group"], told


def _told(pod: dict[str, Any]) -> tuple[str, str]:
    """A waiting pod's PodScheduled condition: reason and message."""
    cond = next((c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    return cond.get("reason", ""), cond.get("message", "")


@pytest.mark.parametrize("first_walk", [0.0, 5.0], ids=["first-cycle-cut", "one-walk"])
async def test_a_waiting_pod_reserves_behind_pods_placed_in_its_own_cycle_as_behind_bound_ones(
    sandbox, kube: KubeClient, namespace: str, make_nodes, first_walk: float,  # type: ignore[no-untyped-def]
) -> None:
    """One node of 8 GPUs and, made before batchsched starts and a second apart (equal
    priorities go oldest first): a gang of one 1-GPU pod, a pod of 8 GPUs, a pod of 1 GPU.
    The gang's pod is bound; the 8-GPU pod holds a reservation on the node behind it (it
    declares no end, so the start is unknown); the last pod waits, told the room is
    reserved. Alike whether the first cycle stops after the gang (first walk budget 0) or
    walks all three: a walk that saw the gang's pod, placed in that same walk, as never
    ending made no reservation and bound the last pod."""
    [node] = await make_nodes(count=1, gpus=8)
    await create_group(kube, XK8S, namespace, "g", {"minMember": 1})
    bodies = [pod_body("g-0", gpu=1, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "g"}}),
              pod_body("big", gpu=8), pod_body("last", gpu=1)]
    for body in bodies:
        await create_pods(kube, namespace, [body])
        await asyncio.sleep(1.1)  # creation times are in seconds
    async with running_scheduler(sandbox, namespace, cycle={"firstWalkBudgetSeconds": first_walk}):  # type: ignore[attr-defined]
        async def decided() -> dict[str, dict[str, Any]] | None:
            got = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
            waiting = all(_told(got[n])[1] for n in ("big", "last")) or got["last"]["spec"].get("nodeName")
            return got if got["g-0"]["spec"].get("nodeName") and waiting else None

        got = await wait_for(decided, timeout=30)
        assert not got["last"]["spec"].get("nodeName"), "the last pod took a GPU the 8-GPU pod reserves"
        reason, message = _told(got["big"])
        assert reason == "Reserved" and f"holds a reservation on node(s) {node}; start time unknown" in message, message
        _, message = _told(got["last"])
        assert f"capacity on node(s) {node} is reserved for" in message and "big" in message, message
        await asyncio.sleep(2)  # later cycles keep it so
        assert not await bound_now(kube, namespace, "last")


async def bound_now(kube: KubeClient, namespace: str, name: str) -> bool:
    pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return bool(pod["spec"].get("nodeName"))
