"""A fixed sample of the fuzzed bad input (tests/strategies.py) on the real control plane.

The unit tests push thousands of drawn objects through a session; here a deterministic
sample of them (pods, PodGroups of both APIs, Queues) is created in a real apiserver next
to valid work, with batchsched running. What the apiserver itself refuses is counted and
listed (its validation is the first line; that is not a failure). Of what it accepts, each
object batchsched cannot use says so where a user looks (the pod's ``PodScheduled``
condition or a ``FailedScheduling`` Event, an ``InvalidPodGroup`` Event, the Queue's
``Active`` condition); the valid pods and gangs are bound; nothing batchsched bound sits on
a node without room; and the scheduler is still running and ready.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from batchsched.core.devices import GPU_SHARES, internal
from batchsched.core.gangs import VOLCANO as VOLCANO_API
from batchsched.core.gangs import XK8S as XK8S_API
from batchsched.core.gangs import parse_podgroup
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.queues import QUEUE_LABEL
from batchsched.core.queues.tree import QueueTree
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import KubeError, NotFoundError
from tests.integration.helpers import (
    QUEUES,
    VOLCANO,
    VOLCANO_CRD,
    XK8S,
    create_group,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)
from tests.strategies import (
    QUEUE_NAMES,
    RESERVED_TAINT,
    stored_podgroups,
    stored_pods,
    stored_queues,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

OURS = frozenset({"batchsched"})
PATHS = {XK8S_API: XK8S, VOLCANO_API: VOLCANO}


def _sample(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """``count`` objects of ``strategy``, the same on every run (hypothesis, derandomized)."""
    got: list[Any] = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(value: Any) -> None:
        got.append(value)

    draw()
    return got


def _renamed(value: Any, names: dict[str, str]) -> Any:
    """``value`` with every queue name of the pool made unique to this test (Queues are
    cluster-wide)."""
    return names.get(value, value) if isinstance(value, str) else value


def bad_sample(namespace: str, tag: str) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]],
                                                   list[dict[str, Any]]]:
    """24 pods, 8 PodGroups and 8 Queues of the strategies of what an apiserver stores,
    in ``namespace``."""
    names = {q: f"{q}-{tag}" for q in QUEUE_NAMES}
    pod_objs = []
    for i, o in enumerate(_sample(stored_pods(namespace=namespace), 24)):
        o = copy.deepcopy(o)
        meta = o["metadata"]
        meta["name"] = f"bad-{i}-{meta['name']}"[:253] if meta["name"] else ""
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            meta.pop(k, None)  # the apiserver's to set
        labels = meta.get("labels") or {}
        if QUEUE_LABEL in labels:
            labels[QUEUE_LABEL] = _renamed(labels[QUEUE_LABEL], names)
        o.pop("status", None)
        pod_objs.append(o)
    groups = []
    for api, o in _sample(stored_podgroups(namespace=namespace), 8):
        o = copy.deepcopy(o)
        for k in ("uid", "resourceVersion", "creationTimestamp"):
            o["metadata"].pop(k, None)
        if isinstance(o.get("spec"), dict) and "queue" in o["spec"]:
            o["spec"]["queue"] = _renamed(o["spec"]["queue"], names)
        o.pop("status", None)
        groups.append((api, o))
    queue_objs = []
    for o in _sample(stored_queues(), 8):
        o = copy.deepcopy(o)
        o["metadata"] = {"name": _renamed(o["metadata"]["name"], names) or f"unnamed-{tag}"}
        if isinstance(o.get("spec"), dict) and "parent" in o["spec"]:
            o["spec"]["parent"] = _renamed(o["spec"]["parent"], names)
        queue_objs.append(o)
    return pod_objs, groups, queue_objs


def valid_work(namespace: str) -> tuple[list[dict[str, Any]], list[tuple[str, str, dict[str, Any]]]]:
    """Three single pods and two gangs (scheduler-plugins, and Volcano by the kube-batch
    annotation), on the nodes no bad pod may use: 9 GPUs of 16."""
    extra = {"spec": {"tolerations": [{"key": RESERVED_TAINT, "operator": "Exists"}],
                      "nodeSelector": {"pool": "valid"}}}
    bodies = [pod_body(f"valid-single-{i}", gpu=1, **copy.deepcopy(extra)) for i in range(3)]
    for i in range(2):
        body = pod_body(f"valid-xg-{i}", gpu=2, **copy.deepcopy(extra))
        body["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "valid-xg"}
        bodies.append(body)
        body = pod_body(f"valid-vg-{i}", gpu=1, **copy.deepcopy(extra))
        body["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "valid-vg"}
        bodies.append(body)
    return bodies, [(XK8S, "valid-xg", {"minMember": 2}), (VOLCANO, "valid-vg", {"minMember": 2})]


async def _create(kube: KubeClient, path: str, body: dict[str, Any], refused: list[str], what: str) -> dict[str, Any] | None:
    try:
        return await kube.create(path, body)
    except KubeError as exc:
        refused.append(f"{what}: {str(exc)[:160]}")
        return None


def _condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return dict(c)
    return None


async def test_a_sample_of_bad_input_is_reported_and_the_valid_work_is_placed(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox.cluster import apply_manifests

    await apply_manifests(kube, [VOLCANO_CRD])
    tag = uuid.uuid4().hex[:6]
    await make_nodes(count=2, gpus=8)
    await make_nodes(count=2, gpus=8, labels={"pool": "valid"},
                     taints=({"key": RESERVED_TAINT, "value": "yes", "effect": "NoSchedule"},))
    bad_pods, bad_groups, bad_queues = bad_sample(namespace, tag)
    valid_pods, valid_groups = valid_work(namespace)
    refused: list[str] = []
    accepted_queues: list[dict[str, Any]] = []
    try:
        for q in bad_queues:
            made = await _create(kube, QUEUES, q, refused, f"Queue {q['metadata']['name']}")
            if made is not None:
                accepted_queues.append(made)
        async with running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}) as sched:
            accepted_groups: list[tuple[str, dict[str, Any]]] = []
            for api, o in bad_groups:
                made = await _create(kube, f"{PATHS[api]}/namespaces/{namespace}/podgroups", o, refused,
                                     f"PodGroup {o['metadata']['name']!r} ({api})")
                if made is not None:
                    accepted_groups.append((api, made))
            for path, name, spec in valid_groups:
                await create_group(kube, path, namespace, name, spec)
            preset: set[str] = set()
            accepted_pods: list[dict[str, Any]] = []
            for o in bad_pods:
                made = await _create(kube, f"/api/v1/namespaces/{namespace}/pods", o, refused,
                                     f"Pod {o['metadata']['name']!r}")
                if made is not None:
                    accepted_pods.append(made)
                    if made["spec"].get("nodeName"):
                        preset.add(made["metadata"]["name"])
            for body in valid_pods:
                await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
            print(f"\nthe apiserver refused {len(refused)} of {len(bad_pods) + len(bad_groups) + len(bad_queues)} "
                  f"bad objects and accepted {len(accepted_pods)} pods, {len(accepted_groups)} PodGroups, "
                  f"{len(accepted_queues)} Queues:")
            for line in refused:
                print("  refused", line)
            assert accepted_pods and accepted_groups and accepted_queues, "the sample must reach batchsched"

            # the valid work is bound, on its own nodes
            valid_names = [b["metadata"]["name"] for b in valid_pods]

            async def valid_bound() -> dict[str, str] | None:
                nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in await list_pods(kube, namespace)}
                return {n: str(nodes[n]) for n in valid_names} if all(nodes.get(n) for n in valid_names) else None

            placed = await wait_for(valid_bound, timeout=90)
            reserved = set(await _nodes_labelled(kube, "pool", "valid"))
            assert set(placed.values()) <= reserved, placed

            # each accepted pod of ours that waits is told why, by a condition or an Event
            waiting = [p["metadata"]["name"] for p in accepted_pods if _ours_and_waits(p)]

            async def all_told() -> list[str] | None:
                current = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
                untold = []
                for name in waiting:
                    pod = current.get(name)
                    if pod is None or pod["spec"].get("nodeName") or _condition(pod) is not None:
                        continue
                    if not await events_for(kube, namespace, name):
                        untold.append(name)
                return None if untold else waiting

            try:
                await wait_for(all_told, timeout=60, interval=1.0)
            except AssertionError:
                current = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
                untold = [n for n in waiting if n in current and not _condition(current[n])]
                raise AssertionError(f"pods waiting untold: {untold}") from None

            print(f"  {len(waiting)} accepted pods of batchsched wait, each told why")
            # each accepted PodGroup batchsched cannot use has an InvalidPodGroup Event
            for api, made in accepted_groups:
                group = parse_podgroup(api, made)
                if group.invalid:
                    [ev] = await wait_for(lambda g=group: events_for(kube, namespace, g.name, "InvalidPodGroup"),
                                          timeout=30)
                    assert ev["message"].startswith(f"PodGroup {namespace}/{group.name} is invalid"), ev["message"]
                    print(f"  PodGroup {group.name} ({api}): {ev['message']}")

            # each accepted Queue says whether it is used, and why not
            tree = QueueTree.from_objects(accepted_queues, ())
            for q in accepted_queues:
                name = q["metadata"]["name"]
                bad = name in tree.errors or name not in tree

                async def active(name: str = name) -> dict[str, Any] | None:
                    conds = ((await kube.get(f"{QUEUES}/{name}")).get("status") or {}).get("conditions") or []
                    return next((c for c in conds if c.get("type") == "Active"), None)

                cond = await wait_for(active, timeout=30)
                assert (cond["reason"] == "InvalidSpec") == bad, (name, cond)
                print(f"  Queue {name}: {cond['reason']}: {cond.get('message', '')}")

            # nothing batchsched bound is on a node without room; the gangs are whole
            await _no_overcommit(kube, namespace, preset)
            await _gangs_whole(kube, namespace, [
                *accepted_groups,
                (XK8S_API, {"metadata": {"name": "valid-xg", "namespace": namespace}, "spec": {"minMember": 2}}),
                (VOLCANO_API, {"metadata": {"name": "valid-vg", "namespace": namespace}, "spec": {"minMember": 2}}),
            ], preset)
            # and the scheduler still runs, is ready, and schedules
            assert sched.ready
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_body("after", gpu=1, **{"spec": {
                "tolerations": [{"key": RESERVED_TAINT, "operator": "Exists"}], "nodeSelector": {"pool": "valid"}}}))

            async def after_bound() -> bool:
                return bool((await kube.get(f"/api/v1/namespaces/{namespace}/pods/after"))["spec"].get("nodeName"))

            await wait_for(after_bound, timeout=30)
            assert sched.ready
    finally:
        for q in accepted_queues:
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{QUEUES}/{q['metadata']['name']}")


def _ours_and_waits(pod: dict[str, Any]) -> bool:
    spec = pod["spec"]
    return (spec.get("schedulerName") == "batchsched" and not spec.get("nodeName")
            and not spec.get("schedulingGates"))


async def _nodes_labelled(kube: KubeClient, key: str, value: str) -> list[str]:
    items, _ = await kube.list("/api/v1/nodes", labelSelector=f"{key}={value}")
    return [n["metadata"]["name"] for n in items]


async def _no_overcommit(kube: KubeClient, namespace: str, preset: set[str]) -> None:
    """What batchsched bound fits each node's allocatable (pods created already bound aside)."""
    nodes, _ = await kube.list("/api/v1/nodes")
    alloc = {n["metadata"]["name"]: parse_node(n).allocatable for n in nodes}
    used: dict[str, Counter[str]] = defaultdict(Counter)
    for p in await list_pods(kube, namespace):
        node = p["spec"].get("nodeName")
        if not node or p["metadata"]["name"] in preset:
            continue
        for r, v in parse_pod(p, OURS).requests.items():
            if not internal(r) and r != GPU_SHARES:
                used[node][r] += v
    for node, u in used.items():
        for r, v in u.items():
            assert v <= alloc.get(node, {}).get(r, 0), f"node {node} over-committed on {r}: {v}"


async def _gangs_whole(kube: KubeClient, namespace: str, groups: list[tuple[str, dict[str, Any]]],
                       preset: set[str]) -> None:
    """Each gang has none or at least its quorum bound by batchsched; an invalid one none."""
    pods_now = [p for p in await list_pods(kube, namespace)
                if p["spec"].get("nodeName") and p["metadata"]["name"] not in preset]
    volcano = {parse_podgroup(api, o).name for api, o in groups if api == VOLCANO_API}
    for api, obj in groups:
        group = parse_podgroup(api, obj)
        bound = [p for p in pods_now if _group_of(p, volcano) == (api, group.name)]
        if group.invalid:
            assert bound == [], (group.key, group.invalid)
        assert not bound or len(bound) >= group.min_member, (group.key, len(bound), group.min_member)


def _group_of(pod: dict[str, Any], volcano: set[str]) -> tuple[str, str] | None:
    """The group a pod names, as batchsched resolves it (the kube-batch annotation goes to
    Volcano's group of that name when there is one)."""
    labels = pod["metadata"].get("labels") or {}
    notes = pod["metadata"].get("annotations") or {}
    if labels.get("scheduling.x-k8s.io/pod-group"):
        return XK8S_API, str(labels["scheduling.x-k8s.io/pod-group"])
    if labels.get("scheduling.volcano.sh/group-name"):
        return VOLCANO_API, str(labels["scheduling.volcano.sh/group-name"])
    name = notes.get("scheduling.k8s.io/group-name")
    if name:
        return (VOLCANO_API if name in volcano else XK8S_API), str(name)
    return None
