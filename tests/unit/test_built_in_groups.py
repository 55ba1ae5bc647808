"""A pod that joins one of Kubernetes' built-in pod groups (``spec.schedulingGroup``, the
``scheduling.k8s.io`` PodGroup of 1.36+) is refused visibly: batchsched does not schedule
those groups yet, and placed alone the pod would break the gang it asks for."""

from __future__ import annotations

from batchsched.core.model import parse_node, parse_pod
from batchsched.core.session import Session
from tests.builders import make_node, make_pod

T0 = 1_800_000_000.0
WHY = ("it joins the scheduling.k8s.io PodGroup train (spec.schedulingGroup): batchsched does not "
       "schedule Kubernetes' built-in pod groups yet; use a scheduler-plugins or Volcano PodGroup")


def _member(name: str) -> dict[str, object]:
    obj = make_pod(name).req(cpu="1").created(T0 - 10).obj()
    obj["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    return obj


def test_a_member_of_a_built_in_pod_group_is_refused_with_the_reason_and_never_placed() -> None:
    s = Session()
    s.on_node("ADDED", parse_node(make_node("n0").cap(cpu="8", memory="8Gi").obj()))
    s.on_pod("ADDED", parse_pod(_member("a")))
    s.on_pod("ADDED", parse_pod(make_pod("alone").req(cpu="1").created(T0 - 5).obj()))
    d = s.step(T0)
    assert [b.name for b in d.binds] == ["alone"]  # the rest of the cluster is scheduled
    assert [c.message for c in d.unschedulable] == [f"pod default/a cannot be scheduled: {WHY}"]
    assert s.step(T0 + 60).binds == []


def test_an_empty_scheduling_group_refuses_nothing() -> None:
    obj = make_pod("p").req(cpu="1").obj()
    obj["spec"]["schedulingGroup"] = {}
    assert parse_pod(obj).invalid == ""
