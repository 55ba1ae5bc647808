"""Kubernetes' own pod groups on the real 1.37 control plane: ``scheduling.k8s.io/v1beta1``
PodGroups whose pods join by ``spec.schedulingGroup`` and name batchsched.

- under contention a gang is bound whole or not at all (a watch of every pod version shows
  the gang that does not fit never held a node), and the conditions kube-scheduler would write are read back with
  ``kubectl get podgroups.scheduling.k8s.io -o yaml``;
- a gang whose PriorityClass says ``preemptionPolicy: Never`` waits; a higher-priority gang
  preempts a lower one whole, which is told so by its ``DisruptionTarget`` condition;
- a gang constrained to one rack (``schedulingConstraints.topology``) lands in one;
- a PodGroup whose members name different schedulers is refused with an Event."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from batchsched.sandbox import build
from tests.integration.helpers import (
    PodHistory,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

API = "scheduling.k8s.io/v1beta1"
CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


async def podgroup(kube: KubeClient, namespace: str, name: str, min_count: int, **spec: Any) -> dict[str, Any]:
    return await kube.create(f"/apis/{API}/namespaces/{namespace}/podgroups", {
        "apiVersion": API, "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}, **spec},
    })


def member(name: str, group: str, *, gpu: int, pool: str, priority_class: str = "",
           scheduler: str = "batchsched") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {"pool": pool}, "schedulingGroup": {"podGroupName": group}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    body = pod_body(name, gpu=gpu, spec=spec)
    body["spec"]["schedulerName"] = scheduler
    return body


def conditions(group: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (group.get("status") or {}).get("conditions") or []}


async def group_of(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return await kube.get(f"/apis/{API}/namespaces/{namespace}/podgroups/{name}")


def kubectl_groups(sandbox: Any, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's PodGroups as ``kubectl get podgroups.scheduling.k8s.io -o yaml`` shows them."""
    out = subprocess.run(
        [str(build.ensure_binaries().kubectl), "--kubeconfig", str(sandbox.kubeconfig), "get",
         "podgroups.scheduling.k8s.io", "-n", namespace, "-o", "yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return {g["metadata"]["name"]: g for g in yaml.safe_load(out.stdout)["items"]}


@contextlib.asynccontextmanager
async def priority_classes(kube: KubeClient, **classes: tuple[int, str]) -> AsyncIterator[dict[str, str]]:
    """PriorityClasses (value, preemptionPolicy) under unique names, deleted after the test."""
    names = {key: f"{key}-{uuid.uuid4().hex[:6]}" for key in classes}
    for key, (value, policy) in classes.items():
        await kube.create(CLASSES, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                    "metadata": {"name": names[key]}, "value": value, "preemptionPolicy": policy})
    try:
        yield names
    finally:
        for name in names.values():
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{CLASSES}/{name}")


async def test_a_gang_is_bound_whole_or_not_at_all_and_its_conditions_read_as_kube_schedulers(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=3, gpus=8, labels={"pool": pool})
    for name in ("first", "second"):
        await podgroup(kube, namespace, name, 2)
    async with PodHistory(kube, namespace) as history, running_scheduler(sandbox, namespace):
        # two gangs of two whole-node members on three nodes: one of them fits
        await create_pods(kube, namespace, [member(f"{g}-{i}", g, gpu=8, pool=pool)
                                            for g in ("first", "second") for i in range(2)])

        async def one_whole() -> list[str] | None:
            pods = await list_pods(kube, namespace)
            placed = sorted(p["metadata"]["name"] for p in pods if p["spec"].get("nodeName"))
            return placed if len(placed) == 2 else None

        placed = await wait_for(one_whole, timeout=60)
        winner = placed[0].rsplit("-", 1)[0]
        loser = "second" if winner == "first" else "first"
        assert placed == [f"{winner}-0", f"{winner}-1"]

        async def told() -> bool:
            return conditions(await group_of(kube, namespace, loser)).get(
                "PodGroupInitiallyScheduled", {}).get("reason") == "Unschedulable"

        await wait_for(told, timeout=30)
        await asyncio.sleep(2)  # no stray bind follows
    # never partial: the gang that does not fit held no node at any moment (the bindings of
    # the one that fits land one by one, so only its final state counts)
    for state in history.states():
        held = [p["metadata"]["name"] for p in state if p["metadata"]["name"].startswith(f"{loser}-")
                and p["spec"].get("nodeName")]
        assert not held, f"gang {loser}, which does not fit, held {held}"
    shown = kubectl_groups(sandbox, namespace)
    won, lost = conditions(shown[winner])["PodGroupInitiallyScheduled"], conditions(shown[loser])["PodGroupInitiallyScheduled"]
    assert (won["status"], won["reason"], won["message"]) == ("True", "Scheduled", "2 of 2 required members placed")
    assert (lost["status"], lost["reason"]) == ("False", "Unschedulable")
    assert "16" in lost["message"] or "node" in lost["message"], lost  # batchsched's own explanation
    assert "phase" not in (shown[winner].get("status") or {})  # the API's status has no phase


async def test_never_waits_and_a_higher_priority_gang_preempts_a_lower_one_whole(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    async with priority_classes(kube, low=(10, "PreemptLowerPriority"), high=(1000, "PreemptLowerPriority"),
                                polite=(1000, "Never")) as pc, running_scheduler(sandbox, namespace):
        await podgroup(kube, namespace, "low", 2, priorityClassName=pc["low"])
        await create_pods(kube, namespace, [member(f"low-{i}", "low", gpu=8, pool=pool, priority_class=pc["low"])
                                            for i in range(2)])

        async def running(prefix: str) -> bool:
            pods = [p for p in await list_pods(kube, namespace) if p["metadata"]["name"].startswith(prefix)]
            return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

        await wait_for(lambda: running("low-"), timeout=60)
        # a gang of the same high priority whose class says Never: it waits, evicting no one
        # (the apiserver defaults the policy before its priority admission compares it with
        # the class's, so Never must be written out)
        await podgroup(kube, namespace, "polite", 2, priorityClassName=pc["polite"], preemptionPolicy="Never")
        await create_pods(kube, namespace, [member(f"polite-{i}", "polite", gpu=8, pool=pool,
                                                   priority_class=pc["polite"]) for i in range(2)])

        async def polite_told() -> str | None:
            c = conditions(await group_of(kube, namespace, "polite")).get("PodGroupInitiallyScheduled", {})
            return c.get("message") if "preemptionPolicy is Never" in c.get("message", "") else None

        await wait_for(polite_told, timeout=30)
        assert await running("low-")
        for i in range(2):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/polite-{i}")
        # a high-priority gang preempts the low one, whole
        await podgroup(kube, namespace, "high", 2, priorityClassName=pc["high"])
        await create_pods(kube, namespace, [member(f"high-{i}", "high", gpu=8, pool=pool, priority_class=pc["high"])
                                            for i in range(2)])
        await wait_for(lambda: running("high-"), timeout=60)
        assert not [p for p in await list_pods(kube, namespace) if p["metadata"]["name"].startswith("low-")]

        async def disrupted() -> dict[str, Any] | None:
            return conditions(await group_of(kube, namespace, "low")).get("DisruptionTarget")

        target = await wait_for(disrupted, timeout=30)
        assert (target["status"], target["reason"]) == ("True", "PreemptionByScheduler")
        assert "high" in target["message"]


async def test_a_gang_constrained_to_one_rack_lands_in_one(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool, "batchsched.io/rack": f"{pool}-a"})
    half = await make_nodes(count=2, gpus=8, labels={"pool": pool, "batchsched.io/rack": f"{pool}-b"})
    # rack b's nodes are half used: packing alone would fill them first and spill the third
    # member into rack a
    await create_pods(kube, namespace, [pod_body(f"filler-{i}", gpu=4, spec={"nodeName": node})
                                        for i, node in enumerate(half)])
    async with running_scheduler(sandbox, namespace):
        await podgroup(kube, namespace, "tight", 3, schedulingConstraints={"topology": [{"key": "batchsched.io/rack"}]})
        await create_pods(kube, namespace, [member(f"tight-{i}", "tight", gpu=4, pool=pool) for i in range(3)])

        async def placed() -> list[str] | None:
            nodes = [p["spec"].get("nodeName") for p in await list_pods(kube, namespace)
                     if p["metadata"]["name"].startswith("tight-")]
            return nodes if all(nodes) and len(nodes) == 3 else None

        nodes = await wait_for(placed, timeout=60)
        racks = {(await kube.get(f"/api/v1/nodes/{n}"))["metadata"]["labels"]["batchsched.io/rack"] for n in nodes}
        assert racks == {f"{pool}-a"}


async def test_a_pod_group_mixing_schedulers_is_refused_with_an_event(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    await podgroup(kube, namespace, "mixed", 2)
    async with running_scheduler(sandbox, namespace):
        await create_pods(kube, namespace, [
            member("mixed-0", "mixed", gpu=1, pool=pool),
            member("mixed-1", "mixed", gpu=1, pool=pool, scheduler="default-scheduler"),
            pod_body("alone", gpu=1, spec={"nodeSelector": {"pool": pool}}),
        ])
        [event] = await wait_for(lambda: events_for(kube, namespace, "mixed", "InvalidPodGroup"), timeout=30)
        assert "1 of its member(s) name another scheduler" in event["message"]
        c = conditions(await group_of(kube, namespace, "mixed"))["PodGroupInitiallyScheduled"]
        assert (c["status"], c["reason"]) == ("False", "SchedulerError")
        await asyncio.sleep(2)
        bound = {p["metadata"]["name"] for p in await list_pods(kube, namespace) if p["spec"].get("nodeName")}
        assert bound == {"alone"}
