"""A Kueue pod group's Workload tells its user why the group waits for room, and when it
was placed: ``kubectl describe workload NAME`` shows batchsched's Events.

Kueue makes a Workload (``kueue.x-k8s.io``) for each plain pod group, named after the
group; its user reads that, not the pods. Kueue itself does not run here: its Workload CRD
is read from the pinned Kueue module in the Go module cache
(``batchsched/sandbox/gomod/kueue``) and the Workload and pods are made as Kueue makes
them (see ``test_kueue.py``). The Event must name the Workload exactly, uid included
(batchsched reads it when it writes the Event), or ``kubectl describe`` does not show it.
On a cluster that serves Kubernetes' own ``scheduling.k8s.io`` Workload (1.36+, as the
sandbox does), ``workload`` names that one: Kueue's is ``workloads.kueue.x-k8s.io``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    create_pods,
    describe,
    events_for,
    pod_body,
    running_scheduler,
    unavailable,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads"


def workload_crd() -> Path:
    """Kueue's Workload CRD, from the pinned module in the Go module cache (downloaded
    through the module proxy when it is not there yet)."""
    from batchsched.sandbox.kueue import CRD_FOLDER, kueue_source

    return kueue_source() / CRD_FOLDER / "kueue.x-k8s.io_workloads.yaml"


@pytest.fixture
async def workloads(kube: KubeClient) -> None:
    """Kueue's Workload API served by the sandbox (created, or updated to the pinned one)."""
    from batchsched.sandbox.cluster import SandboxError, apply_manifests

    try:
        crd = await asyncio.to_thread(workload_crd)
    except (OSError, SandboxError) as exc:
        unavailable(f"Kueue's Workload CRD could not be read: {exc}")
    await apply_manifests(kube, [crd])


def admitted_member(name: str, pool: str, group: str, total: int) -> dict[str, Any]:
    """A member of a Kueue pod group Kueue has admitted: labelled and annotated with its
    group, its admission gate gone and its pod set named."""
    return pod_body(name, gpu=8, metadata={
        "labels": {"kueue.x-k8s.io/managed": "true", "kueue.x-k8s.io/queue-name": "user-queue",
                   "kueue.x-k8s.io/pod-group-name": group, "kueue.x-k8s.io/podset": "main"},
        "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(total)},
        "finalizers": ["kueue.x-k8s.io/managed"],
    }, spec={"nodeSelector": {"pool": pool}})


def workload(name: str, *, count: int, gpus: int) -> dict[str, Any]:
    """The Workload Kueue makes for a plain pod group: named after it, one pod set."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": name},
        "spec": {"queueName": "user-queue", "podSets": [{
            "name": "main", "count": count,
            "template": {"spec": {"containers": [{
                "name": "main", "image": "trainer:latest",
                "resources": {"requests": {"nvidia.com/gpu": str(gpus)}},
            }]}},
        }]},
    }


async def test_a_kueue_pod_group_waiting_for_room_tells_its_workload_then_that_it_was_placed(
    sandbox, kube: KubeClient, namespace: str, make_nodes, workloads,  # type: ignore[no-untyped-def]
) -> None:
    started = time.perf_counter()
    pool = f"kueue-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    names = ["group-0", "group-1"]
    try:
        async with running_scheduler(sandbox, namespace):
            # another job holds one of the two nodes
            await create_pods(kube, namespace, [pod_body("other", gpu=8, spec={"nodeSelector": {"pool": pool}})])

            async def other_bound() -> bool:
                pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/other")
                return bool(pod["spec"].get("nodeName"))

            await wait_for(other_bound, timeout=30)
            # Kueue made the Workload and admitted the group: its members come without the gate
            made = await kube.create(WORKLOADS.format(namespace=namespace), workload("group", count=2, gpus=8))
            uid = made["metadata"]["uid"]
            await create_pods(kube, namespace, [admitted_member(n, pool, "group", 2) for n in names])

            async def told(reason: str) -> list[dict[str, Any]]:
                return [e for e in await events_for(kube, namespace, "group", reason)
                        if e["involvedObject"]["kind"] == "Workload"]

            [waiting] = await wait_for(lambda: told("FailedScheduling"), timeout=30)
            assert waiting["type"] == "Warning"
            assert waiting["involvedObject"] == {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                                                 "name": "group", "namespace": namespace, "uid": uid}
            assert waiting["message"].startswith(
                "gang needs 2 pods (0.2 cpu, 256Mi memory, 16 nvidia.com/gpu) placed together; only 1 fit now."
            ), waiting["message"]
            # the same words its pods were told
            pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/group-0")
            [cond] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
            assert cond["message"] == waiting["message"]
            shown = await describe(sandbox, namespace, "workloads.kueue.x-k8s.io", "group")
            assert "FailedScheduling" in shown and "only 1 fit now" in shown, shown
            # told once, though the group is tried again while it waits
            await asyncio.sleep(3)
            assert len(await told("FailedScheduling")) == 1

            # the other job ends: the group is placed whole, and its Workload is told
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/other")
            [placed] = await wait_for(lambda: told("Scheduled"), timeout=30)
            assert placed["involvedObject"]["uid"] == uid
            assert placed["message"] == "placed 2 members as one gang (quorum 2)"
            shown = await describe(sandbox, namespace, "workloads.kueue.x-k8s.io", "group")
            assert "placed 2 members as one gang (quorum 2)" in shown, shown
    finally:
        for n in names:  # Kueue's finalizer would hold them past the namespace's deletion
            with contextlib.suppress(NotFoundError):
                await kube.patch(f"/api/v1/namespaces/{namespace}/pods/{n}", {"metadata": {"finalizers": None}})
    print(f"\nKueue Workload Events: {time.perf_counter() - started:.1f} s")
