"""Gangs whose PodGroup sets ``minResources`` (the training operator and KubeRay always
write it) preempt and reclaim like any other gang.

The objects are shaped as the operators make them: the training operator's
scheduler-plugins path (a PodGroup named after the job, minMember = all replicas,
minResources = their requests summed, pods labelled with the group), its volcano path
(a Volcano PodGroup with the job's priority class; the pods are created only once the
group is Inqueue) and KubeRay's (a PodGroup named after the RayCluster for its head and
workers).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    VOLCANO,
    VOLCANO_CRD,
    XK8S,
    bound,
    create_group,
    create_pods,
    get_group,
    list_pods,
    owner,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"


def _pod(name: str, pool: str, *, gpu: int, priority_class: str = "", labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, scheduler: str = "batchsched",
         ref: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {"pool": pool}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    meta: dict[str, Any] = {"labels": labels or {}, "annotations": annotations or {}}
    if ref is not None:
        meta["ownerReferences"] = [ref]
    return pod_body(name, gpu=gpu, cpu="1", memory="1Gi", scheduler=scheduler, metadata=meta, spec=spec)


async def _fill(kube: KubeClient, namespace: str, pool: str, count: int, **labels: str) -> list[str]:
    """Low-priority work filling every GPU of the pool, running."""
    names = [f"filler-{i}" for i in range(count)]
    await create_pods(kube, namespace, [
        _pod(n, pool, gpu=8, priority_class="low-priority", labels=labels) for n in names
    ])
    return names


async def _running(kube: KubeClient, namespace: str, names: list[str]) -> bool:
    pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    return all(n in pods and pods[n]["status"].get("phase") == "Running" for n in names)


async def test_training_operator_gang_with_min_resources_preempts_lower_priority_work(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace):
        fillers = await _fill(kube, namespace, pool, 2)
        await wait_for(lambda: _running(kube, namespace, fillers), timeout=30)
        job = "pytorch-urgent"
        ref = await owner(kube, namespace, job)
        await create_group(kube, XK8S, namespace, job, {
            "minMember": 2, "minResources": {"cpu": "2", "memory": "2Gi", GPU: "16"},
        }, owner=ref)
        await create_pods(kube, namespace, [
            _pod(f"{job}-{rtype}-0", pool, gpu=8, priority_class="high-priority", ref=ref, labels={
                "training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": "0", "scheduling.x-k8s.io/pod-group": job,
            }) for rtype in ("master", "worker")
        ])

        async def whole() -> bool:
            return len(bound(await list_pods(kube, namespace), job)) == 2

        await wait_for(whole, timeout=40)
        names = {p["metadata"]["name"] for p in await list_pods(kube, namespace)}
        assert not names & set(fillers), "the lower-priority work was preempted"


async def test_volcano_group_with_min_resources_is_admitted_when_it_may_preempt(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox.cluster import apply_manifests

    await apply_manifests(kube, [VOLCANO_CRD])
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace, schedulerNames=["batchsched", "volcano"]):
        fillers = await _fill(kube, namespace, pool, 2)
        await wait_for(lambda: _running(kube, namespace, fillers), timeout=30)
        job = "tf-urgent"
        ref = await owner(kube, namespace, job)
        await create_group(kube, VOLCANO, namespace, job, {
            "minMember": 2, "minTaskMember": {"worker": 2}, "queue": "default",
            "priorityClassName": "high-priority", "minResources": {"cpu": "2", GPU: "16"},
        }, owner=ref)

        async def inqueue() -> bool:
            g = await get_group(kube, VOLCANO, namespace, job)
            return (g.get("status") or {}).get("phase") == "Inqueue"

        # the operator creates no pod while the group is Pending: it must be admitted on
        # what it may preempt, not only on what is free
        await wait_for(inqueue, timeout=20)
        await create_pods(kube, namespace, [
            _pod(f"{job}-worker-{i}", pool, gpu=8, priority_class="high-priority", scheduler="volcano", ref=ref,
                 labels={"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "worker",
                         "training.kubeflow.org/replica-index": str(i)},
                 annotations={"scheduling.k8s.io/group-name": job, "volcano.sh/task-spec": "worker"})
            for i in range(2)
        ])

        async def whole() -> bool:
            return len(bound(await list_pods(kube, namespace), job)) == 2

        await wait_for(whole, timeout=40)


async def test_kuberay_gang_with_min_resources_reclaims_its_queues_nominal(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    org, research, prod = f"org-{tag}", f"research-{tag}", f"prod-{tag}"
    await make_nodes(count=2, gpus=8, labels={"pool": tag})
    quota = {"resources": [{"name": GPU, "nominal": 8}]}
    async with queues(kube, (org, {}), (research, {"parent": org, **quota}), (prod, {"parent": org, **quota})), \
            running_scheduler(sandbox, namespace):
        # research borrows prod's idle 8 GPUs: both nodes are its
        fillers = await _fill(kube, namespace, tag, 2, **{"batchsched.io/queue": research})
        await wait_for(lambda: _running(kube, namespace, fillers), timeout=30)
        # a RayCluster of prod: head and one worker, its PodGroup as KubeRay's scheduler-plugins
        # integration writes it (named after the cluster, minMember head + workers)
        cluster = "ray-prod"
        group = cluster
        ref = await owner(kube, namespace, cluster)
        await create_group(kube, XK8S, namespace, group, {
            "minMember": 2, "minResources": {"cpu": "2", "memory": "2Gi", GPU: "8"},
        }, owner=ref)
        labels = {"ray.io/cluster": cluster, "scheduling.x-k8s.io/pod-group": group,
                  "batchsched.io/queue": prod}
        await create_pods(kube, namespace, [
            _pod(f"{cluster}-head", pool=tag, gpu=0, ref=ref, labels={**labels, "ray.io/node-type": "head"}),
            _pod(f"{cluster}-worker-0", pool=tag, gpu=8, ref=ref, labels={**labels, "ray.io/node-type": "worker"}),
        ])

        async def whole() -> bool:
            return len(bound(await list_pods(kube, namespace), cluster)) == 2

        await wait_for(whole, timeout=40)
        left = [p["metadata"]["name"] for p in await list_pods(kube, namespace)
                if p["metadata"]["name"].startswith("filler") and not p["metadata"].get("deletionTimestamp")]
        assert len(left) == 1, "exactly one borrowed node was reclaimed"
