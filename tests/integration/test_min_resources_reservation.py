"""A gang whose PodGroup sets ``minResources`` holds a reservation on the real control plane:
it is not starved by a stream of later small pods.

Two nodes of 8 GPUs are busy with 1-GPU pods that run 10-20 s (kwok completes each after its
``batchsched.io/sim-duration``) and declare it (``activeDeadlineSeconds`` on some,
``batchsched.io/expected-runtime`` on the others). Then a gang shaped as the training operator
makes it (a scheduler-plugins PodGroup, minMember 2, ``minResources`` the two 8-GPU pods'
requests summed) is created, and a new 1-GPU pod of the same priority arrives every 0.7 s:
more than the cluster can run, so unless the gang holds the nodes it waits for, every GPU
that frees goes to a later small pod and its ``minResources`` is never free.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    arriving,
    assert_no_overcommit,
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

GPU = "nvidia.com/gpu"
#: the gang must start within this long of its creation (the work it waits for runs 20 s at most)
BOUND = 60.0


async def test_a_gang_short_of_min_resources_starts_within_a_bound_under_a_stream_of_small_pods(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    rng = random.Random(11)
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, [
            small_gpu_pod(f"busy-{i:02d}", rng.randint(10, 20), deadline=i % 2 == 0, pool=pool) for i in range(16)
        ])

        async def busy() -> bool:
            return sum(1 for p in await list_pods(kube, namespace) if p["spec"].get("nodeName")) == 16

        await wait_for(busy, timeout=30)
        await create_group(kube, XK8S, namespace, "big", {
            "minMember": 2, "minResources": {"cpu": "200m", "memory": "256Mi", GPU: "16"},
        })
        await create_pods(kube, namespace, [
            pod_body(f"big-{i}", gpu=8, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "big"}},
                     spec={"nodeSelector": {"pool": pool}})
            for i in range(2)
        ])
        created = time.monotonic()
        # creation times have whole seconds: the stream starts a second later, so its pods
        # are all younger than the gang
        await asyncio.sleep(1.5)

        def late(i: int) -> dict[str, Any]:
            return small_gpu_pod(f"late-{i:04d}", rng.randint(10, 20), deadline=i % 2 == 1, pool=pool)

        async with arriving(kube, namespace, late, every=0.7):
            wait, told = await gang_wait(kube, namespace, "big", ["big-0", "big-1"], since=created,
                                         timeout=BOUND, late="late-", what="gang with minResources")
        assert wait <= BOUND
        # while it waited, its pods and its PodGroup gave the minResources reason, then where
        # it holds its nodes
        short = f"gang {namespace}/big needs minResources the cluster does not have free: 16 {GPU} (free: "
        for who in ("pod", "group"):
            assert told[who] and all(m.startswith(short) for _, m in told[who]), told
            assert any(r == "Reserved" and "; holds a reservation on node(s) " in m for r, m in told[who]), told
        await assert_no_overcommit(kube)
