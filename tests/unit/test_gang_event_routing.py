"""Where Events about a gang go: why it waits (``FailedScheduling``) and that it was placed
(``Scheduled``) reach the objects its users describe: the PodGroup, the job that owns it
(its ``controller`` owner: a PyTorchJob, a RayCluster...), and for a Kueue pod group the
Workload Kueue made for it. Each is named exactly (kind, version, name, namespace, uid),
as ``kubectl describe`` looks Events up, and told a reason once, not at every cycle."""

from __future__ import annotations

import asyncio
from typing import Any

from batchsched.core.decisions import Decisions, EventNote, gang_refs
from batchsched.core.gangs import XK8S, PodGroup, parse_podgroup
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.plan import ObjectRef
from batchsched.core.session import Session, SessionSettings
from batchsched.kube.fake import FakeKube
from batchsched.kube.status import StatusWriter
from tests.builders import make_group, make_node, make_pod

T0 = 1_800_000_000.0
GPU = "nvidia.com/gpu"
PYTORCHJOB = ObjectRef(kind="PyTorchJob", api_version="kubeflow.org/v1", namespace="default", name="llama",
                       uid="job-uid")
RAYCLUSTER = ObjectRef(kind="RayCluster", api_version="ray.io/v1", namespace="default", name="llama",
                       uid="ray-uid")


def owned(name: str, owner: ObjectRef | None, *, min_member: int = 2, others: tuple[dict[str, Any], ...] = ()) -> PodGroup:
    """A scheduler-plugins PodGroup as an operator makes it: owned by its job (``controller``),
    beside any ``others`` owner references."""
    obj = make_group(name).uid(f"{name}-group-uid").min_member(min_member).obj()
    refs = list(others)
    if owner is not None:
        refs.append({"apiVersion": owner.api_version, "kind": owner.kind, "name": owner.name, "uid": owner.uid,
                     "controller": True, "blockOwnerDeletion": True})
    obj["metadata"]["ownerReferences"] = refs
    return parse_podgroup(XK8S, obj)


def group_object(name: str) -> ObjectRef:
    return ObjectRef(kind="PodGroup", api_version="scheduling.x-k8s.io/v1alpha1", namespace="default", name=name,
                     uid=f"{name}-group-uid")


class World:
    """A session with nodes of 8 GPUs and a gang whose members ask 8 GPUs each."""

    def __init__(self, nodes: int, *, report_delay: float = 1.0) -> None:
        self.session = Session(SessionSettings(gang_report_delay=report_delay))
        self.now = T0
        self.events: list[EventNote] = []
        self.bound: dict[str, str] = {}
        for i in range(nodes):
            self.node(f"n{i}")

    def node(self, name: str) -> None:
        self.session.on_node("ADDED", parse_node(make_node(name).cap(cpu="64", memory="512Gi", **{GPU: "8"}).obj()))

    def members(self, group: str, count: int, *, kueue: bool = False, gated: bool = False,
                kind: str = "ADDED") -> None:
        for i in range(count):
            b = make_pod(f"{group}-{i}").uid(f"{group}-{i}").req(cpu="1", **{GPU: "8"}).created(T0 - 60)
            if gated:
                b = b.gate("kueue.x-k8s.io/admission")
            if kueue:
                b = b.label({"kueue.x-k8s.io/pod-group-name": group}).annotate(
                    {"kueue.x-k8s.io/pod-group-total-count": str(count)})
            else:
                b = b.group(group)
            self.session.on_pod(kind, parse_pod(b.obj()))

    def step(self, after: float = 0.0) -> Decisions:
        self.now += after
        d = self.session.step(self.now)
        self.events.extend(d.events)
        for b in d.binds:
            self.bound[b.name] = b.node
        return d

    def told(self, reason: str, ref: ObjectRef) -> list[str]:
        return [e.message for e in self.events if e.reason == reason and e.ref == ref]


# -- who the group's Events go to --------------------------------------------------------


def test_the_controller_owner_is_read_exactly_and_other_owners_are_not() -> None:
    plain = {"apiVersion": "v1", "kind": "ConfigMap", "name": "settings", "uid": "cm-uid"}
    group = owned("llama", PYTORCHJOB, others=(plain,))
    assert group.owner == PYTORCHJOB
    assert gang_refs(group) == (group_object("llama"), PYTORCHJOB)
    # an owner that is not the controller is nobody's job
    assert owned("llama", None, others=(plain,)).owner is None
    assert gang_refs(owned("llama", None)) == (group_object("llama"),)
    # a controller reference without its uid cannot name its object for kubectl describe
    broken = {**plain, "kind": "PyTorchJob", "uid": "", "controller": True}
    assert owned("llama", None, others=(broken,)).owner is None


def test_a_kueue_pod_group_tells_the_workload_named_after_it() -> None:
    w = World(nodes=1)
    w.members("batch", 2, kueue=True)
    [group] = w.session.groups.groups.values()
    [workload] = gang_refs(group)
    assert (workload.kind, workload.api_version, workload.namespace, workload.name) == (
        "Workload", "kueue.x-k8s.io/v1beta2", "default", "batch")
    # its uid is not known here: the status writer reads it when it writes the Event
    assert workload.uid == ""


# -- why it waits, and that it was placed -----------------------------------------------


def test_a_pytorchjob_that_cannot_fit_is_told_why_once_then_that_it_was_placed() -> None:
    w = World(nodes=1)
    w.session.on_podgroup("ADDED", owned("llama", PYTORCHJOB))
    w.members("llama", 2)
    waited = ("gang needs 2 pods (2 cpu, 16 nvidia.com/gpu) placed together; only 1 fit now. "
              "Member llama-1: 0/1 nodes fit: 1 insufficient nvidia.com/gpu.")
    statuses: list[str] = []
    for _ in range(40):  # two minutes of steps: the gang is tried again and again
        d = w.step(after=3.0)
        statuses += [s.message for g, s in d.group_statuses if g.name == "llama"]
    told = w.told("FailedScheduling", PYTORCHJOB)
    assert told == [waited]
    # the job is told what the PodGroup's condition says, and so is the PodGroup
    assert told[0] == statuses[-1]
    assert w.told("FailedScheduling", group_object("llama")) == told
    assert [e.type for e in w.events if e.reason == "FailedScheduling" and e.ref == PYTORCHJOB] == ["Warning"]
    assert w.bound == {}

    w.node("n1")
    w.step(after=3.0)
    w.step(after=3.0)
    assert sorted(w.bound) == ["llama-0", "llama-1"]
    assert w.told("Scheduled", PYTORCHJOB) == ["placed 2 members as one gang (quorum 2)"]
    assert w.told("Scheduled", group_object("llama")) == ["placed 2 members as one gang (quorum 2)"]


def test_a_raycluster_is_told_why_its_gang_waits() -> None:
    w = World(nodes=1)
    w.session.on_podgroup("ADDED", owned("llama", RAYCLUSTER, min_member=3))
    w.members("llama", 3)
    for _ in range(5):
        w.step(after=2.0)
    [told] = w.told("FailedScheduling", RAYCLUSTER)
    assert told.startswith("gang needs 3 pods") and "only 1 fit now" in told
    [event] = [e for e in w.events if e.ref == RAYCLUSTER]
    assert event.ref.kind == "RayCluster" and event.ref.api_version == "ray.io/v1" and event.ref.uid == "ray-uid"


def test_a_job_being_created_is_not_told_its_pods_are_missing_but_one_whose_pods_stay_missing_is() -> None:
    w = World(nodes=1)
    w.session.on_podgroup("ADDED", owned("llama", PYTORCHJOB))
    w.members("llama", 1)  # the operator has made one pod of two so far
    w.step(after=0.5)
    assert w.told("FailedScheduling", PYTORCHJOB) == []
    w.members("llama", 2)  # ... and the other, within the report delay: never reported missing
    for _ in range(4):
        w.step(after=0.5)
    [told] = w.told("FailedScheduling", PYTORCHJOB)
    assert "only 1 fit now" in told
    # a job whose pods stay missing is told so, once its reason held for the delay
    bert = ObjectRef("PyTorchJob", "kubeflow.org/v1", "default", "bert", "bert-uid")
    w.session.on_podgroup("ADDED", owned("bert", bert, min_member=3))
    w.members("bert", 1)
    for _ in range(4):
        w.step(after=0.5)
    assert w.told("FailedScheduling", bert) == ["waiting for pods: 1 of 3 required members exist"]


def test_a_kueue_pod_group_waiting_for_room_tells_its_workload() -> None:
    w = World(nodes=1)
    workload = ObjectRef("Workload", "kueue.x-k8s.io/v1beta2", "default", "batch", "")
    # before Kueue admits it, its members are gated: Kueue says why it waits, not batchsched
    w.members("batch", 2, kueue=True, gated=True)
    for _ in range(5):
        w.step(after=2.0)
    assert w.told("FailedScheduling", workload) == []
    w.members("batch", 2, kueue=True, kind="MODIFIED")  # admitted: the gates are gone
    for _ in range(10):
        w.step(after=2.0)
    [told] = w.told("FailedScheduling", workload)
    assert told.startswith("gang needs 2 pods") and "only 1 fit now" in told
    w.node("n1")
    w.step(after=3.0)
    assert w.told("Scheduled", workload) == ["placed 2 members as one gang (quorum 2)"]


# -- the uid of a Workload, read when its Event is written --------------------------------


def test_an_event_about_a_workload_carries_the_uid_read_from_it() -> None:
    workload = ObjectRef("Workload", "kueue.x-k8s.io/v1beta2", "ns", "batch", "")
    path = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/batch"

    async def main() -> list[dict[str, Any]]:
        kube = FakeKube()
        kube.objects[path] = {"metadata": {"name": "batch", "namespace": "ns", "uid": "wl-uid"}}
        writer = StatusWriter(kube, instance="test-0")
        task = asyncio.get_running_loop().create_task(writer.run())
        try:
            writer.event(workload, type="Warning", reason="FailedScheduling", message="only 1 fit now")
            assert await writer.drain(1.0)
            del kube.objects[path]  # gone (or not made yet): the Event is still written
            writer.event(workload, type="Normal", reason="Scheduled", message="placed")
            assert await writer.drain(1.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return [c.body["involvedObject"] for c in kube.calls if c.method == "POST"]

    first, second = asyncio.run(main())
    assert first == {"kind": "Workload", "apiVersion": "kueue.x-k8s.io/v1beta2", "name": "batch",
                     "namespace": "ns", "uid": "wl-uid"}
    assert "uid" not in second
