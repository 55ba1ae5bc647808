"""Bad input on the real control plane: reported where it is, and scheduling goes on."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest

from batchsched.app import Scheduler, SchedulerFailed
from batchsched.core.mirror import StateError
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    QUEUES,
    config,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    scheduler_kubeconfig,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

WIDGET = "example.com/widget"


def _absurd_pod(name: str, resource: str, amount: str) -> dict[str, Any]:
    body = pod_body(name)
    resources = body["spec"]["containers"][0]["resources"]
    resources["requests"][resource] = amount
    resources.setdefault("limits", {})[resource] = amount
    return body


async def _bound(kube: KubeClient, namespace: str, names: list[str]) -> dict[str, str] | None:
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in await list_pods(kube, namespace)}
    if all(nodes.get(n) for n in names):
        return {n: str(nodes[n]) for n in names}
    return None


async def _node_events(kube: KubeClient, node: str, reason: str) -> list[dict[str, Any]]:
    items = (await kube.get("/api/v1/namespaces/default/events"))["items"]
    return [e for e in items if e["involvedObject"].get("name") == node and e["reason"] == reason]


async def test_absurd_quantities_are_reported_and_scheduling_goes_on(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    [odd] = await make_nodes(count=1, gpus=8, extended={WIDGET: "1e30"})
    await make_nodes(count=1, gpus=8)
    queue = f"huge-{tag}"
    await kube.create(QUEUES, {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": queue},
                               "spec": {"resources": [{"name": "nvidia.com/gpu", "nominal": "1e30"}]}})
    try:
        async with running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}) as sched:
            await create_pods(kube, namespace, [
                _absurd_pod("absurd", "nvidia.com/gpu", "1e30"),
                _absurd_pod("widget", WIDGET, "1"),
                *(pod_body(f"ok-{i}", gpu=1) for i in range(4)),
            ])
            await wait_for(lambda: _bound(kube, namespace, [f"ok-{i}" for i in range(4)]), timeout=30)

            # the pod asking for an absurd amount is told why, and never bound
            [ev] = await wait_for(lambda: events_for(kube, namespace, "absurd", "FailedScheduling"), timeout=20)
            assert ev["message"] == (
                "pod " + namespace + "/absurd cannot be scheduled: unreadable resource request: quantity "
                "'1e30' of nvidia.com/gpu is beyond what batchsched counts (at most 1125899906842623)"
            )
            # the node whose allocatable cannot be read: that resource is unusable, and said so
            [nev] = await wait_for(lambda: _node_events(kube, odd, "UnreadableAllocatable"), timeout=20)
            assert nev["type"] == "Warning"
            assert nev["message"].startswith(f"node {odd}: {WIDGET} treated as unusable")
            [wev] = await wait_for(lambda: events_for(kube, namespace, "widget", "FailedScheduling"), timeout=20)
            assert wev["message"].startswith("0/2 nodes fit: 2 insufficient example.com/widget")

            # the queue of absurd size is invalid, not a crash
            async def invalid() -> dict[str, Any] | None:
                conds = ((await kube.get(f"{QUEUES}/{queue}")).get("status") or {}).get("conditions") or []
                return next((c for c in conds if c.get("reason") == "InvalidSpec"), None)

            cond = await wait_for(invalid, timeout=20)
            assert "beyond what batchsched counts" in cond["message"]

            # and the scheduler still schedules, and says it is ready
            assert sched.ready
            await create_pods(kube, namespace, [pod_body("after", gpu=1)])
            await wait_for(lambda: _bound(kube, namespace, ["after"]), timeout=20)
            for name in ("absurd", "widget"):
                pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
                assert not pod["spec"].get("nodeName")
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"{QUEUES}/{queue}")


async def test_a_failed_scheduling_loop_stops_the_replica_and_releases_its_lease(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    await make_nodes(count=1, gpus=8)
    client = await KubeClient.connect(scheduler_kubeconfig(sandbox))
    sched = Scheduler(client, config(namespace))
    task = asyncio.get_running_loop().create_task(sched.run())
    try:
        await wait_for(lambda: _is(sched.ready and sched.leading.is_set()), timeout=60)

        def broken(now: float) -> Any:
            raise StateError("usage bookkeeping is off on nodes ['n0']")

        sched.session.step = broken  # type: ignore[method-assign]
        await create_pods(kube, namespace, [pod_body("wakes-the-loop", gpu=1)])
        # no replica that looks alive and schedules nothing: it stops, not ready, lease released
        with pytest.raises(SchedulerFailed, match="usage bookkeeping is off"):
            await asyncio.wait_for(task, 30)
        assert not sched.ready
        lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
        assert not lease["spec"].get("holderIdentity")
    finally:
        task.cancel()
        await client.close()


async def _is(value: bool) -> bool:
    return value
