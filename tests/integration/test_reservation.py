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
