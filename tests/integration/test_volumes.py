"""Volumes and resource claims on the real control plane: honoured, or refused visibly."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from tests.integration.helpers import (
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

CLASSES = "/apis/storage.k8s.io/v1/storageclasses"
VOLUMES = "/api/v1/persistentvolumes"


def _claim(name: str, storage_class: str, volume: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                            "resources": {"requests": {"storage": "1Gi"}}}
    if volume:
        spec["volumeName"] = volume
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def _with_claim(name: str, pool: str, claim: str) -> dict[str, Any]:
    return pod_body(name, spec={
        "nodeSelector": {"pool": pool},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    })


async def _node_of(kube: KubeClient, namespace: str, name: str) -> str | None:
    pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    return pods[name]["spec"].get("nodeName") if name in pods else None


async def test_volumes_are_honoured_or_refused_visibly(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    nodes = sorted(await make_nodes(count=4, gpus=8, labels={"pool": tag}))
    local = nodes[-1]  # the node a pod without its volume's affinity would be least likely to get
    wffc, manual = f"wffc-{tag}", f"manual-{tag}"
    volume = f"local-{tag}"
    await kube.create(CLASSES, {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                "metadata": {"name": wffc}, "provisioner": "example.com/none",
                                "volumeBindingMode": "WaitForFirstConsumer"})
    await kube.create(CLASSES, {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                "metadata": {"name": manual}, "provisioner": "kubernetes.io/no-provisioner",
                                "volumeBindingMode": "Immediate"})
    await kube.create(VOLUMES, {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
                                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                         "storageClassName": manual, "hostPath": {"path": "/data"},
                                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                             {"key": "kubernetes.io/hostname", "operator": "In",
                                              "values": [local]}]}]}}}})
    try:
        claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
        await kube.create(claims, _claim("scratch", wffc))
        await kube.create(claims, _claim("dataset", manual, volume=volume))

        async def bound_claim() -> bool:
            c = await kube.get(f"{claims}/dataset")
            return (c.get("status") or {}).get("phase") == "Bound"

        await wait_for(bound_claim, timeout=30)
        dra = pod_body("dra", spec={"nodeSelector": {"pool": tag},
                                    "resourceClaims": [{"name": "gpu", "resourceClaimName": f"gpu-{tag}"}]})
        async with running_scheduler(sandbox, namespace):
            await create_pods(kube, namespace, [
                _with_claim("reader", tag, "dataset"), _with_claim("writer", tag, "scratch"),
                _with_claim("early", tag, "later"), dra,
            ])
            # bound: goes where its volume is
            assert await wait_for(lambda: _node_of(kube, namespace, "reader"), timeout=30) == local
            # the others are told why, naming their claim, and never bound
            expect = {
                "writer": f"pod {namespace}/writer cannot be scheduled: PersistentVolumeClaim {namespace}/scratch "
                          f"waits for its first consumer (StorageClass {wffc}, WaitForFirstConsumer): "
                          "batchsched does not provision volumes yet",
                "early": f"pod {namespace}/early cannot be scheduled: PersistentVolumeClaim {namespace}/later "
                         "does not exist yet",
                "dra": f"pod {namespace}/dra cannot be scheduled: ResourceClaim {namespace}/gpu-{tag} "
                       "does not exist yet",
            }
            for name, message in expect.items():
                [ev] = await wait_for(lambda name=name: events_for(kube, namespace, name, "FailedScheduling"),
                                      timeout=20)
                assert ev["message"] == message
                assert await _node_of(kube, namespace, name) is None
            # the missing claim appears, bound to nothing with Immediate binding: still waiting, said so
            await kube.create(claims, _claim("later", manual))
            await wait_for(lambda: _told(kube, namespace, "early", "is not bound to a volume yet"), timeout=20)
    finally:
        for path in (f"{VOLUMES}/{volume}", f"{CLASSES}/{wffc}", f"{CLASSES}/{manual}"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)


async def _told(kube: KubeClient, namespace: str, name: str, text: str) -> bool:
    return any(text in e["message"] for e in await events_for(kube, namespace, name, "FailedScheduling"))
