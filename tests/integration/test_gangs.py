"""Gangs on the real control plane, with objects shaped as the tools that create them.

The training operator (both its scheduler-plugins and its volcano paths) and KubeRay are
not running here: each test creates exactly what they would create (PodGroup first, owner
references, labels, annotations, scheduler names), then checks what batchsched did with it
through the API: ``spec.nodeName``, PodGroup status and Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    VOLCANO,
    VOLCANO_CRD,
    XK8S,
    assert_no_overcommit,
    bound,
    condition,
    create_group,
    create_pods,
    events_for,
    get_group,
    list_pods,
    owner,
    pod_body,
    running_scheduler,
    start_process,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]



def holding(pods: list[dict[str, Any]], prefix: str) -> list[str]:
    """Pods of ``prefix`` bound to a node and not finished."""
    return [
        p["metadata"]["name"] for p in pods
        if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")
        and p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


async def test_training_operator_scheduler_plugins_path_binds_whole_and_reports_running(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    await make_nodes(count=2, gpus=8)
    job = "pytorch-mnist"
    ref = await owner(kube, namespace, job)
    # the operator creates the PodGroup (named after the job, owned by it) ...
    await create_group(kube, XK8S, namespace, job, {
        "minMember": 5, "minResources": {"cpu": "500m", "memory": "640Mi", "nvidia.com/gpu": "10"},
    }, owner=ref)
    # ... and the pods: labelled with the group and the replica, given our scheduler
    bodies = []
    for rtype, index in [("master", 0)] + [("worker", i) for i in range(4)]:
        labels = {
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": rtype,
            "training.kubeflow.org/replica-index": str(index),
            "scheduling.x-k8s.io/pod-group": job,
        }
        if rtype == "master":
            labels["training.kubeflow.org/job-role"] = "master"
        bodies.append(pod_body(f"{job}-{rtype}-{index}", gpu=2,
                               metadata={"labels": labels, "ownerReferences": [ref]}))
    await create_pods(kube, namespace, bodies)
    async with running_scheduler(sandbox, namespace):
        async def whole() -> bool:
            return len(bound(await list_pods(kube, namespace), job)) == 5

        await wait_for(whole, timeout=30)

        async def running() -> dict[str, Any] | None:
            g = await get_group(kube, XK8S, namespace, job)
            st = g.get("status") or {}
            return g if st.get("phase") == "Running" and st.get("running") == 5 else None

        group = await wait_for(running, timeout=30)
        st = group["status"]
        assert (st["succeeded"], st["failed"]) == (0, 0)
        assert st["scheduleStartTime"].endswith("Z")
        cond = condition(group)
        assert (cond["type"], cond["status"], cond["reason"]) == ("PodGroupScheduled", "True", "Scheduled")
        # said to the PodGroup and to the job that owns it (a ConfigMap stands in for it here)
        async def placed() -> list[dict[str, Any]] | None:
            found = await events_for(kube, namespace, job, "Scheduled")
            return found if len(found) == 2 else None

        events = await wait_for(placed, timeout=10)
        assert sorted(e["involvedObject"]["kind"] for e in events) == ["ConfigMap", "PodGroup"]
        assert {e["message"] for e in events} == {"placed 5 members as one gang (quorum 5)"}
        await assert_no_overcommit(kube)


async def test_volcano_path_admits_the_group_first_then_binds_its_pods_whole(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox.cluster import apply_manifests

    await apply_manifests(kube, [VOLCANO_CRD])
    await make_nodes(count=2, gpus=8)
    job = "tf-dist"
    ref = await owner(kube, namespace, job)
    await create_group(kube, VOLCANO, namespace, job, {
        "minMember": 3, "minTaskMember": {"ps": 1, "worker": 2}, "queue": "default",
        "priorityClassName": "high-priority", "minResources": {"cpu": "300m", "nvidia.com/gpu": "6"},
    }, owner=ref)
    # the operator's volcano path gives its pods schedulerName "volcano": batchsched answers to it
    async with running_scheduler(sandbox, namespace, schedulerNames=["batchsched", "volcano"]):
        async def inqueue() -> bool:
            g = await get_group(kube, VOLCANO, namespace, job)
            return (g.get("status") or {}).get("phase") == "Inqueue"

        # the operator waits for the group to leave Pending before it creates any pod
        await wait_for(inqueue, timeout=20)
        bodies = []
        for task, count in (("ps", 1), ("worker", 2)):
            for i in range(count):
                bodies.append(pod_body(f"{job}-{task}-{i}", gpu=2, scheduler="volcano", metadata={
                    "labels": {"training.kubeflow.org/job-name": job,
                               "training.kubeflow.org/replica-type": task,
                               "training.kubeflow.org/replica-index": str(i)},
                    "annotations": {"scheduling.k8s.io/group-name": job, "volcano.sh/task-spec": task},
                    "ownerReferences": [ref],
                }))
        await create_pods(kube, namespace, bodies)

        async def whole() -> bool:
            return len(bound(await list_pods(kube, namespace), job)) == 3

        await wait_for(whole, timeout=30)

        async def running() -> dict[str, Any] | None:
            g = await get_group(kube, VOLCANO, namespace, job)
            st = g.get("status") or {}
            return g if st.get("phase") == "Running" and st.get("running") == 3 else None

        group = await wait_for(running, timeout=30)
        cond = condition(group)
        assert (cond["type"], cond["status"], cond["reason"]) == ("Scheduled", "True", "Scheduled")
        assert group["spec"]["minMember"] == 3  # the status was patched on the object, spec untouched


async def test_kuberay_cluster_binds_whole_under_the_scheduler_plugins_name(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    await make_nodes(count=2, gpus=8)
    cluster = "raycluster-kuberay"
    ref = await owner(kube, namespace, cluster)
    await create_group(kube, XK8S, namespace, cluster, {
        "minMember": 4, "minResources": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "12"},
    }, owner=ref)
    bodies = []
    for node_type, group_name, name in [("head", "headgroup", f"{cluster}-head-x7k2p")] + [
        ("worker", "gpu-group", f"{cluster}-gpu-group-worker-{s}") for s in ("a1b2c", "d3e4f", "g5h6i")
    ]:
        labels = {
            "ray.io/cluster": cluster, "ray.io/node-type": node_type, "ray.io/group": group_name,
            "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator",
            "app.kubernetes.io/name": "kuberay", "scheduling.x-k8s.io/pod-group": cluster,
        }
        bodies.append(pod_body(name, gpu=0 if node_type == "head" else 4, cpu="1", memory="2Gi",
                               scheduler="scheduler-plugins-scheduler",
                               metadata={"labels": labels, "ownerReferences": [ref]}))
    await create_pods(kube, namespace, bodies)
    async with running_scheduler(sandbox, namespace,
                                 schedulerNames=["batchsched", "scheduler-plugins-scheduler"]):
        async def whole() -> bool:
            return len(bound(await list_pods(kube, namespace), cluster)) == 4

        await wait_for(whole, timeout=30)

        async def running() -> bool:
            st = (await get_group(kube, XK8S, namespace, cluster)).get("status") or {}
            return st.get("phase") == "Running" and st.get("running") == 4

        await wait_for(running, timeout=30)


async def test_group_larger_than_the_cluster_stays_pending_and_says_why(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    await make_nodes(count=2, gpus=8)
    await create_group(kube, XK8S, namespace, "huge", {"minMember": 3})
    await create_group(kube, XK8S, namespace, "broken", {"minMember": 0})
    bodies = [pod_body(f"huge-{i}", gpu=8, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "huge"}})
              for i in range(3)]
    bodies.append(pod_body("broken-0", gpu=1, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "broken"}}))
    bodies.append(pod_body("lost-0", gpu=1, metadata={"labels": {"scheduling.x-k8s.io/pod-group": "nowhere"}}))
    # one after the other, as an operator creates a job's members: members are ordered by
    # age before their index, and the message names the first that does not fit
    await create_pods(kube, namespace, bodies, concurrency=1)
    async with running_scheduler(sandbox, namespace):
        async def explained() -> dict[str, Any] | None:
            g = await get_group(kube, XK8S, namespace, "huge")
            return g if condition(g).get("reason") == "Unschedulable" else None

        group = await wait_for(explained, timeout=30)
        cond = condition(group)
        assert group["status"]["phase"] == "Pending"
        assert cond["status"] == "False"
        assert cond["message"] == (
            "gang needs 3 pods (0.3 cpu, 384Mi memory, 24 nvidia.com/gpu) placed together; only 2 fit now. "
            "Member huge-2: 0/2 nodes fit: 2 insufficient nvidia.com/gpu."
        )
        for i in range(3):
            [event] = await wait_for(lambda i=i: events_for(kube, namespace, f"huge-{i}", "FailedScheduling"), timeout=10)
            assert event["message"] == cond["message"]
        [bad] = await wait_for(lambda: events_for(kube, namespace, "broken", "InvalidPodGroup"), timeout=10)
        assert bad["type"] == "Warning" and "spec.minMember must be a positive integer, got 0" in bad["message"]
        [pod_bad] = await wait_for(lambda: events_for(kube, namespace, "broken-0", "FailedScheduling"), timeout=10)
        assert pod_bad["message"].startswith(f"PodGroup {namespace}/broken is invalid")
        broken = await get_group(kube, XK8S, namespace, "broken")
        assert condition(broken)["reason"] == "InvalidPodGroup"
        [lost] = await wait_for(lambda: events_for(kube, namespace, "lost-0", "FailedScheduling"), timeout=10)
        assert lost["message"] == f"waiting for PodGroup {namespace}/nowhere to exist"
        await asyncio.sleep(1)
        assert bound(await list_pods(kube, namespace), "") == []


async def test_two_competing_groups_never_both_hold_part(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    await make_nodes(count=2, gpus=8)
    # each gang needs 12 of the 16 GPUs: they cannot both run
    for name in ("alpha", "beta"):
        await create_group(kube, XK8S, namespace, name, {"minMember": 3})
    bodies = [
        pod_body(f"{name}-{i}", gpu=4, metadata={
            "labels": {"scheduling.x-k8s.io/pod-group": name},
            "annotations": {"batchsched.io/sim-duration": "3s"},
        })
        for i in range(3) for name in ("alpha", "beta")
    ]
    await create_pods(kube, namespace, bodies)
    async with running_scheduler(sandbox, namespace):
        first = ""
        while True:
            pods = await list_pods(kube, namespace)
            a, b = holding(pods, "alpha"), holding(pods, "beta")
            assert not (a and b), f"both gangs hold GPUs: {a} {b}"
            if (a or b) and not first:
                first = "alpha" if a else "beta"
            done = [p for p in pods if p["status"].get("phase") == "Succeeded"]
            if len(done) == 6:
                break
            await asyncio.sleep(0.1)
        second = "beta" if first == "alpha" else "alpha"
        for name in (first, second):
            [ev] = await wait_for(lambda name=name: events_for(kube, namespace, name, "Scheduled"), timeout=10)
            assert ev["message"] == "placed 3 members as one gang (quorum 3)"
        # the second waited whole, with the reason on its group
        waited = await events_for(kube, namespace, f"{second}-0", "FailedScheduling")
        assert waited and waited[0]["message"].startswith("gang needs 3 pods")

        async def finished() -> bool:
            phases = [((await get_group(kube, XK8S, namespace, n)).get("status") or {}).get("phase")
                      for n in ("alpha", "beta")]
            return phases == ["Finished", "Finished"]

        await wait_for(finished, timeout=15)


async def test_a_gang_short_of_its_quorum_is_evicted_when_it_times_out(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, gpus=8)
    await create_group(kube, XK8S, namespace, "short", {"minMember": 3, "scheduleTimeoutSeconds": 2})
    labels = {"scheduling.x-k8s.io/pod-group": "short"}
    await create_pods(kube, namespace, [pod_body(f"short-{i}", gpu=1, metadata={"labels": labels}) for i in range(2)])
    # one member got bound (as by a binding that succeeded while its peers' failed); the
    # third member will never exist, so the quorum cannot be reached
    first = await kube.get(f"/api/v1/namespaces/{namespace}/pods/short-0")
    await kube.create(f"/api/v1/namespaces/{namespace}/pods/short-0/binding", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "short-0", "namespace": namespace, "uid": first["metadata"]["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    })
    async with running_scheduler(sandbox, namespace):
        [incomplete] = await wait_for(lambda: events_for(kube, namespace, "short", "GangIncomplete"), timeout=15)
        assert incomplete["message"] == "1 of 3 required members are placed; retrying the other 2 as one gang"
        [timeout] = await wait_for(lambda: events_for(kube, namespace, "short", "GangTimeout"), timeout=15)
        assert timeout["message"].startswith("only 1 of 3 required members were placed within 2 s")
        [evicted] = await wait_for(lambda: events_for(kube, namespace, "short", "GangEvicted"), timeout=15)
        assert evicted["message"].startswith(f"evicted member short-0 from node {node}")

        async def gone() -> bool:
            try:
                await kube.get(f"/api/v1/namespaces/{namespace}/pods/short-0")
            except NotFoundError:
                return True
            return False

        await wait_for(gone, timeout=15)
        assert bound(await list_pods(kube, namespace), "short") == []

        async def backing_off() -> bool:
            return condition(await get_group(kube, XK8S, namespace, "short")).get("reason") == "GangBackoff"

        await wait_for(backing_off, timeout=10)


async def test_restart_while_binding_a_large_gang_ends_whole_or_empty(
    sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox.cluster import free_port

    size = 300
    await make_nodes(count=20, gpus=16)
    await create_group(kube, XK8S, namespace, "big", {"minMember": size, "scheduleTimeoutSeconds": 20})
    labels = {"scheduling.x-k8s.io/pod-group": "big"}
    await create_pods(kube, namespace, [pod_body(f"big-{i}", gpu=1, metadata={"labels": labels}) for i in range(size)])
    cfg = tmp_path / "batchsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "leaderElection": {"namespace": namespace, "leaseDurationSeconds": 3, "renewDeadlineSeconds": 2,
                           "retryPeriodSeconds": 0.5},
        "metricsAddress": f"127.0.0.1:{free_port()}",
        "binder": {"concurrency": 2},
    }))
    log = tmp_path / "batchsched.log"
    _, rv = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
    first = start_process(sandbox, cfg, log)
    try:
        seen: set[str] = set()
        async for _, obj in kube.watch(f"/api/v1/namespaces/{namespace}/pods", rv, timeout_seconds=60):
            if obj.get("spec", {}).get("nodeName"):
                seen.add(obj["metadata"]["name"])
            if len(seen) >= 20:
                break
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    pods = await list_pods(kube, namespace)
    at_kill = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
    assert 0 < len(at_kill) < size, f"the kill should land mid-binding ({len(at_kill)} bound)"
    second = start_process(sandbox, cfg, log)
    try:
        async def settled() -> int | None:
            n = len(bound(await list_pods(kube, namespace), "big"))
            return n if n in (0, size) else None

        await wait_for(settled, timeout=90, interval=0.5)
        pods = await list_pods(kube, namespace)
        # whole: it fits, so the remainder was completed (never evicted and started over)
        assert len(bound(pods, "big")) == size, log.read_text()[-3000:]
        for p in pods:
            if p["metadata"]["name"] in at_kill:
                assert p["spec"]["nodeName"] == at_kill[p["metadata"]["name"]]
        await assert_no_overcommit(kube)
        # the restarted scheduler found the gang partly bound and completed it as one gang
        [incomplete] = await wait_for(lambda: events_for(kube, namespace, "big", "GangIncomplete"), timeout=10)
        found = int(incomplete["message"].split(" ", 1)[0])
        assert len(at_kill) <= found < size, incomplete["message"]  # bindings in flight may land late
        scheduled = {e["message"] for e in await events_for(kube, namespace, "big", "Scheduled")}
        assert scheduled == {f"placed {size} members as one gang (quorum {size})",  # the first process
                             f"placed {size - found} members as one gang (quorum {size})"}  # the second
        assert not await events_for(kube, namespace, "big", "GangTimeout")
        print(f"bound at kill: {len(at_kill)}; found by the restarted scheduler: {found}")
    finally:
        second.send_signal(signal.SIGTERM)
        with contextlib.suppress(Exception):
            second.wait(timeout=30)
