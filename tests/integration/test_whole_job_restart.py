"""Whole-job restart on the real control plane: a gang whose PodGroup asks for it
(``batchsched.io/whole-job-restart: "true"``) loses a member (its status turns Failed, as a
crashed trainer's does); the rest is evicted at once, long before the schedule timeout, and
the PodGroup gets a WholeJobRestart Event. A suspend annotation that is neither "true" nor
"false" holds the job and says why, rather than running what was meant to wait."""

from __future__ import annotations

import time
import uuid

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_a_lost_member_restarts_the_whole_job(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"restart-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    await kube.create(f"{XK8S}/namespaces/{namespace}/podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "train", "annotations": {"batchsched.io/whole-job-restart": "true"}},
        "spec": {"minMember": 3},
    })
    members = [f"train-{i}" for i in range(3)]
    async with running_scheduler(sandbox, namespace):  # the schedule timeout stays 300 s
        await create_pods(kube, namespace, [
            pod_body(name, gpu=4, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "train"}},
                     spec={"nodeSelector": {"pool": pool}}) for name in members
        ])

        async def running() -> bool:
            # started on their nodes (the node agent gave each an IP): a member fails only
            # after it ran; marked Failed before, the fake kubelet would start it afterwards
            # and turn it Running again
            pods = await list_pods(kube, namespace)
            return sum(1 for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")) == 3

        await wait_for(running, timeout=60)
        failed = await kube.get(f"/api/v1/namespaces/{namespace}/pods/train-0")
        failed["status"]["phase"] = "Failed"
        await kube.replace(f"/api/v1/namespaces/{namespace}/pods/train-0/status", failed)
        t0 = time.monotonic()

        async def rest_gone() -> bool:
            names = {p["metadata"]["name"] for p in await list_pods(kube, namespace)}
            return not ({"train-1", "train-2"} & names)

        await wait_for(rest_gone, timeout=60)
        print(f"the other members were evicted {time.monotonic() - t0:.1f} s after train-0 failed")
        [note] = await events_for(kube, namespace, "train", "WholeJobRestart")
        assert note["message"].startswith("a running member was lost: 2 of 3 required members remain")
        evicted = await events_for(kube, namespace, "train", "GangEvicted")
        assert len(evicted) == 2 and all("restarts whole" in e["message"] for e in evicted)


async def test_a_misspelt_suspend_holds_the_job_and_says_why(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"suspend-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    await kube.create(f"{XK8S}/namespaces/{namespace}/podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "held", "annotations": {"batchsched.io/suspend": "yes"}},
        "spec": {"minMember": 1},
    })
    async with running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, [pod_body(
            "held-0", gpu=1, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "held"}},
            spec={"nodeSelector": {"pool": pool}})])
        [event] = await wait_for(lambda: events_for(kube, namespace, "held", "InvalidPodGroup"), timeout=30)
        assert event["message"] == (
            f"PodGroup {namespace}/held is invalid, its pods are not scheduled: "
            "annotation batchsched.io/suspend must be \"true\" or \"false\", got 'yes'"
        )
        assert not [p for p in await list_pods(kube, namespace) if p["spec"].get("nodeName")]

        # spelt right, it is read as meant: "false" runs the job
        await kube.patch(f"{XK8S}/namespaces/{namespace}/podgroups/held",
                         {"metadata": {"annotations": {"batchsched.io/suspend": "false"}}})

        async def bound() -> bool:
            return any(p["spec"].get("nodeName") for p in await list_pods(kube, namespace))

        await wait_for(bound, timeout=30)
