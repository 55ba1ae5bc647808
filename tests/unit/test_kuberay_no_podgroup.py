"""KubeRay pods that name no PodGroup: which pods they are, and what they and their
RayCluster are told.

The KubeRay operator run with ``--batch-scheduler=scheduler-plugins`` names the scheduler
on every pod but makes a PodGroup only for a RayCluster labelled
``ray.io/gang-scheduling-enabled``; the pods of any other cluster are placed one by one.
"""

from __future__ import annotations

from typing import Any

from batchsched.core import explain
from batchsched.core.decisions import Decisions
from batchsched.core.gangs.kuberay import ray_cluster_without_group
from batchsched.core.model import parse_pod
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_pod
from tests.unit.test_insight import GPU, World

CLUSTER_UID = "7d6f0a52-0000-4000-8000-000000000001"
NOTE = explain.ray_pod_by_pod("default/llm")


def ray_pod(name: str, gpus: int, *, gang: bool = False, kind: str = "RayCluster",
            api_version: str = "ray.io/v1", controller: bool = True, now: float = 0.0) -> dict[str, Any]:
    """A pod as KubeRay makes it for RayCluster ``llm`` (``gang``: the cluster has the label)."""
    labels = {"ray.io/cluster": "llm", "ray.io/node-type": "worker", "ray.io/group": "gpu"}
    if gang:
        labels["scheduling.x-k8s.io/pod-group"] = "llm"
    obj: dict[str, Any] = (make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(now).label(labels)
                           .scheduler("scheduler-plugins-scheduler").obj())
    obj["metadata"]["ownerReferences"] = [{
        "apiVersion": api_version, "kind": kind, "name": "llm", "uid": CLUSTER_UID,
        "controller": controller, "blockOwnerDeletion": True,
    }]
    return obj


def test_the_rule_names_the_raycluster_of_a_pod_of_no_gang_and_nothing_else() -> None:
    ref = ray_cluster_without_group(parse_pod(ray_pod("llm-head", 0)))
    assert ref is not None
    assert (ref.kind, ref.api_version, ref.namespace, ref.name, ref.uid) == (
        "RayCluster", "ray.io/v1", "default", "llm", CLUSTER_UID)
    # a member of the cluster's PodGroup, a pod another object made, a RayCluster of
    # another API group, an owner that is not the controller: none of them
    assert ray_cluster_without_group(parse_pod(ray_pod("a", 0, gang=True))) is None
    assert ray_cluster_without_group(parse_pod(ray_pod("b", 0, kind="Job", api_version="batch/v1"))) is None
    assert ray_cluster_without_group(parse_pod(ray_pod("c", 0, api_version="example.com/v1"))) is None
    assert ray_cluster_without_group(parse_pod(ray_pod("d", 0, controller=False))) is None
    assert ray_cluster_without_group(parse_pod(make_pod("plain").obj())) is None


def _world(gpus: int) -> World:
    """A session that claims KubeRay's scheduler name, and one node of ``gpus`` GPUs."""
    w = World()
    w.session = Session(SessionSettings(scheduler_names=("batchsched", "scheduler-plugins-scheduler")))
    w.node("n0", gpus)
    return w


def add(w: World, obj: dict[str, Any]) -> str:
    w.pods[obj["metadata"]["uid"]] = obj
    w.session.on_pod("ADDED", parse_pod(obj))
    return str(obj["metadata"]["uid"])


def warnings(d: Decisions) -> list[tuple[str, str, str]]:
    return [(e.ref.kind, e.ref.name, e.message) for e in d.events if e.reason == explain.NO_POD_GROUP]


def test_each_pod_and_its_raycluster_are_told_once_and_the_waiting_pods_condition_says_it() -> None:
    w = _world(8)
    head = add(w, ray_pod("llm-head", 0, now=w.now))
    workers = [add(w, ray_pod(f"llm-worker-{i}", 8, now=w.now)) for i in range(2)]
    d = w.step()
    assert sorted(warnings(d)) == sorted([
        ("RayCluster", "llm", NOTE), ("Pod", "llm-head", NOTE),
        ("Pod", "llm-worker-0", NOTE), ("Pod", "llm-worker-1", NOTE),
    ])
    [cluster] = [e.ref for e in d.events if e.ref.kind == "RayCluster"]
    assert cluster.uid == CLUSTER_UID and cluster.api_version == "ray.io/v1"
    assert all(e.type == "Warning" for e in d.events if e.reason == explain.NO_POD_GROUP)
    # placed one by one: the head and one worker run, the other worker waits, told why
    # and that its cluster has no PodGroup
    assert w.bound(head) and sum(w.bound(u) for u in workers) == 1
    [waiting] = [c for c in d.unschedulable if c.ref.uid in workers]
    assert waiting.message.endswith(NOTE), waiting.message
    assert waiting.message.startswith("0/1 nodes fit"), waiting.message
    # told once: later steps and updates of the same pods say nothing again
    w.session.on_pod("MODIFIED", parse_pod(w.pods[waiting.ref.uid]))
    assert warnings(w.step(after=1)) == []
    # a worker the autoscaler adds is told; its cluster was told already
    add(w, ray_pod("llm-worker-2", 8, now=w.now))
    assert warnings(w.step(after=1)) == [("Pod", "llm-worker-2", NOTE)]


def test_a_raycluster_whose_pods_all_went_is_told_again_of_new_ones_and_gang_members_never_are() -> None:
    w = _world(8)
    head = add(w, ray_pod("llm-head", 0, now=w.now))
    assert len(warnings(w.step())) == 2
    w.session.on_pod("DELETED", parse_pod(w.pods.pop(head)))
    add(w, ray_pod("llm-head-again", 0, now=w.now))
    assert [k for k, _, _ in warnings(w.step(after=1))] == ["RayCluster", "Pod"]
    # the pods of a cluster with its PodGroup are a gang's: nothing of the sort
    w.group("llm", 1)
    add(w, ray_pod("gang-head", 0, gang=True, now=w.now))
    assert warnings(w.step(after=1)) == []


def test_a_pod_bound_before_a_restart_is_not_told_and_one_waiting_is() -> None:
    w = _world(0)
    bound = ray_pod("llm-head", 0)
    bound["spec"]["nodeName"] = "n0"
    bound["status"]["phase"] = "Running"
    waiting = ray_pod("llm-worker-0", 8)
    w.session.on_pods_listed([parse_pod(bound), parse_pod(waiting)])
    assert sorted(warnings(w.step())) == [("Pod", "llm-worker-0", NOTE), ("RayCluster", "llm", NOTE)]
