"""RayClusters through the real KubeRay operator.

The operator (v1.5.0, built from ``batchsched/sandbox/gomod/kuberay`` and run out of
cluster with ``--batch-scheduler=scheduler-plugins``, see :mod:`batchsched.sandbox.kuberay`)
names ``scheduler-plugins-scheduler`` on every pod it makes, which batchsched is configured
to claim here, and makes a scheduler-plugins PodGroup only for a RayCluster labelled
``ray.io/gang-scheduling-enabled``: ``minMember`` = the head + the workers' replicas at
creation, never updated, so workers the autoscaler adds later are members beyond the
quorum. A RayCluster without the label gets no PodGroup, and batchsched says so.

The clusters are the example ``manifests/examples/raycluster-gang.yaml`` (a head of 2 CPUs
and two workers of 8 GPUs), renamed, pinned to the test's own kwok nodes (96 CPUs, 8 GPUs
each) by a node selector, and, for the tests that need it, changed the way a user would.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsched.core import explain
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    XK8S,
    PodHistory,
    assert_no_overcommit,
    built,
    condition,
    events_for,
    get_group,
    list_pods,
    running_scheduler,
    started,
    wait_for,
)

# the first test here may build the operator (a few minutes on a fresh machine), inside
# its fixture, which pytest-timeout counts as part of that test
pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).parents[2] / "manifests" / "examples" / "raycluster-gang.yaml"
RAYCLUSTERS = "/apis/ray.io/v1/namespaces/{namespace}/rayclusters"
SCHEDULER_NAME = "scheduler-plugins-scheduler"
SCHEDULERS = ["batchsched", SCHEDULER_NAME]
CLUSTER_LABEL = "ray.io/cluster"
TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
GANG_LABEL = "ray.io/gang-scheduling-enabled"


@pytest.fixture(scope="session")
def kuberay_binary() -> Any:
    """The operator's binary, built once from its pinned module (a few minutes the first
    time on a machine, cached after)."""
    from batchsched.sandbox.kuberay import operator_binary

    return built(operator_binary, "the KubeRay operator")


@pytest.fixture(scope="module")
def kuberay(sandbox: Any, kuberay_binary: Any) -> Iterator[Any]:
    """The operator, running against the sandbox for this file's tests."""
    from batchsched.sandbox.kuberay import KubeRayOperator

    begun = time.monotonic()
    with started(KubeRayOperator(sandbox, binary=kuberay_binary), "the KubeRay operator") as operator:
        print(f"\nKubeRay operator ready in {time.monotonic() - begun:.1f} s")
        yield operator


@pytest.fixture(autouse=True)
def _timed(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"\n{request.node.name}: {time.monotonic() - started:.1f} s")


def raycluster(name: str, *, pool: str, gang: bool = True, replicas: int | None = None,
               min_replicas: int | None = None, max_replicas: int | None = None) -> dict[str, Any]:
    """The example RayCluster, named ``name`` and pinned to the nodes of ``pool``; without
    the gang label when not ``gang``; its worker group's counts changed where given."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["name"] = name
    if not gang:
        del body["metadata"]["labels"][GANG_LABEL]
    spec = body["spec"]
    for template in [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]:
        template["spec"]["nodeSelector"] = {"pool": pool}
    [workers] = spec["workerGroupSpecs"]
    for key, value in (("replicas", replicas), ("minReplicas", min_replicas), ("maxReplicas", max_replicas)):
        if value is not None:
            workers[key] = value
    return body


async def create_cluster(kube: KubeClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return await kube.create(RAYCLUSTERS.format(namespace=namespace), body)


def members(pods: list[dict[str, Any]], cluster: str) -> list[dict[str, Any]]:
    """The pods of ``cluster`` not being deleted."""
    return [p for p in pods if p["metadata"].get("labels", {}).get(CLUSTER_LABEL) == cluster
            and not p["metadata"].get("deletionTimestamp")]


def placed(pods: list[dict[str, Any]], cluster: str) -> list[dict[str, Any]]:
    return [p for p in members(pods, cluster) if p["spec"].get("nodeName")]


def holding(pods: list[dict[str, Any]], cluster: str) -> list[dict[str, Any]]:
    """The pods of ``cluster`` bound to a node, those being deleted included."""
    return [p for p in pods if p["metadata"].get("labels", {}).get(CLUSTER_LABEL) == cluster
            and p["spec"].get("nodeName")]


async def whole(kube: KubeClient, namespace: str, cluster: str, size: int) -> list[dict[str, Any]] | None:
    """The ``size`` pods of ``cluster`` once all exist and are bound, else None."""
    pods = members(await list_pods(kube, namespace), cluster)
    return pods if len(pods) == size and all(p["spec"].get("nodeName") for p in pods) else None


def _where(pods: list[dict[str, Any]]) -> str:
    return ", ".join(sorted(f"{p['metadata']['name']}@{p['spec'].get('nodeName') or '-'}" for p in pods))


def scheduled_false(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or []
                 if (c.get("type"), c.get("status")) == ("PodScheduled", "False")), None)


async def test_two_gang_rayclusters_that_cannot_both_fit_run_one_after_the_other_whole(
    sandbox, kuberay, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    # 24 GPUs: room for one cluster's two 8-GPU workers, and for the other's head and one
    # worker, which a scheduler placing pods one by one would take
    await make_nodes(count=3, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace, schedulerNames=SCHEDULERS), \
            PodHistory(kube, namespace) as history:
        started = time.monotonic()
        await create_cluster(kube, namespace, raycluster("ray-a", pool=pool))
        first = await wait_for(lambda: whole(kube, namespace, "ray-a", 3), timeout=60)
        print(f"\nray-a made and bound whole in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        await create_cluster(kube, namespace, raycluster("ray-b", pool=pool))

        async def b_waits() -> list[dict[str, Any]] | None:
            pods = members(await list_pods(kube, namespace), "ray-b")
            told = [p for p in pods if (c := scheduled_false(p)) and c.get("message")]
            return pods if len(pods) == 3 and len(told) == 3 else None

        waiting = await wait_for(b_waits, timeout=60)
        print(f"ray-b made and its 3 pods told why they wait in {time.monotonic() - started:.1f} s")
        # KubeRay made the PodGroups (the example's head and two workers), and the pods it
        # made name the PodGroup and the scheduler
        group = await get_group(kube, XK8S, namespace, "ray-b")
        assert group["spec"] == {"minMember": 3, "minResources": {"cpu": "18", "memory": "136Gi",
                                                                  "nvidia.com/gpu": "16"}}
        assert group["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
        for pod in [*first, *waiting]:
            assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
            assert pod["metadata"]["labels"][GROUP_LABEL] == pod["metadata"]["labels"][CLUSTER_LABEL]
        assert not placed(waiting, "ray-b"), _where(waiting)
        assert condition(group)["status"] == "False", condition(group)
        # ray-a goes: ray-b is placed, whole
        started = time.monotonic()
        await kube.delete(f"{RAYCLUSTERS.format(namespace=namespace)}/ray-a")
        # its pods go with it, through the garbage collector; that learns of a CRD only at
        # its resource sync, every 30 s, and the RayCluster CRD is seconds old: they are
        # deleted here as it would delete them
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{CLUSTER_LABEL}=ray-a")
        await wait_for(lambda: whole(kube, namespace, "ray-b", 3), timeout=60)
        print(f"ray-a deleted, ray-b bound whole in {time.monotonic() - started:.1f} s")
        await assert_no_overcommit(kube)
    # one after the other: at no change seen did both clusters hold a node (their pods
    # being deleted included: they hold theirs until they are gone)
    for pods in history.states():
        assert not (holding(pods, "ray-a") and holding(pods, "ray-b")), _where(pods)
    # (said of the PodGroup, and of the RayCluster that owns it, which bears the same name)
    scheduled = await wait_for(lambda: events_for(kube, namespace, "ray-b", "Scheduled"), timeout=10)
    assert {e["message"] for e in scheduled} == {"placed 3 members as one gang (quorum 3)"}, scheduled


async def test_workers_the_autoscaler_adds_are_placed_beyond_the_quorum_when_there_is_room(
    sandbox, kuberay, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    # one worker at creation, up to three: KubeRay's PodGroup asks for the head and one worker
    body = raycluster("ray-auto", pool=pool, replicas=1, min_replicas=1, max_replicas=3)
    async with running_scheduler(sandbox, namespace, schedulerNames=SCHEDULERS):
        await create_cluster(kube, namespace, body)
        quorum = await wait_for(lambda: whole(kube, namespace, "ray-auto", 2), timeout=60)
        group = await get_group(kube, XK8S, namespace, "ray-auto")
        assert group["spec"]["minMember"] == 2
        # the Ray autoscaler asks for two more workers: room for one of them
        await kube.patch(f"{RAYCLUSTERS.format(namespace=namespace)}/ray-auto",
                         {"spec": {"workerGroupSpecs": [{**body["spec"]["workerGroupSpecs"][0], "replicas": 3}]}})

        async def one_extra_waits() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
            pods = members(await list_pods(kube, namespace), "ray-auto")
            pending = [p for p in pods if not p["spec"].get("nodeName")]
            if len(pods) != 4 or len(pending) != 1:
                return None
            told = scheduled_false(pending[0])
            return (pods, told) if told and told.get("message") else None

        pods, told = await wait_for(one_extra_waits, timeout=60)
        assert told["message"].startswith("elastic member beyond the gang's quorum: "), told["message"]
        # the quorum stayed where it was, and the gang is still placed
        assert {p["metadata"]["uid"] for p in quorum} <= {p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName")}
        group = await get_group(kube, XK8S, namespace, "ray-auto")
        assert condition(group)["status"] == "True", condition(group)
        assert group["spec"]["minMember"] == 2  # KubeRay never updates it
        # room appears: the last worker is placed
        await make_nodes(count=1, gpus=8, labels={"pool": pool})
        await wait_for(lambda: whole(kube, namespace, "ray-auto", 4), timeout=60)
        await assert_no_overcommit(kube)


async def test_a_raycluster_without_the_gang_label_is_told_it_is_placed_pod_by_pod(
    sandbox, kuberay, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    # a head and three 8-GPU workers on 16 GPUs: placed one by one, it runs partly placed
    body = raycluster("ray-plain", pool=pool, gang=False, replicas=3, min_replicas=3, max_replicas=3)
    note = explain.ray_pod_by_pod(f"{namespace}/ray-plain")
    async with running_scheduler(sandbox, namespace, schedulerNames=SCHEDULERS):
        cluster = await create_cluster(kube, namespace, body)

        async def partly() -> list[dict[str, Any]] | None:
            pods = members(await list_pods(kube, namespace), "ray-plain")
            pending = [p for p in pods if not p["spec"].get("nodeName")]
            told = [p for p in pending if (c := scheduled_false(p)) and c.get("message")]
            return pods if len(pods) == 4 and len(pending) == 1 and told else None

        pods = await wait_for(partly, timeout=60)
        # KubeRay made no PodGroup, yet its pods name the scheduler batchsched claims
        with pytest.raises(NotFoundError):
            await kube.get(f"/apis/{XK8S}/v1alpha1/namespaces/{namespace}/podgroups/ray-plain")
        assert {p["spec"]["schedulerName"] for p in pods} == {SCHEDULER_NAME}
        assert not any(GROUP_LABEL in p["metadata"]["labels"] for p in pods)
        # the waiting worker's condition says why it waits, and that the cluster has no PodGroup
        [waiting] = [p for p in pods if not p["spec"].get("nodeName")]
        message = scheduled_false(waiting)["message"]  # type: ignore[index]
        assert message.endswith(note), message
        # every pod, and the RayCluster (where `kubectl describe raycluster` shows it), is told once
        for pod in pods:
            [ev] = await wait_for(lambda pod=pod: events_for(kube, namespace, pod["metadata"]["name"], "NoPodGroup"),
                                  timeout=15)
            assert (ev["type"], ev["message"], ev["involvedObject"]["uid"]) == ("Warning", note, pod["metadata"]["uid"])
        [ev] = await wait_for(lambda: events_for(kube, namespace, "ray-plain", "NoPodGroup"), timeout=15)
        assert ev["type"] == "Warning" and ev["message"] == note
        assert {k: ev["involvedObject"][k] for k in ("kind", "apiVersion", "name", "uid")} == {
            "kind": "RayCluster", "apiVersion": "ray.io/v1", "name": "ray-plain", "uid": cluster["metadata"]["uid"]}
