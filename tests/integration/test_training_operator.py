"""Gangs, priority preemption and queues through real PyTorchJobs.

The other gang tests create what the Kubeflow training operator would create, shaped by
hand. Here the operator itself (v1.8.1, built from ``batchsched/sandbox/gomod/training-operator``
and run out of cluster with ``--gang-scheduler-name=batchsched``, see
:mod:`batchsched.sandbox.operators`) turns PyTorchJobs into a scheduler-plugins PodGroup
(``minMember`` = every replica, ``minResources`` summed from the templates) and pods it
creates one at a time, and creates again when batchsched evicts them. What the operator
does not pass on is given where a user of batchsched gives it: the queue as the label
``batchsched.io/queue`` and the priority as ``priorityClassName``, both in the replica
templates (the operator copies neither ``schedulingPolicy.queue`` nor
``schedulingPolicy.priorityClass`` into a scheduler-plugins PodGroup).

Every pod is pinned to the test's own nodes by a node selector; kwok ends a pod annotated
``batchsched.io/sim-duration`` that long after it started, and deletes an evicted pod at
once, so the tests read what happened from a watch of the namespace's pods started before
it happened (:class:`PodHistory`): every version of every pod, in the apiserver's order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    QUEUES,
    XK8S,
    PodHistory,
    assert_no_overcommit,
    built,
    condition,
    describe,
    events_for,
    get_group,
    list_pods,
    queues,
    running_scheduler,
    started,
    wait_for,
)

# the first test here may build the operator (a few minutes on a fresh machine), inside
# its fixture, which pytest-timeout counts as part of that test
pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(1200)]

GPU = "nvidia.com/gpu"
PYTORCHJOBS = "/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs"
JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/replica-type"


@pytest.fixture(scope="session")
def training_operator_binary() -> Any:
    """The operator's binary, built once from its pinned module (a few minutes the first
    time on a machine, cached after)."""
    from batchsched.sandbox.operators import operator_binary

    return built(operator_binary, "the Kubeflow training operator")


@pytest.fixture(scope="module")
def training_operator(sandbox: Any, training_operator_binary: Any) -> Iterator[Any]:
    """The operator, running against the sandbox for this file's tests."""
    from batchsched.sandbox.operators import TrainingOperator

    with started(TrainingOperator(sandbox, binary=training_operator_binary),
                 "the Kubeflow training operator") as operator:
        yield operator


def pytorchjob(name: str, *, pool: str, workers: int, gpus: int = 8, priority_class: str = "",
               queue: str = "", master_seconds: int = 0, worker_seconds: int = 0) -> dict[str, Any]:
    """A PyTorchJob of one master and ``workers`` workers, each asking ``gpus`` GPUs; a
    replica with ``*_seconds`` ends that long after it starts, else it runs on."""

    def template(seconds: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "schedulerName": "batchsched",
            "nodeSelector": {"pool": pool},
            "containers": [{
                "name": "pytorch", "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
                "command": ["torchrun", "train.py"],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi", GPU: str(gpus)},
                              "limits": {GPU: str(gpus)}},
            }],
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        meta: dict[str, Any] = {}
        if queue:
            meta["labels"] = {"batchsched.io/queue": queue}
        if seconds:
            meta["annotations"] = {"batchsched.io/sim-duration": f"{seconds}s"}
        return {"metadata": meta, "spec": spec}

    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template(master_seconds)},
            "Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": template(worker_seconds)},
        }},
    }


async def create_job(kube: KubeClient, namespace: str, body: dict[str, Any]) -> None:
    await kube.create(PYTORCHJOBS.format(namespace=namespace), body)


async def job_condition(kube: KubeClient, namespace: str, name: str, kind: str) -> bool:
    """Whether the PyTorchJob has condition ``kind`` (Running, Succeeded...) True."""
    job = await kube.get(f"{PYTORCHJOBS.format(namespace=namespace)}/{name}")
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def live(pods: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    """The pods of ``job`` not being deleted."""
    return [p for p in pods if p["metadata"].get("labels", {}).get(JOB_LABEL) == job
            and not p["metadata"].get("deletionTimestamp")]


def finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def holding(pods: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    """The pods of ``job`` bound to a node and not finished: those holding GPUs."""
    return [p for p in live(pods, job) if p["spec"].get("nodeName") and not finished(p)]


async def whole(kube: KubeClient, namespace: str, job: str, size: int) -> list[dict[str, Any]] | None:
    """The ``size`` pods of ``job`` once all are bound, on as many nodes, else None."""
    pods = [p for p in live(await list_pods(kube, namespace), job) if p["spec"].get("nodeName")]
    if len(pods) != size:
        return None
    assert len({p["spec"]["nodeName"] for p in pods}) == size, "two members of a gang on one node"
    return pods


async def test_two_pytorchjobs_that_each_need_every_gpu_run_one_after_the_other_whole(
    sandbox, training_operator, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=4, gpus=8, labels={"pool": pool})
    # each job: a master and three workers of 8 GPUs, all 32 GPUs of the pool; the workers
    # end first, so for a while 24 GPUs are free while the master still runs: room for
    # three of the other job's four pods, which a scheduler placing pods one by one would take
    jobs = ("llama-a", "llama-b")
    async with running_scheduler(sandbox, namespace), PodHistory(kube, namespace) as history:
        for name in jobs:
            await create_job(kube, namespace, pytorchjob(name, pool=pool, workers=3,
                                                         master_seconds=12, worker_seconds=4))
        for name in jobs:
            await wait_for(lambda name=name: job_condition(kube, namespace, name, "Succeeded"), timeout=120)

        async def seen_ending() -> list[dict[str, Any]] | None:
            *_, last = history.states()
            ended = [p for name in jobs for p in live(last, name) if p["status"].get("phase") == "Succeeded"]
            return last if len(ended) == 8 else None

        final = await wait_for(seen_ending, timeout=30)
        bound_at: dict[str, int] = {}
        windows = 0
        for step, pods in enumerate(history.states()):
            held = {name: holding(pods, name) for name in jobs}
            # one after the other: never both holding GPUs
            assert not all(held.values()), f"both jobs hold GPUs at once: {_where(pods)}"
            for name in jobs:
                bound = [p for p in live(pods, name) if p["spec"].get("nodeName")]
                if bound and name not in bound_at:
                    bound_at[name] = step
                other = jobs[1 - jobs.index(name)]
                masters = [p for p in held[name] if p["metadata"]["labels"][ROLE_LABEL] == "master"]
                waiting = [p for p in live(pods, other) if not p["spec"].get("nodeName")]
                if masters and len(held[name]) == 1 and waiting:
                    # its workers are done, its master runs: 24 GPUs free, and the other
                    # job's pods wait; they must go on waiting, whole
                    windows += 1
                    assert not held[other], f"{other} was placed in part while {name}'s master ran: {_where(pods)}"
        assert sorted(bound_at) == sorted(jobs)
        assert windows, "no moment with a master running alone was seen: the test proves nothing"
        # each ran on the four nodes, one pod per node, and ended there
        for name in jobs:
            ran = [p for p in live(final, name) if p["spec"].get("nodeName")]
            assert len(ran) == 4 and len({p["spec"]["nodeName"] for p in ran}) == 4, _where(final)
        # the operator made one PodGroup per job, for all four replicas, and batchsched said
        # it placed the four as one gang
        for name in jobs:
            [ev] = await wait_for(lambda name=name: of_kind(events_for(kube, namespace, name, "Scheduled"), "PodGroup"),
                                  timeout=10)
            assert ev["message"] == "placed 4 members as one gang (quorum 4)"


async def of_kind(events: Awaitable[list[dict[str, Any]]], kind: str) -> list[dict[str, Any]]:
    """The ``events`` about an object of ``kind`` (a job and its PodGroup share a name)."""
    return [e for e in await events if e["involvedObject"]["kind"] == kind]


async def test_a_pytorchjob_that_cannot_fit_is_told_why_then_that_it_was_placed(
    sandbox, training_operator, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    started = time.perf_counter()
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace):
        # a master and a worker of 8 GPUs each: one node of 8 GPUs holds only one of them
        await create_job(kube, namespace, pytorchjob("gpt", pool=pool, workers=1))
        job = await kube.get(f"{PYTORCHJOBS.format(namespace=namespace)}/gpt")
        [waiting] = await wait_for(lambda: of_kind(events_for(kube, namespace, "gpt", "FailedScheduling"), "PyTorchJob"),
                                   timeout=60)
        assert waiting["type"] == "Warning"
        assert waiting["involvedObject"] == {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "gpt",
                                             "namespace": namespace, "uid": job["metadata"]["uid"]}
        # (the operator gives the PodGroup minResources: every replica's requests summed)
        assert waiting["message"].startswith(
            f"gang {namespace}/gpt needs minResources the cluster does not have free: 16 {GPU} (free: "
        ), waiting["message"]
        # what the PodGroup's condition says, and what its user reads of the job
        assert waiting["message"] == condition(await get_group(kube, XK8S, namespace, "gpt"))["message"]
        shown = await describe(sandbox, namespace, "pytorchjob", "gpt")
        assert "FailedScheduling" in shown and "needs minResources the cluster does not have free" in shown, shown
        # told once, though the gang is tried again while it waits
        await asyncio.sleep(3)
        assert len(await of_kind(events_for(kube, namespace, "gpt", "FailedScheduling"), "PyTorchJob")) == 1
        assert not [p for p in live(await list_pods(kube, namespace), "gpt") if p["spec"].get("nodeName")]

        # a second node: the job fits, and is told it was placed, as one gang
        await make_nodes(count=1, gpus=8, labels={"pool": pool})
        await wait_for(lambda: whole(kube, namespace, "gpt", 2), timeout=60)
        [placed] = await wait_for(lambda: of_kind(events_for(kube, namespace, "gpt", "Scheduled"), "PyTorchJob"),
                                  timeout=30)
        assert placed["involvedObject"]["uid"] == job["metadata"]["uid"]
        assert placed["message"] == "placed 2 members as one gang (quorum 2)"
        assert "placed 2 members as one gang (quorum 2)" in await describe(sandbox, namespace, "pytorchjob", "gpt")
    print(f"\nPyTorchJob Events: {time.perf_counter() - started:.1f} s")


def _where(pods: list[dict[str, Any]]) -> str:
    return ", ".join(sorted(
        f"{p['metadata']['name']}@{p['spec'].get('nodeName') or '-'}:{(p.get('status') or {}).get('phase')}"
        for p in pods
    ))


async def test_a_high_priority_pytorchjob_preempts_a_running_low_priority_one_whole(
    sandbox, training_operator, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=4, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace):
        await create_job(kube, namespace, pytorchjob("pretrain", pool=pool, workers=3, priority_class="low-priority"))
        victims = await wait_for(lambda: whole(kube, namespace, "pretrain", 4), timeout=60)
        await wait_for(lambda: job_condition(kube, namespace, "pretrain", "Running"), timeout=30)
        async with PodHistory(kube, namespace) as history:
            await create_job(kube, namespace, pytorchjob("urgent", pool=pool, workers=3, priority_class="high-priority"))
            await wait_for(lambda: whole(kube, namespace, "urgent", 4), timeout=90)
            await wait_for(lambda: job_condition(kube, namespace, "urgent", "Running"), timeout=30)
            # every one of the low-priority job's pods was evicted, told why, and is gone
            for pod in victims:
                uid = pod["metadata"]["uid"]
                cond = await wait_for(lambda uid=uid: _is(history.disruption(uid)), timeout=15)
                assert (cond["status"], cond["reason"]) == ("True", "PreemptionByScheduler")
                assert cond["message"].startswith(
                    f"Preempted by {namespace}/urgent (priority 10) to make room on node(s) "
                ), cond["message"]
                assert cond["message"].endswith(": its priority -1 is lower"), cond["message"]
                await wait_for(lambda uid=uid: _is(history.deleted(uid)), timeout=15)
            # never partial: once the urgent job held anything, the other held nothing
            for pods in history.states():
                assert not (holding(pods, "urgent") and holding(pods, "pretrain")), _where(pods)

        [ev] = await wait_for(lambda: events_for(kube, namespace, "pretrain", "Preempted"), timeout=10)
        assert ev["involvedObject"]["kind"] == "PodGroup"
        [preempting] = await wait_for(lambda: events_for(kube, namespace, "urgent", "Preempting"), timeout=10)
        assert preempting["involvedObject"]["kind"] == "PodGroup"
        assert preempting["message"].startswith(
            f"preempting 4 pod(s) of {namespace}/pretrain to place its 4 pod(s) on node(s) "
        ), preempting["message"]
        # the operator creates the evicted pods again; they wait, whole, told why (short of
        # their minResources, they hold the nodes they wait for, as any gang at the head)
        short = (f"gang {namespace}/pretrain needs minResources the cluster does not have free: "
                 f"32 {GPU} (free: 0); holds a reservation on node(s) ")

        def waiting(c: dict[str, Any]) -> bool:
            return c.get("reason") == "Reserved" and str(c.get("message", "")).startswith(short)

        async def replaced_and_waiting() -> list[dict[str, Any]] | None:
            pods = live(await list_pods(kube, namespace), "pretrain")
            fresh = [p for p in pods if p["metadata"]["uid"] not in {v["metadata"]["uid"] for v in victims}]
            told = [p for p in fresh if any(
                (c.get("type"), c.get("status")) == ("PodScheduled", "False") and waiting(c)
                for c in (p.get("status") or {}).get("conditions") or [])]
            return fresh if len(fresh) == 4 and len(told) == 4 else None

        fresh = await wait_for(replaced_and_waiting, timeout=60)
        assert not [p for p in fresh if p["spec"].get("nodeName")]
        group = await get_group(kube, XK8S, namespace, "pretrain")
        assert group["status"]["phase"] == "Pending" and group["status"]["running"] == 0
        assert waiting(condition(group)), condition(group)
        # the PodGroup as the operator writes it: every replica, the templates' requests summed
        urgent = await get_group(kube, XK8S, namespace, "urgent")
        assert urgent["spec"] == {"minMember": 4, "minResources": {"cpu": "4", "memory": "4Gi", GPU: "32"}}
        assert urgent["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
        # its status follows its pods through the status writer, which coalesces writes

        async def urgent_running() -> bool:
            st = (await get_group(kube, XK8S, namespace, "urgent")).get("status") or {}
            return (st.get("phase"), st.get("running")) == ("Running", 4)

        await wait_for(urgent_running, timeout=30)
        await asyncio.sleep(2)
        assert not [p for p in live(await list_pods(kube, namespace), "pretrain") if p["spec"].get("nodeName")]
        await assert_no_overcommit(kube)
        # the urgent job is suspended (the operator deletes its pods): the preempted one runs
        # again, whole
        await kube.patch(f"{PYTORCHJOBS.format(namespace=namespace)}/urgent", {"spec": {"runPolicy": {"suspend": True}}})
        await wait_for(lambda: job_condition(kube, namespace, "urgent", "Suspended"), timeout=30)
        again = await wait_for(lambda: whole(kube, namespace, "pretrain", 4), timeout=90)
        assert {p["metadata"]["uid"] for p in again} == {p["metadata"]["uid"] for p in fresh}
        await assert_no_overcommit(kube)


async def test_pytorchjobs_in_two_queues_each_within_its_quota(
    sandbox, training_operator, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    vision, speech = f"vision-{tag}", f"speech-{tag}"
    await make_nodes(count=4, gpus=8, labels={"pool": tag})
    quota = {vision: 16, speech: 8}
    async with queues(kube, *((name, {"resources": [{"name": GPU, "nominal": n}]}) for name, n in quota.items())), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        # 16 GPUs each; the cluster has 32, but speech may use only 8
        await create_job(kube, namespace, pytorchjob("resnet", pool=tag, workers=1, queue=vision))
        await create_job(kube, namespace, pytorchjob("whisper", pool=tag, workers=1, queue=speech))
        await wait_for(lambda: whole(kube, namespace, "resnet", 2), timeout=60)

        async def waiting_message() -> str | None:
            group = await get_group(kube, XK8S, namespace, "whisper")
            conds = (group.get("status") or {}).get("conditions") or []
            # (until the operator has created both pods, the group waits for them instead)
            return next((c["message"] for c in conds
                         if c.get("status") == "False" and c.get("message", "").startswith("queue ")), None)

        message = await wait_for(waiting_message, timeout=30)
        quota_reason = f"queue {speech}: needs 16 {GPU}; nominal 8, in use 0, may borrow 0 (no cohort)"
        assert message == quota_reason

        async def pods_told() -> list[dict[str, Any]] | None:
            pods = live(await list_pods(kube, namespace), "whisper")
            told = [p for p in pods if any(
                (c.get("type"), c.get("status"), c.get("message")) == ("PodScheduled", "False", quota_reason)
                for c in (p.get("status") or {}).get("conditions") or [])]
            return pods if len(told) == 2 else None

        pods = await wait_for(pods_told, timeout=30)
        assert not [p for p in pods if p["spec"].get("nodeName")]

        async def used(name: str, gpus: str) -> bool:
            st = (await kube.get(f"{QUEUES}/{name}")).get("status") or {}
            return bool(st.get("used") == {GPU: gpus})

        await wait_for(lambda: used(vision, "16"), timeout=15)
        await wait_for(lambda: used(speech, "0"), timeout=15)
        # speech's quota is raised to what its job asks: it runs, whole
        await kube.patch(f"{QUEUES}/{speech}", {"spec": {"resources": [{"name": GPU, "nominal": 16}]}})
        await wait_for(lambda: whole(kube, namespace, "whisper", 2), timeout=60)
        await wait_for(lambda: used(speech, "16"), timeout=15)
        await assert_no_overcommit(kube)


async def _is(value: Any) -> Any:
    return value


async def test_a_pytorchjob_that_restarts_whole_restarts_every_replica_when_one_fails(
    sandbox, training_operator, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=4, gpus=8, labels={"pool": pool})
    # the operator copies the job's annotations onto the PodGroup it creates; with the
    # ExitCode restart policy it deletes a replica that failed with a retryable code and
    # creates it again at once
    body = pytorchjob("finetune", pool=pool, workers=2)
    body["metadata"]["annotations"] = {"batchsched.io/whole-job-restart": "true"}
    for replica in body["spec"]["pytorchReplicaSpecs"].values():
        replica["restartPolicy"] = "ExitCode"
    async with running_scheduler(sandbox, namespace):
        await create_job(kube, namespace, body)
        first = await wait_for(lambda: whole(kube, namespace, "finetune", 3), timeout=60)
        group = await get_group(kube, XK8S, namespace, "finetune")
        assert group["metadata"]["annotations"] == {"batchsched.io/whole-job-restart": "true"}
        # a worker's trainer is killed (exit code 137, as the kubelet reports it)
        [crashed] = [p for p in first if p["metadata"]["name"] == "finetune-worker-0"]
        crashed["status"]["phase"] = "Failed"
        crashed["status"]["containerStatuses"] = [{
            "name": "pytorch", "image": "pytorch", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "Error",
                                     "startedAt": crashed["status"]["startTime"],
                                     "finishedAt": crashed["status"]["startTime"]}},
        }]
        await kube.replace(f"/api/v1/namespaces/{namespace}/pods/finetune-worker-0/status", crashed)
        # the whole job restarts: the master and the other worker are evicted too, and the
        # three replicas the operator creates again are placed together
        [note] = await wait_for(lambda: events_for(kube, namespace, "finetune", "WholeJobRestart"), timeout=30)
        assert note["message"].startswith("a running member was lost: 2 of 3 required members remain")
        old = {p["metadata"]["uid"] for p in first}

        async def restarted() -> list[dict[str, Any]] | None:
            pods = live(await list_pods(kube, namespace), "finetune")
            fresh = [p for p in pods if p["metadata"]["uid"] not in old and p["spec"].get("nodeName")]
            return fresh if len(fresh) == 3 and len(pods) == 3 else None

        again = await wait_for(restarted, timeout=60)
        # and it stays so: one failure, one restart
        await asyncio.sleep(3)
        now = live(await list_pods(kube, namespace), "finetune")
        assert {p["metadata"]["uid"] for p in now} == {p["metadata"]["uid"] for p in again}, _where(now)
        assert len(await events_for(kube, namespace, "finetune", "WholeJobRestart")) == 1
