"""Pods left in a namespace being deleted take no room from the live namespaces.

The apiserver refuses every Binding in a namespace being deleted ("unable to create new
content in namespace ... because it is being terminated"), yet its pods stay pending until
the namespace controller gets to them. A scheduler that keeps placing them holds room for
nothing and sends Binding after refused Binding (seen here: a pod of a live namespace
waited over 20 s behind the leftovers of another test's namespace). A validating
admission policy keeps the leftovers' deletion refused, so the namespace stays
Terminating with them pending as long as the test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ForbiddenError, KubeError, NotFoundError
from tests.integration.helpers import create_pods, list_pods, pod_body, running_scheduler, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


@contextlib.asynccontextmanager
async def _pods_undeletable(kube: KubeClient, namespace: str) -> Any:
    """No pod of ``namespace`` can be deleted while inside (the namespace controller
    included)."""
    name = f"hold-pods-{namespace}"
    await kube.create(POLICIES, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
                                   "resources": ["pods"]}],
            },
            "validations": [{"expression": "false", "message": "pods of this namespace are kept"}],
        },
    })
    await kube.create(BINDINGS, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    })
    try:
        yield
    finally:
        for path in (f"{BINDINGS}/{name}", f"{POLICIES}/{name}"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(path)


async def _deletion_refused(kube: KubeClient, namespace: str, pod: str) -> bool:
    try:
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}", dryRun="All")
    except ForbiddenError:
        return True
    except KubeError as exc:
        return "pods of this namespace are kept" in str(exc)
    return False


async def test_leftovers_of_a_namespace_being_deleted_take_no_room(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, gpus=8)
    old = f"t-old-{uuid.uuid4().hex[:6]}"
    await kube.create("/api/v1/namespaces", {"metadata": {"name": old}})
    try:
        async with _pods_undeletable(kube, old):
            # the leftovers: older than anything else, and they would fill the node
            await create_pods(kube, old, [pod_body(f"left-{i}", gpu=4) for i in range(2)])
            await wait_for(lambda: _deletion_refused(kube, old, "left-0"), timeout=30)
            await kube.delete(f"/api/v1/namespaces/{old}")
            ns = await kube.get(f"/api/v1/namespaces/{old}")
            assert ns["status"]["phase"] == "Terminating"

            async with running_scheduler(sandbox, namespace) as sched:
                await create_pods(kube, namespace, [pod_body("mine", gpu=8)])

                async def mine_bound() -> bool:
                    return any(p["spec"].get("nodeName") == node for p in await list_pods(kube, namespace))

                await wait_for(mine_bound, timeout=20)
                await asyncio.sleep(2)  # a cycle or two more, for any Binding of the leftovers
                # the leftovers are still there, never bound, and no Binding was sent for them
                left = await list_pods(kube, old)
                assert sorted(p["metadata"]["name"] for p in left) == ["left-0", "left-1"]
                assert not any(p["spec"].get("nodeName") for p in left)
                assert sched.metrics.binds.labels("failed")._value.get() == 0
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/namespaces/{old}")
