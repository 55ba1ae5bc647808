"""batchsched's ClusterRole and its leader-election Role (``manifests/base/rbac.yaml``) are
what it needs, and nothing more.

Every integration test runs the scheduler under its own ServiceAccount, bound to that role
alone, and the sandbox's apiserver writes an audit log of that account's requests (see
``tests/conftest.py``). This test runs one scheduler along every path that talks to the
API (a gang bound, a Volcano group admitted, a Kueue group's Workload read, a GPU share
annotated, a pod that fits nowhere told why, a preemption, a binding that lost a race, a
Queue's status, a Lease),
then reads the log: no request of the account was refused, and every (API group,
resource, verb) the role grants was used, by this test or by the tests before it in the
run. A grant nobody uses is removed from the role; a refused request is a rule missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsched.core.plan import Binding
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, NotFoundError
from batchsched.kube.tls import client_context
from batchsched.sandbox import gpudra
from batchsched.sandbox.nodes import SANDBOX_LABEL
from tests.conftest import RBAC, SCHEDULER_USER, admin_token, rbac_denials, scheduler_requests
from tests.integration.helpers import (
    QUEUES,
    VOLCANO,
    VOLCANO_CRD,
    XK8S,
    create_group,
    create_pods,
    events_for,
    get_group,
    pod_body,
    running_scheduler,
    wait_for,
)

UPSTREAM = "/apis/scheduling.k8s.io/v1beta1"

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Use = tuple[str, str, str]  # (API group, resource[/subresource], verb)

DECISION = "authorization.k8s.io/decision"

#: grants of rbac.yaml this test cannot make the scheduler use in the sandbox, each with
#: why
NOT_EXERCISED: dict[Use, str] = {
    ("resource.k8s.io", "resourceclaims/binding", "patch"): (
        "asked of RBAC by the apiserver inside the patch of a claim's status (exercised below: "
        "the claim is allocated), never a request of its own in the audit log"
    ),
}
RESOURCE = "/apis/resource.k8s.io/v1"


#: the Roles of rbac.yaml whose grants this test exercises along with the ClusterRole (the
#: workload mix's is tests/integration/test_workload_mix.py's)
ROLES = ("batchsched-leader-election",)


def granted(path: Path = RBAC) -> set[Use]:
    """Every (API group, resource, verb) the scheduler's ClusterRole in ``path`` grants, and
    the Roles of :data:`ROLES`."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    roles = [next(d for d in docs if d["kind"] == "ClusterRole"),
             *(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] in ROLES)]
    assert len(roles) == 1 + len(ROLES)
    return {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def use_of(event: dict[str, Any]) -> Use | None:
    ref = event.get("objectRef")
    if ref is None:  # a non-resource URL
        return None
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return ref.get("apiGroup", ""), resource, event["verb"]


async def pod(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except NotFoundError:
        return None


async def node_of(kube: KubeClient, namespace: str, name: str) -> str | None:
    got = await pod(kube, namespace, name)
    return got["spec"].get("nodeName") if got else None


async def test_the_scheduler_uses_every_grant_of_its_role_and_is_refused_nothing(
    sandbox, kube: KubeClient, namespace: str, make_nodes, audit_log: Path,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox.cluster import apply_manifests

    await apply_manifests(kube, [VOLCANO_CRD])
    pool, spare = namespace, f"{namespace}-p"
    await make_nodes(count=2, prefix=pool, gpus=4)
    [victims_node] = await make_nodes(count=1, prefix=spare, gpus=2)
    in_pool = {"nodeSelector": {SANDBOX_LABEL: pool}}
    queue = f"q-{namespace}"
    classes: list[str] = []
    await kube.create(QUEUES, {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": queue}, "spec": {}})
    try:
        await create_group(kube, XK8S, namespace, "train", {"minMember": 2})
        await create_group(kube, VOLCANO, namespace, "vc", {"minMember": 1})
        await kube.create(f"{UPSTREAM}/namespaces/{namespace}/podgroups", {
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": "up"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
        })
        await create_pods(kube, namespace, [
            pod_body("up-0", spec={**in_pool, "schedulingGroup": {"podGroupName": "up"}}),
            *(pod_body(f"train-{i}", gpu=2, spec=in_pool,
                       metadata={"labels": {"scheduling.x-k8s.io/pod-group": "train"}}) for i in range(2)),
            pod_body("vc-0", gpu=1, spec=in_pool,
                     metadata={"annotations": {"scheduling.k8s.io/group-name": "vc"}}),
            pod_body("share", spec=in_pool, metadata={"annotations": {"gpu-fraction": "0.5"}}),
            # a Kueue pod group of one: its Events go to Kueue's Workload, whose uid is read
            pod_body("kq-0", spec=in_pool, metadata={"labels": {"kueue.x-k8s.io/pod-group-name": "kq"},
                                                     "annotations": {"kueue.x-k8s.io/pod-group-total-count": "1"}}),
            pod_body("huge", gpu=64, spec=in_pool),
            pod_body("low", gpu=2, spec={"nodeSelector": {SANDBOX_LABEL: spare},
                                         "priorityClassName": "low-priority"}),
        ])
        async with running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}) as sched:
            # a gang bound whole, its PodGroup's status written
            async def train_running() -> bool:
                st = (await get_group(kube, XK8S, namespace, "train")).get("status") or {}
                return st.get("phase") == "Running" and st.get("running") == 2

            await wait_for(train_running, timeout=60)
            assert await events_for(kube, namespace, "train-0", "Scheduled")
            # Volcano's group: its status is patched on the object (no status subresource)
            async def vc_running() -> bool:
                st = (await get_group(kube, VOLCANO, namespace, "vc")).get("status") or {}
                return st.get("phase") == "Running"

            await wait_for(vc_running, timeout=60)

            # Kubernetes' own PodGroup: its conditions patched on its status subresource
            async def up_scheduled() -> bool:
                group = await kube.get(f"{UPSTREAM}/namespaces/{namespace}/podgroups/up")
                return any(c.get("type") == "PodGroupInitiallyScheduled" and c.get("status") == "True"
                           for c in (group.get("status") or {}).get("conditions") or [])

            await wait_for(up_scheduled, timeout=60)
            # the Kueue group placed: its Workload (not made here) is looked for, the Event written
            await wait_for(lambda: events_for(kube, namespace, "kq", "Scheduled"), timeout=60)
            # a share of a card: the card is written on the pod before it is bound
            await wait_for(lambda: node_of(kube, namespace, "share"), timeout=60)
            share = await pod(kube, namespace, "share")
            assert share is not None and "batchsched.io/gpu-cards" in share["metadata"]["annotations"]
            # a pod that fits nowhere: its condition and an Event say why
            [failed] = await wait_for(lambda: events_for(kube, namespace, "huge", "FailedScheduling"), timeout=60)
            huge = await pod(kube, namespace, "huge")
            assert huge is not None
            [cond] = [c for c in huge["status"]["conditions"] if c["type"] == "PodScheduled"]
            assert cond["status"] == "False" and cond["message"] == failed["message"]

            # a preemption: the low-priority pod is marked, evicted, the preemptor nominated and bound
            await wait_for(lambda: node_of(kube, namespace, "low"), timeout=60)
            await create_pods(kube, namespace, [pod_body(
                "urgent", gpu=2, spec={"nodeSelector": {SANDBOX_LABEL: spare}, "priorityClassName": "high-priority"},
            )])
            assert await wait_for(lambda: node_of(kube, namespace, "urgent"), timeout=60) == victims_node
            low = await pod(kube, namespace, "low")
            assert low is None or low["metadata"].get("deletionTimestamp")
            assert await events_for(kube, namespace, "low", "Preempted")

            # a binding that lost a race (another scheduler bound the pod first): the
            # Binding API answers 409 and the scheduler reads the pod again
            submit = sched.binder.submit
            raced: list[asyncio.Task[None]] = []

            def bound_first_elsewhere(b: Binding) -> None:
                if b.name != "raced":
                    submit(b)
                    return

                async def race() -> None:
                    await kube.create(f"/api/v1/namespaces/{namespace}/pods/raced/binding", {
                        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "raced"},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": b.node},
                    })
                    submit(b)

                raced.append(asyncio.get_running_loop().create_task(race()))

            sched.binder.submit = bound_first_elsewhere  # type: ignore[method-assign]
            await create_pods(kube, namespace, [pod_body("raced", cpu="10m", spec=in_pool)])
            await wait_for(lambda: asyncio.sleep(0, result=sched.metrics.binds.labels("conflict")._value.get() >= 1),
                           timeout=60)
            await asyncio.gather(*raced)
            assert await node_of(kube, namespace, "raced")

            # the Queue's status
            async def queue_status() -> dict[str, Any] | None:
                st: dict[str, Any] | None = (await kube.get(f"{QUEUES}/{queue}")).get("status")
                return st if st and st.get("conditions") else None

            await wait_for(queue_status, timeout=30)

            # a pod with a ResourceClaim: the claim allocated and reserved on its status first
            node = f"{pool}-0"
            uid = str((await kube.get(f"/api/v1/nodes/{node}"))["metadata"]["uid"])
            for c in gpudra.device_classes(extended_resource=False):
                with contextlib.suppress(ConflictError):
                    await kube.create(f"{RESOURCE}/deviceclasses", c)
                    classes.append(c["metadata"]["name"])
            for body in gpudra.gpu_node_slices(node, gpus=2, node_uid=uid):
                await kube.create(f"{RESOURCE}/resourceslices", body)
            await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                              gpudra.resource_claim("one-gpu", "gpu.nvidia.com"))
            await create_pods(kube, namespace, [gpudra.pod_with_claims("dra", claims={"gpu": "one-gpu"})])
            assert await wait_for(lambda: node_of(kube, namespace, "dra"), timeout=60) == node
            claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/one-gpu")
            assert claim["status"]["allocation"]["devices"]["results"][0]["pool"] == node

            # a pod asking a DeviceClass's implicit extended resource, with a claim made for it
            # by an attempt that bound nothing: that claim deleted, a new one made and named
            gpu = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
            ext = pod_body("ext", cpu="10m", spec={**in_pool, "schedulingGates": [{"name": "example.com/wait"}]})
            ext["spec"]["containers"][0]["resources"]["requests"][gpu] = "1"
            ext["spec"]["containers"][0]["resources"]["limits"] = {gpu: "1"}
            await create_pods(kube, namespace, [ext])
            ext_uid = (await kube.get(f"/api/v1/namespaces/{namespace}/pods/ext"))["metadata"]["uid"]
            left = await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "ext-extended-resources-left",
                             "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "ext", "uid": ext_uid,
                                                  "controller": True}]},
                "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
                    "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}})
            await kube.patch(f"/api/v1/namespaces/{namespace}/pods/ext", [{"op": "remove", "path": "/spec/schedulingGates"}],
                             kind="json")
            assert await wait_for(lambda: node_of(kube, namespace, "ext"), timeout=60) == node
            status = (await kube.get(f"/api/v1/namespaces/{namespace}/pods/ext"))["status"]
            made = status["extendedResourceClaimStatus"]["resourceClaimName"]
            assert made != left["metadata"]["name"]
            with pytest.raises(NotFoundError):
                await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{left['metadata']['name']}")

            # the views: the caller's token reviewed, its access to the path asked of RBAC
            assert sched.tls is not None
            verified = client_context(sched.tls.ca_pem)
            ask = urllib.request.Request(f"https://127.0.0.1:{sched.views_port}/debug/jobs",
                                         headers={"Authorization": f"Bearer {admin_token(sandbox.kubeconfig)}"})
            jobs = await asyncio.to_thread(
                lambda: json.loads(urllib.request.urlopen(ask, timeout=60, context=verified).read()))
            assert "raced" in {j["name"] for j in jobs["jobs"]}
        # stopped: the Lease was released
        lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
        assert not lease["spec"].get("holderIdentity")
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"{QUEUES}/{queue}")
        for name in classes:
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{RESOURCE}/deviceclasses/{name}")

    grants = granted()
    assert set(NOT_EXERCISED) <= grants, "a grant listed as not exercised is no longer in rbac.yaml"

    def all_used() -> bool:
        used = {u for u in (use_of(e) for e in scheduler_requests(audit_log)) if u is not None}
        return grants - used <= set(NOT_EXERCISED)

    # the last requests (the Lease's release) reach the log within moments
    with contextlib.suppress(AssertionError):
        await wait_for(lambda: asyncio.sleep(0, result=all_used()), timeout=10)
    events = list(scheduler_requests(audit_log))
    assert events, f"no request of {SCHEDULER_USER} in {audit_log}"
    # each request carries RBAC's decision, which the check for refusals reads
    assert all((e.get("annotations") or {}).get(DECISION) in ("allow", "forbid") for e in events)
    assert rbac_denials(audit_log) == [], "requests refused to the scheduler: add the rule (with why) to rbac.yaml"
    used = {u for u in (use_of(e) for e in events) if u is not None}
    never = sorted(grants - used - set(NOT_EXERCISED))
    assert never == [], "granted but never used: remove from rbac.yaml, or exercise it here"
    counts = Counter(u for u in (use_of(e) for e in events if e["stage"] == "ResponseComplete") if u)
    print(f"\n{len(events)} audited requests of {SCHEDULER_USER}; {len(used)} kinds used, all of "
          f"{len(grants)} grants")
    for (group, resource, verb), n in sorted(counts.items()):
        print(f"  {group or 'core'} {resource} {verb}: {n}")


def test_every_rule_of_the_role_says_why_it_is_needed() -> None:
    lines = RBAC.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("- apiGroups:")]
    roles = [d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] in ("ClusterRole", "Role")]
    assert len(starts) == sum(1 for role in roles for rule in role["rules"] if "apiGroups" in rule)
    unexplained = [lines[i] for i in starts if not lines[i - 1].startswith("# ")]
    assert unexplained == []
