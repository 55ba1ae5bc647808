"""``batchsched simulate --snapshot``: a snapshot holding Kubernetes' own pod groups
(``scheduling.k8s.io/v1beta1``) replays them as the scheduler places them: whole or not at
all, and a rack-constrained gang inside one rack."""

from __future__ import annotations

from typing import Any

from batchsched.kube.snapshot import COLLECTIONS
from batchsched.simulate import snapshot as replay_snapshot
from tests.builders import GPU, make_node, make_pod
from tests.unit.test_upstream_groups import podgroup

RACK = "batchsched.io/rack"


def member(name: str, gpus: int, group: str, *, node: str = "") -> dict[str, Any]:
    obj = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).obj()
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    obj["spec"]["schedulerName"] = "batchsched"
    if node:
        obj["spec"]["nodeName"] = node
        obj["status"]["phase"] = "Running"
    return obj


def snapshot(nodes: dict[str, str], groups: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """A snapshot as ``batchsched snapshot`` writes it; ``nodes``: name -> rack."""
    objects: dict[str, list[dict[str, Any]]] = {name: [] for name in COLLECTIONS}
    objects["nodes"] = [make_node(n).cap(cpu="64", memory="512Gi", **{GPU: "8"}).label({RACK: rack}).obj()
                        for n, rack in nodes.items()]
    objects["podgroups.scheduling.k8s.io"] = groups
    objects["pods"] = pods
    return {"kind": "BatchschedSnapshot", "version": 1, "config": {}, "objects": objects}


def names(snap: dict[str, Any], placed: dict[str, Any]) -> dict[str, str]:
    by_uid = {p["metadata"]["uid"]: p["metadata"]["name"] for p in snap["objects"]["pods"]}
    return {by_uid[uid]: where.node for uid, where in placed.items()}


def test_the_snapshot_collects_the_upstream_podgroups() -> None:
    assert COLLECTIONS["podgroups.scheduling.k8s.io"] == "/apis/scheduling.k8s.io/v1beta1/podgroups"


def test_an_upstream_gang_in_a_snapshot_replays_whole_or_not_at_all() -> None:
    pods = [member(f"fits-{i}", 8, "fits") for i in range(2)] + [member(f"big-{i}", 8, "big") for i in range(4)]
    snap = snapshot({"n0": "r0", "n1": "r0", "n2": "r1"}, [podgroup("fits", 2), podgroup("big", 4)], pods)
    placed = names(snap, replay_snapshot.replay(snap, now=0.0, use_jit=False))
    # three nodes: the gang of two fits; the gang of four cannot, and no member of it is placed
    assert sorted(placed) == ["fits-0", "fits-1"], placed


def test_a_topology_constrained_upstream_gang_replays_inside_one_rack() -> None:
    filler = member("filler", 4, "fill", node="a1")  # rack a has one whole node left, rack b two
    tight = [member(f"tight-{i}", 8, "tight") for i in range(2)]
    groups = [podgroup("fill", 1),
              podgroup("tight", 2, schedulingConstraints={"topology": [{"key": RACK}]})]
    snap = snapshot({"a0": "rack-a", "b0": "rack-b", "b1": "rack-b", "a1": "rack-a"}, groups, [filler, *tight])
    placed = names(snap, replay_snapshot.replay(snap, now=0.0, use_jit=False))
    assert sorted(placed) == ["tight-0", "tight-1"] and {placed["tight-0"], placed["tight-1"]} == {"b0", "b1"}, placed


def test_a_scenario_gang_may_be_written_in_kubernetes_own_api() -> None:
    from batchsched.simulate import scenario

    doc = {
        "nodes": [{"prefix": "gpu", "count": 2, "gpus": 8, "cpu": 64}],
        "jobs": [
            {"name": "first", "at": 0, "duration": 100, "pods": 1, "gpus": 8},
            {"name": "up", "at": 10, "duration": 100, "pods": 2, "gpus": 8, "minMember": 2, "api": "scheduling.k8s.io"},
            {"name": "small", "at": 20, "duration": 30, "pods": 1, "gpus": 8, "priority": 100},
        ],
    }
    r = scenario.run(doc, use_jit=False)
    # the gang takes no node while it cannot have both: the small job gets the free one at once,
    # without evicting anything, and the gang starts whole when the first job ends
    assert r.jobs["small"].started == 20 and r.jobs["up"].evictions == 0 and r.jobs["up"].started == 100
    doc["jobs"][1]["api"] = "scheduling.example.io"
    try:
        scenario.run(doc, use_jit=False)
    except ValueError as exc:
        assert "api must be one of scheduling.x-k8s.io, scheduling.k8s.io" in str(exc)
    else:
        raise AssertionError("an unknown api was accepted")
