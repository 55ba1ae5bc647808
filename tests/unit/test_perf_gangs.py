"""The perf suite's gangs: both schedulers of a gang workload get the same upstream
PodGroups, and what the watch saw is counted as a user would count it (a gang that lost
some members to preemption is partial; a gang across two racks spans them)."""

from __future__ import annotations

from typing import Any

import pytest

from perf.live import Measured, gang_figures
from perf.peers import PEERS
from perf.workload import WorkloadError, expand, parse_workload


def workload(**extra: Any) -> dict[str, Any]:
    return {
        "name": "w", "schedulers": ["batchsched", "kube-scheduler-gang"],
        "node": {"gpus": 8, "nodes_per_rack": 2},
        "classes": [
            {"name": "low", "share": 0.5, "gpus": 4, "gang": 2, "priority_class": "low-priority", "disruption": "all"},
            {"name": "high", "share": 0.5, "gpus": 4, "gang": 2, "priority_class": "high-priority", "arrival": "after",
             "topology": "batchsched.io/rack"},
        ],
        "sizes": {"s": {"nodes": 2, "pods": 8}},
        **extra,
    }


def test_batchsched_and_kube_scheduler_get_the_same_upstream_podgroups() -> None:
    ex = expand(parse_workload(workload()), "s")
    ours = PEERS["batchsched"].group_objects(ex, "perf")
    theirs = PEERS["kube-scheduler-gang"].group_objects(ex, "perf")
    assert ours == theirs
    by_name = {body["metadata"]["name"]: (path, body["spec"]) for path, body in ours}
    path, low = by_name["low-g00000"]
    assert path == "/apis/scheduling.k8s.io/v1beta1/namespaces/perf/podgroups"
    assert low == {"schedulingPolicy": {"gang": {"minCount": 2}}, "priorityClassName": "low-priority",
                   "disruptionMode": {"all": {}}}
    assert by_name["high-g00000"][1]["schedulingConstraints"] == {"topology": [{"key": "batchsched.io/rack"}]}
    # the gangs created once the cluster is full are created then, not before
    assert {b["metadata"]["name"] for _, b in PEERS["batchsched"].group_objects(ex, "perf", after=False)} == {
        "low-g00000", "low-g00001"}
    pod = PEERS["batchsched"].pod(ex.pods[0])
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "low-g00000"}
    assert pod["spec"]["priorityClassName"] == "low-priority"
    assert "coscheduling" in PEERS and PEERS["coscheduling"].unsupported(ex)


def test_each_phase_must_fit_but_together_they_may_not() -> None:
    ex = expand(parse_workload(workload()), "s")
    assert ex.gpu_demand > ex.gpu_capacity
    with pytest.raises(WorkloadError, match="arriving after need a class created before"):
        parse_workload(workload(classes=[{"name": "x", "gang": 2, "arrival": "after"}]))
    with pytest.raises(WorkloadError, match="disruption must be all or single"):
        parse_workload(workload(classes=[{"name": "x", "gang": 2, "disruption": "some"}]))


def test_the_watch_counts_preempted_partial_and_spanning_gangs() -> None:
    ex = expand(parse_workload(workload()), "s")
    m = Measured(started=100.0)
    # low-g00000 preempted whole, low-g00001 lost one member: partly preempted, partial
    m.bound = {
        "low-g00000-000": (101.0, "n0"), "low-g00000-001": (101.5, "n0"),
        "low-g00001-000": (101.0, "n1"), "low-g00001-001": (102.0, "n1"),
        "high-g00000-000": (110.0, "n0"), "high-g00000-001": (111.0, "n2"),
        "high-g00001-000": (110.0, "n2"), "high-g00001-001": (110.0, "n3"),
    }
    m.deleted = {"low-g00000-000": 109.0, "low-g00000-001": 109.0, "low-g00001-001": 109.0}
    m.after_created = {p.name: 108.0 for p in ex.pods if p.after}
    m.domains = {"batchsched.io/rack": {"n0": "r0", "n1": "r0", "n2": "r1", "n3": "r1"}}
    figures = gang_figures(ex, m, m.bound)
    assert figures["partial"] == ["low-g00001"]
    assert figures["preempted"] == ["low-g00000", "low-g00001"]
    assert figures["partly_preempted"] == ["low-g00001"]
    assert figures["spanning"] == ["high-g00000"]
    high = figures["classes"]["high"]
    assert high["first_bind_s"] == {"median": 2.0, "max": 2.0}  # from their creation, not the start
    assert high["last_bind_s"] == {"median": 2.5, "max": 3.0}
    assert figures["classes"]["low"]["first_bind_s"]["median"] == 1.0
