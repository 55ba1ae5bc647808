"""After a long apiserver outage, batchsched schedules again within seconds of its return.

Its watches retry with a growing back-off while the apiserver is down; the back-off is
capped low enough that, once the apiserver answers, the mirror is listed again and a new
pod bound within a few seconds, not after a half-minute wait that was only meant to spare
an apiserver that is away (the chaos suite's expired-watch fault found pods created just
after such a return waiting, untold, for over 30 s)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from batchsched.kube.client import KubeClient
from batchsched.sandbox.cluster import Sandbox
from tests.integration.helpers import create_pods, list_pods, pod_body, running_scheduler, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(300)]

#: long enough for every watch's back-off to have grown past its cap
OUTAGE_SECONDS = 40.0
#: from the apiserver's return to the new pod's Binding
BACK_WITHIN_SECONDS = 12.0


async def test_a_pod_created_after_a_long_outage_is_bound_within_seconds_of_the_apiservers_return(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    from pathlib import Path

    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    box = Sandbox(sandbox.name, root=Path(sandbox.dir).parent)
    # one replica without leader election: a replica that leads stops when its lease
    # cannot be renewed (its restart is the chaos suite's fault); here only its watches wait
    async with running_scheduler(sandbox, namespace, leaderElection={"enabled": False}):
        await create_pods(kube, namespace, [pod_body("before", gpu=1, spec={"nodeSelector": {"pool": pool}})])
        await wait_for(lambda: _bound(kube, namespace, "before"), timeout=30)
        await asyncio.to_thread(box.stop_component, "kube-apiserver")
        await asyncio.sleep(OUTAGE_SECONDS)
        await asyncio.to_thread(box.start_component, "kube-apiserver")
        back = time.monotonic()
        await create_pods(kube, namespace, [pod_body("after", gpu=1, spec={"nodeSelector": {"pool": pool}})])
        await wait_for(lambda: _bound(kube, namespace, "after"), timeout=60, interval=0.5)
        took = time.monotonic() - back
        print(f"bound {took:.1f} s after the apiserver answered again ({OUTAGE_SECONDS:g} s outage)")
        assert took < BACK_WITHIN_SECONDS


async def _bound(kube: KubeClient, namespace: str, name: str) -> bool:
    return any(p["metadata"]["name"] == name and p["spec"].get("nodeName") for p in await list_pods(kube, namespace))
