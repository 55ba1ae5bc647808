"""The chaos suite on Kubernetes' own pod groups (``scheduling.k8s.io/v1beta1``): the world
writes a share of its gangs in that API, the recorder watches its PodGroups, and the checks
judge those gangs by their ``minCount`` as they judge scheduler-plugins' by ``minMember``.
The recorder's handlers are fed the objects a watch delivers; nothing here starts a cluster
(tests/integration/test_chaos_cluster.py runs the suite on the sandbox)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perf.chaos.checks import K8S_API, XK8S_API, Checker, Limits
from perf.chaos.recorder import Recorder
from perf.chaos.world import Job, World


def world(apis: tuple[str, ...] = (XK8S_API, K8S_API)) -> World:
    """A world's workload side only (no cluster, scheduler or recorder behind it)."""
    return World(kube=None, sandbox=None, namespace="ns", nodes=[], gpus_per_node=8, queues={},  # type: ignore[arg-type]
                 schedulers=None, recorder=None, scheduler_name="batchsched-ns", pool="ns",  # type: ignore[arg-type]
                 workdir=Path("/nonexistent"), gang_timeout=10.0, group_apis=apis)


def gang(name: str, api: str, members: int = 3) -> Job:
    return Job(name=name, namespace="ns", members=members, min_member=members, gpu=1, share=None,
               queue="team-a", priority="high-priority", pods=[f"{name}-{i}" for i in range(members)], api=api)


def served(obj: dict[str, Any], uid: str, node: str = "") -> dict[str, Any]:
    """An object as the apiserver returns it."""
    obj["metadata"].update(namespace="ns", uid=uid, resourceVersion="1")
    if node:
        obj["spec"]["nodeName"] = node
    obj.setdefault("status", {})
    return obj


def test_every_second_gang_is_written_in_kubernetes_own_api_when_the_cluster_serves_it() -> None:
    w = world()
    assert [w.next_gang_api() for _ in range(4)] == [XK8S_API, K8S_API, XK8S_API, K8S_API]
    old = world((XK8S_API,))
    assert {old.next_gang_api() for _ in range(4)} == {XK8S_API}


def test_an_upstream_gang_is_a_podgroup_of_scheduling_k8s_io_its_pods_naming_it() -> None:
    w = world()
    job = gang("up", K8S_API)
    group = w.group_body(job)
    assert group["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}, "priorityClassName": "high-priority"}
    assert group["metadata"]["labels"]["batchsched.io/queue"] == "team-a"
    assert w.group_path(job) == "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups"
    pod = w.pod_body(job, "up-0", "up-0")
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "up"}
    assert "scheduling.x-k8s.io/pod-group" not in pod["metadata"]["labels"]
    plugins = w.pod_body(gang("old", XK8S_API), "old-0", "old-0")
    assert plugins["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "old" and "schedulingGroup" not in plugins["spec"]


def test_the_recorder_watches_both_apis_and_a_partial_upstream_gang_is_found() -> None:
    w = world()
    rec = Recorder("kubeconfig", namespace="ns", pool="ns", limits=Limits(partial_grace=5.0))
    up, old = gang("up", K8S_API), gang("old", XK8S_API, members=2)
    # a list of a built-in type's collection: its items carry no apiVersion
    listed_up = served(w.group_body(up), "g-up")
    del listed_up["apiVersion"]
    rec._groups_listed(K8S_API, [listed_up], 0.0)
    rec._groups_listed(XK8S_API, [served(w.group_body(old), "g-old")], 0.0)
    rec._groups_listed(K8S_API, [listed_up], 0.0)  # a relist of one API keeps the other's
    assert set(rec.m.groups) == {"up", "old"}
    for i, pod in enumerate(up.pods):
        rec._pod_event("ADDED", served(w.pod_body(up, pod, pod), f"p-up-{i}", node="n0" if i == 0 else ""), 0.0)
    for i, pod in enumerate(old.pods):
        rec._pod_event("ADDED", served(w.pod_body(old, pod, pod), f"p-old-{i}", node="n1"), 0.0)
    assert {p.name: p.group for p in rec.m.pods.values()} == {"up-0": "up", "up-1": "up", "up-2": "up",
                                                                "old-0": "old", "old-1": "old"}
    checker = Checker(Limits(partial_grace=5.0))
    checker.sample(rec.m, 1.0)
    checker.sample(rec.m, 10.0)
    found = checker.verdict.findings["partial_gangs"]
    assert set(found) == {"up"} and "1 of 3 bound" in found["up"].example  # the whole old gang is fine
    rec._group_event("DELETED", served(w.group_body(up), "g-up"), 11.0)
    assert set(rec.m.groups) == {"old"}
