"""Kueue v0.17.0 itself beside batchsched: Kueue admits by quota, batchsched places whole.

Kueue runs out of cluster with its real webhooks (built from
``batchsched/sandbox/gomod/kueue``, see :mod:`batchsched.sandbox.kueue`): its Job webhook
suspends a Job until its Workload is admitted, its pod webhook gates the pods of a plain
pod group, and it lifts either once the group fits its ClusterQueue's quota. Kueue counts
quota, not nodes: an admitted group can still be one node short, which is where
batchsched keeps it whole.

The test namespaces carry :data:`batchsched.sandbox.kueue.NAMESPACE_LABEL`, the one
namespace label Kueue's webhooks and integrations answer to here.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    built,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    started,
    unavailable,
    wait_for,
)

# the first test may build Kueue (about 10 minutes on a fresh 2-core machine) in its fixture
pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(1800)]

GPU = "nvidia.com/gpu"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
GATE = "kueue.x-k8s.io/admission"
LOCAL_QUEUE = "lq"


@pytest.fixture(scope="module")
def kueue(sandbox: Any) -> Iterator[Any]:
    """Kueue, running against the sandbox for this file's tests."""
    from batchsched.sandbox.kueue import Kueue, kueue_binary

    with started(Kueue(sandbox, binary=built(kueue_binary, "Kueue")), "Kueue") as runner:
        yield runner


def kueue_object(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": {"name": name}, "spec": spec}


@pytest.fixture
async def cluster_queue(kube: KubeClient, namespace: str, kueue: Any) -> AsyncIterator[str]:
    """A ClusterQueue of 32 GPUs (and ample CPU and memory) of the test's own, and its
    LocalQueue :data:`LOCAL_QUEUE` in the test's namespace, labelled for Kueue; yields the
    ClusterQueue's name."""
    from batchsched.sandbox.kueue import NAMESPACE_LABEL

    tag = uuid.uuid4().hex[:6]
    await kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {NAMESPACE_LABEL: "true"}}})
    flavor, cluster_queue = f"flavor-{tag}", f"cq-{tag}"
    await kube.create(f"{KUEUE}/resourceflavors", kueue_object("ResourceFlavor", flavor, {}))
    await kube.create(f"{KUEUE}/clusterqueues", kueue_object("ClusterQueue", cluster_queue, {
        "namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", GPU],
            "flavors": [{"name": flavor, "resources": [
                {"name": "cpu", "nominalQuota": "100"}, {"name": "memory", "nominalQuota": "100Gi"},
                {"name": GPU, "nominalQuota": "32"},
            ]}],
        }],
    }))
    await kube.create(f"{KUEUE}/namespaces/{namespace}/localqueues",
                      kueue_object("LocalQueue", LOCAL_QUEUE, {"clusterQueue": cluster_queue}))
    try:
        yield cluster_queue
    finally:
        for path in (f"{KUEUE}/clusterqueues/{cluster_queue}", f"{KUEUE}/resourceflavors/{flavor}"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)


def gang_job(name: str, pods: int, pool: str, *, priority_class: str = "") -> dict[str, Any]:
    """A Job of ``pods`` 8-GPU pods in the LocalQueue, a gang of all of them (``spec.scheduling``)."""
    spec = {**pod_body("x", gpu=8)["spec"], "nodeSelector": {"pool": pool}, "restartPolicy": "Never"}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE}},
        "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed",
                 "scheduling": {"schedulingPolicy": {"gang": {"minCount": pods}}},
                 "template": {"spec": spec}},
    }


def node_names(pods: list[dict[str, Any]], prefix: str) -> list[str]:
    return [p["spec"].get("nodeName", "") for p in pods if p["metadata"]["name"].startswith(prefix)]


async def workload_admitted(kube: KubeClient, namespace: str, owner_name: str) -> bool:
    """Whether Kueue's Workload for the object ``owner_name`` (a Job, or a pod group's
    name) says Admitted."""
    items, _ = await kube.list(f"{KUEUE}/namespaces/{namespace}/workloads")
    for wl in items:
        owners = [o.get("name") for o in wl["metadata"].get("ownerReferences") or []]
        if owner_name in owners or wl["metadata"]["name"] == owner_name:
            return any(c.get("type") == "Admitted" and c.get("status") == "True"
                       for c in (wl.get("status") or {}).get("conditions") or [])
    return False


async def test_kueue_job_is_admitted_by_quota_then_placed_whole(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any, cluster_queue: str,
) -> None:
    """A Job of four 8-GPU pods with a gang policy (``spec.scheduling``, Kubernetes 1.37's
    Workload API for Jobs) in a Kueue LocalQueue: Kueue suspends it, admits it (32 GPUs of
    quota), the Job controller makes its Workload, its PodGroup and its pods, and
    batchsched binds none of them while one of the four nodes is taken, then all four
    when it is freed. (Without ``spec.scheduling`` the Job controller gives the group the
    ``basic`` policy, and its pods are placed as room allows, three of four here.)"""
    tag = uuid.uuid4().hex[:6]
    pool = f"kueue-{tag}"
    nodes = await make_nodes(count=4, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace):
        # a pod outside Kueue (no queue label) takes one of the four nodes
        await create_pods(kube, namespace, [pod_body("blocker", gpu=8, spec={"nodeSelector": {"pool": pool}})])

        async def blocker_bound() -> bool:
            return bool(node_names(await list_pods(kube, namespace), "blocker")[0])

        await wait_for(blocker_bound, timeout=30)
        await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("train", 4, pool))
        created = await kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/train")
        assert created["spec"].get("suspend") is True  # Kueue's webhook suspended it

        async def admitted_and_created() -> list[dict[str, Any]]:
            if not await workload_admitted(kube, namespace, "train"):
                return []
            pods = [p for p in await list_pods(kube, namespace) if p["metadata"]["name"].startswith("train-")]
            return pods if len(pods) == 4 else []

        pods = await wait_for(admitted_and_created, timeout=60)
        # the Job controller made the pods members of one PodGroup of the Workload API
        groups = {(p["spec"].get("schedulingGroup") or {}).get("podGroupName") for p in pods}
        assert len(groups) == 1 and None not in groups, groups
        await asyncio.sleep(4.0)  # several cycles: three nodes are free, the gang needs four
        assert node_names(await list_pods(kube, namespace), "train-") == ["", "", "", ""]

        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/blocker", gracePeriodSeconds=0)

        async def all_bound() -> list[str]:
            placed = node_names(await list_pods(kube, namespace), "train-")
            return placed if len(placed) == 4 and all(placed) else []

        placed = await wait_for(all_bound, timeout=60)
        assert sorted(placed) == sorted(nodes)


def group_pod(name: str, group: str, count: int, *, queue: str, pool: str, seconds: int = 0) -> dict[str, Any]:
    """A pod of Kueue's plain pod group ``group`` of ``count`` members, as a user writes it."""
    annotations = {"kueue.x-k8s.io/pod-group-total-count": str(count)}
    if seconds:
        annotations["batchsched.io/sim-duration"] = f"{seconds}s"
    return pod_body(name, gpu=8, metadata={
        "labels": {"kueue.x-k8s.io/queue-name": queue, "kueue.x-k8s.io/pod-group-name": group},
        "annotations": annotations,
    }, spec={"nodeSelector": {"pool": pool}, "restartPolicy": "Never"})


async def test_kueue_pod_group_beyond_quota_waits_unadmitted_then_is_placed_whole(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any, cluster_queue: str,
) -> None:
    """Two plain pod groups on a 32-GPU ClusterQueue: the first (two 8-GPU pods, ending
    after 15 s) is admitted and bound; the second (four 8-GPU pods) is beyond the quota
    left and stays gated by Kueue, none of it bound; when the first ends, Kueue admits it
    and batchsched binds all four, one to each node."""
    tag = uuid.uuid4().hex[:6]
    pool = f"kueue-{tag}"
    nodes = await make_nodes(count=4, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, [
            group_pod(f"first-{i}", "first", 2, queue=LOCAL_QUEUE, pool=pool, seconds=15) for i in range(2)])

        async def first_bound() -> bool:
            placed = node_names(await list_pods(kube, namespace), "first-")
            return len(placed) == 2 and all(placed)

        await wait_for(first_bound, timeout=60)
        await create_pods(kube, namespace, [
            group_pod(f"second-{i}", "second", 4, queue=LOCAL_QUEUE, pool=pool) for i in range(4)])
        await asyncio.sleep(4.0)
        pods = [p for p in await list_pods(kube, namespace) if p["metadata"]["name"].startswith("second-")]
        assert len(pods) == 4
        # Kueue's webhook gated them and has not admitted them: 16 + 32 GPUs > 32
        assert all(GATE in [g["name"] for g in p["spec"].get("schedulingGates") or []] for p in pods)
        assert not await workload_admitted(kube, namespace, "second")
        assert node_names(pods, "second-") == ["", "", "", ""]

        async def second_bound() -> list[dict[str, Any]]:
            pods = await list_pods(kube, namespace)
            placed = node_names(pods, "second-")
            return pods if len(placed) == 4 and all(placed) else []

        pods = await wait_for(second_bound, timeout=90)
        assert sorted(node_names(pods, "second-")) == sorted(nodes)


async def test_kueue_preempts_its_workload_while_batchsched_preempts_in_its_queue(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any, cluster_queue: str,
) -> None:
    """Four nodes: a low-priority pod of batchsched's Queue ``team`` on one, a low-priority
    Kueue Job of three on the others (24 of the ClusterQueue's 32 GPUs). Then, at once, a
    high-priority Kueue Job of three and a high-priority pod of ``team``: Kueue preempts its
    low Job (suspends it) and admits the high one, which batchsched places whole;
    batchsched evicts its own low pod (and none of Kueue's) for the high one (``team``
    may hold 8 GPUs). Nobody preempts back: the low Job stays suspended, the high pods stay bound, and
    ``team`` is charged its one pod only."""
    from tests.integration.helpers import QUEUES, PodHistory, queues

    tag = uuid.uuid4().hex[:6]
    pool, team = f"kueue-{tag}", f"team-{tag}"
    await make_nodes(count=4, gpus=8, labels={"pool": pool})
    await kube.patch(f"{KUEUE}/clusterqueues/{cluster_queue}",
                     {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}})

    def team_pod(name: str, priority_class: str) -> dict[str, Any]:
        return pod_body(name, gpu=8, metadata={"labels": {"batchsched.io/queue": team}},
                        spec={"nodeSelector": {"pool": pool}, "priorityClassName": priority_class})

    def bound(pods: list[dict[str, Any]], prefix: str, count: int) -> dict[str, str]:
        placed = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods
                  if p["metadata"]["name"].startswith(prefix) and not p["metadata"].get("deletionTimestamp")}
        return placed if len(placed) == count and all(placed.values()) else {}

    async with queues(kube, (team, {"resources": [{"name": GPU, "nominal": 8}]})), \
            PodHistory(kube, namespace) as history, \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        await create_pods(kube, namespace, [team_pod("team-low", "low-priority")])
        await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs",
                          gang_job("low", 3, pool, priority_class="low-priority"))

        async def settled() -> dict[str, str]:
            pods = await list_pods(kube, namespace)
            low, mine = bound(pods, "low-", 3), bound(pods, "team-low", 1)
            return {**low, **mine} if low and mine else {}

        before = await wait_for(settled, timeout=60)
        await kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs",
                          gang_job("high", 3, pool, priority_class="high-priority"))
        await create_pods(kube, namespace, [team_pod("team-high", "high-priority")])

        async def after() -> dict[str, str]:
            pods = await list_pods(kube, namespace)
            high, mine = bound(pods, "high-", 3), bound(pods, "team-high", 1)
            return {**high, **mine} if high and mine else {}

        placed = await wait_for(after, timeout=90)
        # one node each (the high pod may go to the node its eviction freed, or to one of
        # those Kueue's freed first, while the freed one goes to the Job)
        assert len(set(placed.values())) == 4 and set(placed.values()) == set(before.values())
        await asyncio.sleep(5.0)  # no ping-pong: nothing moves back
        assert (await kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/low"))["spec"]["suspend"] is True
        assert not await workload_admitted(kube, namespace, "low")
        assert await after() == placed
        # batchsched evicted its own low pod and no pod of Kueue's
        evicted = {obj["metadata"]["name"] for _, obj in history.events
                   if (history.disruption(obj["metadata"]["uid"]) or {}).get("reason") == "PreemptionByScheduler"}
        assert evicted == {"team-low"}
        status = (await kube.get(f"{QUEUES}/{team}")).get("status") or {}
        assert (status.get("used") or {}).get(GPU) == "8"


async def test_the_readmes_kueue_example_runs_whole(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any, kueue: Any,
) -> None:
    """manifests/examples/kueue-job.yaml, applied with kubectl as the README says: its Job
    is admitted and its four pods bound, one to each of four 8-GPU nodes."""
    import subprocess
    from pathlib import Path

    from batchsched.sandbox import build

    example = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "kueue-job.yaml"
    nodes = await make_nodes(count=4, gpus=8)
    kubectl = [str(build.ensure_binaries().kubectl), f"--kubeconfig={sandbox.kubeconfig}"]
    try:
        async with running_scheduler(sandbox, namespace):
            subprocess.run([*kubectl, "apply", "--server-side", "-f", str(example)], check=True, capture_output=True)

            async def all_bound() -> list[str]:
                placed = node_names(await list_pods(kube, "kueue-demo"), "train-")
                return placed if len(placed) == 4 and all(placed) else []

            assert sorted(await wait_for(all_bound, timeout=90)) == sorted(nodes)
            assert await workload_admitted(kube, "kueue-demo", "train")
    finally:
        subprocess.run([*kubectl, "delete", "--wait=false", "-f", str(example)], capture_output=True)


# -- MultiKueue: a manager cluster dispatches to this one --------------------------------------


@pytest.fixture(scope="module")
def manager(sandbox: Any, kueue: Any) -> Iterator[Any]:
    """A second sandbox, MultiKueue's manager, with Kueue (its pod integration) and no
    nodes: what is submitted there runs here, in the worker."""
    import os

    from batchsched.sandbox.cluster import Sandbox
    from batchsched.sandbox.kueue import Kueue

    box = Sandbox(f"pytest-manager-{os.getpid()}")
    try:
        try:
            state = box.up([])
        except Exception as exc:
            unavailable(f"MultiKueue's manager cluster could not start: {exc}")
        with started(Kueue(state, binary=kueue.binary, frameworks=("pod",)), "Kueue in the manager cluster"):
            yield state
    finally:
        box.down()


async def dispatching_queue(mk: KubeClient, namespace: str, worker_kubeconfig: str) -> None:
    """In the manager: the namespace, a 32-GPU ClusterQueue whose admission check is
    MultiKueue's, its LocalQueue :data:`LOCAL_QUEUE`, and the worker cluster (its kubeconfig in a Secret)."""
    from batchsched.sandbox.kueue import NAMESPACE, NAMESPACE_LABEL

    await mk.create("/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {NAMESPACE_LABEL: "true"}}})
    await mk.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", {
        "metadata": {"name": "worker-kubeconfig"}, "stringData": {"kubeconfig": worker_kubeconfig}})
    await mk.create(f"{KUEUE}/multikueueclusters", kueue_object("MultiKueueCluster", "worker", {
        "clusterSource": {"kubeConfig": {"locationType": "Secret", "location": "worker-kubeconfig"}}}))
    await mk.create(f"{KUEUE}/multikueueconfigs", kueue_object("MultiKueueConfig", "to-worker", {
        "clusters": ["worker"]}))
    await mk.create(f"{KUEUE}/admissionchecks", kueue_object("AdmissionCheck", "dispatch", {
        "controllerName": "kueue.x-k8s.io/multikueue",
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": "to-worker"}}))
    await mk.create(f"{KUEUE}/resourceflavors", kueue_object("ResourceFlavor", "gpu", {}))
    await mk.create(f"{KUEUE}/clusterqueues", kueue_object("ClusterQueue", "dispatching", {
        "namespaceSelector": {},
        "admissionChecksStrategy": {"admissionChecks": [{"name": "dispatch"}]},
        "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": [{"name": "gpu", "resources": [
            {"name": "cpu", "nominalQuota": "100"}, {"name": "memory", "nominalQuota": "100Gi"},
            {"name": GPU, "nominalQuota": "32"}]}]}],
    }))
    await mk.create(f"{KUEUE}/namespaces/{namespace}/localqueues",
                    kueue_object("LocalQueue", LOCAL_QUEUE, {"clusterQueue": "dispatching"}))

    async def active() -> bool:
        for path in (f"{KUEUE}/multikueueclusters/worker", f"{KUEUE}/admissionchecks/dispatch"):
            conditions = ((await mk.get(path)).get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions):
                return False
        return True

    await wait_for(active, timeout=60)


async def test_multikueue_runs_a_pod_group_in_the_worker_whole_within_both_quotas(
    sandbox: Any, kube: KubeClient, namespace: str, make_nodes: Any, cluster_queue: str, manager: Any,
) -> None:
    """A pod group of four 8-GPU pods submitted to the manager is admitted there (32 GPUs),
    created in the worker by MultiKueue, admitted by the worker's Kueue and placed whole by
    batchsched: none bound while one of the worker's four nodes is taken, all four once it
    is free. A second group, beyond the manager's quota, never reaches the worker."""
    from batchsched.sandbox.kueue import embedded_kubeconfig

    tag = uuid.uuid4().hex[:6]
    pool = f"mk-{tag}"
    nodes = await make_nodes(count=4, gpus=8, labels={"pool": pool})
    async with await KubeClient.connect(manager.kubeconfig) as mk, running_scheduler(sandbox, namespace):
        await dispatching_queue(mk, namespace, embedded_kubeconfig(sandbox))
        await create_pods(kube, namespace, [pod_body("blocker", gpu=8, spec={"nodeSelector": {"pool": pool}})])
        await create_pods(mk, namespace, [
            group_pod(f"train-{i}", "train", 4, queue=LOCAL_QUEUE, pool=pool) for i in range(4)])

        async def in_worker() -> list[dict[str, Any]]:
            pods = [p for p in await list_pods(kube, namespace) if p["metadata"]["name"].startswith("train-")]
            return pods if len(pods) == 4 else []

        await wait_for(in_worker, timeout=90)

        async def admitted_in_manager() -> bool:
            return await workload_admitted(mk, namespace, "train")

        # the manager's Workload may show Admitted a moment after MultiKueue created the copy
        assert await wait_for(admitted_in_manager, timeout=30)
        await asyncio.sleep(4.0)  # the worker's Kueue admits it; three nodes are free, it needs four
        assert node_names(await list_pods(kube, namespace), "train-") == ["", "", "", ""]

        async def told() -> list[dict[str, Any]]:
            return [e for e in await events_for(kube, namespace, "train", "FailedScheduling")
                    if e["involvedObject"].get("kind") == "Workload"]

        # why it waits is told on the worker's Workload of the group, where Kueue's users look
        [event] = await wait_for(told, timeout=30)
        assert event["involvedObject"]["apiVersion"].startswith("kueue.x-k8s.io/") and event["involvedObject"]["uid"]
        assert "4 pods" in event["message"], event["message"]

        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/blocker", gracePeriodSeconds=0)

        async def all_bound() -> list[str]:
            placed = node_names(await list_pods(kube, namespace), "train-")
            return placed if len(placed) == 4 and all(placed) else []

        assert sorted(await wait_for(all_bound, timeout=60)) == sorted(nodes)

        # the manager's quota is used up: a second group waits there and is never dispatched
        await create_pods(mk, namespace, [
            group_pod(f"later-{i}", "later", 4, queue=LOCAL_QUEUE, pool=pool) for i in range(4)])
        await asyncio.sleep(5.0)
        assert not await workload_admitted(mk, namespace, "later")
        assert node_names(await list_pods(kube, namespace), "later-") == []
