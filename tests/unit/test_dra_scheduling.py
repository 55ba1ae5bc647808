"""Pods with DRA ResourceClaims, scheduled by the Session: claims allocated on the node the
pod is placed on (written before its Binding, as the apiserver then shows them), whole
gangs, MIG partitions sharing their GPU's counters, a restart that rebuilds every device's
use from the claims alone, a Binding that fails, and claims that are not there yet.

The world applies the scheduler's writes as the apiserver would: a claim's status gets the
allocation and reservation a Binding carries, then the pod is bound."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from batchsched.core.dra.book import class_column
from batchsched.core.dra.objects import (
    parse_device_class,
    parse_resource_claim,
    parse_resource_slice,
)
from batchsched.core.gangs import XK8S, parse_podgroup
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_node, make_pod

DRIVER = "gpu.nvidia.com"
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression":
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]},
}
MIG_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression":
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]},
}


def gpu_slice(node: str, gpus: int = 8, *, mig: bool = False, memory: list[str] | None = None) -> dict[str, Any]:
    """A node's GPUs as one slice; with ``mig``, each GPU also offers two 3g partitions that
    consume its counters (so the GPU whole and its partitions are never both handed out);
    ``memory``: each GPU's (40Gi each by default)."""
    devices: list[dict[str, Any]] = []
    counters = []
    for i in range(gpus):
        mem = memory[i] if memory else "40Gi"
        gpu: dict[str, Any] = {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}},
                               "capacity": {"memory": {"value": mem}}}
        if mig:
            counters.append({"name": f"gpu-{i}-counters", "counters": {"memory": {"value": "40Gi"}}})
            gpu["consumesCounters"] = [{"counterSet": f"gpu-{i}-counters", "counters": {"memory": {"value": "40Gi"}}}]
            for p in range(2):
                devices.append({
                    "name": f"gpu-{i}-mig-3g-{p}",
                    "attributes": {"type": {"string": "mig"}, "profile": {"string": "3g.20gb"}, "index": {"int": i}},
                    "capacity": {"memory": {"value": "20Gi"}},
                    "consumesCounters": [{"counterSet": f"gpu-{i}-counters", "counters": {"memory": {"value": "20Gi"}}}],
                })
        devices.append(gpu)
    spec: dict[str, Any] = {"driver": DRIVER, "nodeName": node,
                            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    if counters:
        spec["sharedCounters"] = counters
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com", "uid": f"slice-{node}"}, "spec": spec}


class DraWorld:
    """A session, nodes publishing GPUs by DRA, and the apiserver's side of its writes."""

    def __init__(self) -> None:
        self.session = Session(SessionSettings(), use_jit=False)
        self.now = 1_800_000_000.0
        self.pods: dict[str, dict[str, Any]] = {}
        self.claims: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.queues: list[dict[str, Any]] = []
        self.session.on_device_classes_listed([parse_device_class(GPU_CLASS), parse_device_class(MIG_CLASS)])

    def _rv(self) -> str:
        self.version += 1
        return str(self.version)

    def node(self, name: str, gpus: int = 8, *, mig: bool = False, memory: list[str] | None = None) -> None:
        self.session.on_node("ADDED", parse_node(make_node(name).cap(cpu="64", memory="512Gi").obj()))
        self.session.on_resource_slice("ADDED", parse_resource_slice(gpu_slice(name, gpus, mig=mig, memory=memory)))

    def claim(self, name: str, count: int = 1, *, device_class: str = "gpu.nvidia.com",
              **extra: Any) -> None:
        request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count, **extra}}
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": "default", "uid": f"claim-{name}", "resourceVersion": self._rv()},
               "spec": {"devices": {"requests": [request]}}, "status": {}}
        self.claims[name] = obj
        self.session.on_resource_claim("ADDED", parse_resource_claim(obj))

    def pod(self, name: str, *claims: str, template: str = "", group: str = "", priority: int = 0,
            queue: str = "") -> str:
        b = make_pod(name).req(cpu="1").created(self.now).priority(priority)
        if group:
            b = b.group(group)
        if queue:
            b = b.label({"batchsched.io/queue": queue})
        obj = b.obj()
        if template:
            obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        else:
            obj["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
        self.pods[obj["metadata"]["uid"]] = obj
        self.session.on_pod("ADDED", parse_pod(obj))
        return str(obj["metadata"]["uid"])

    def step(self, after: float = 1.0, *, refuse: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
        """A step; its claim writes and Bindings applied (those of pods in ``refuse``: the
        Binding refused, after its claims were written and put back, as the binder does)."""
        self.now += after
        d = self.session.step(self.now)
        for b in d.binds:
            obj = self.pods[b.uid]
            if b.uid in refuse:
                self.session.on_bind_result(b, "failed", now=self.now, error="refused")
                continue
            for w in b.claims:
                if w.create is not None:
                    w = self.create(w)
                claim = self.claims[w.name]
                assert claim["metadata"]["resourceVersion"] == w.resource_version  # the precondition
                if w.allocation is not None:
                    claim["status"]["allocation"] = copy.deepcopy(dict(w.allocation))
                claim["status"]["reservedFor"] = [dict(r) for r in w.reserved_for]
                claim["metadata"]["resourceVersion"] = self._rv()
                self.session.on_resource_claim("MODIFIED", parse_resource_claim(claim))
            obj["spec"]["nodeName"] = b.node
            obj["status"]["phase"] = "Running"
            self.session.on_bind_result(b, "bound", now=self.now)
            self.session.on_pod("MODIFIED", parse_pod(obj))
        for e in d.evictions:
            self.session.on_evict_result(e, "evicted")
            self.delete(e.uid)
        return d

    def create(self, w: Any) -> Any:
        """The claim the scheduler makes for a pod's extended resources, made as the
        apiserver makes it (a name from its generateName); the write, named."""
        obj = copy.deepcopy(dict(w.create))
        name = obj["metadata"].pop("generateName") + f"x{len(self.claims)}"
        obj["metadata"].update(name=name, uid=f"claim-{name}", resourceVersion=self._rv())
        obj["status"] = {}
        self.claims[name] = obj
        self.session.on_resource_claim("ADDED", parse_resource_claim(obj))
        return dataclasses.replace(w, name=name, uid=obj["metadata"]["uid"],
                                   resource_version=obj["metadata"]["resourceVersion"], create=None)

    def delete(self, uid: str) -> None:
        """The pod gone; kube-controller-manager then drops it from its claims' reservations
        and deallocates a claim reserved for nobody; the claims it owns go with it."""
        obj = self.pods.pop(uid)
        self.session.on_pod("DELETED", parse_pod(obj))
        for name, claim in list(self.claims.items()):
            if any(o["uid"] == uid for o in claim["metadata"].get("ownerReferences", [])):
                del self.claims[name]
                self.session.on_resource_claim("DELETED", parse_resource_claim(claim))
        for claim in self.claims.values():
            status = claim["status"]
            if not any(r["uid"] == uid for r in status.get("reservedFor", [])):
                continue
            status["reservedFor"] = [r for r in status["reservedFor"] if r["uid"] != uid]
            if not status["reservedFor"]:
                status.pop("reservedFor")
                status.pop("allocation", None)
            claim["metadata"]["resourceVersion"] = self._rv()
            self.session.on_resource_claim("MODIFIED", parse_resource_claim(claim))

    def node_of(self, uid: str) -> str:
        return str(self.pods[uid]["spec"].get("nodeName") or "")

    def devices_of(self, claim: str) -> list[str]:
        alloc = self.claims[claim]["status"].get("allocation") or {}
        return [r["device"] for r in alloc.get("devices", {}).get("results", [])]

    def told(self, d: Any, uid: str) -> str:
        return next((c.message for c in d.unschedulable if c.ref.uid == uid), "")

    def restart(self) -> None:
        """A new scheduler: everything listed again from the apiserver's objects."""
        old = self.session
        self.session = Session(SessionSettings(), use_jit=False)
        self.session.on_device_classes_listed([parse_device_class(GPU_CLASS), parse_device_class(MIG_CLASS)])
        self.session.on_queues_listed(self.queues)
        self.session.on_nodes_listed(list(old.intake.devices.nodes.values()))  # as the apiserver has them
        self.session.on_resource_slices_listed(list(old.intake.devices.slices.values()))
        self.session.on_resource_claims_listed([parse_resource_claim(c) for c in self.claims.values()])
        self.session.on_pods_listed([parse_pod(p) for p in self.pods.values()])


def free(w: DraWorld, node: str, column: str) -> int:
    """What the mirror says is free of ``column`` on ``node``."""
    st = w.session.state
    row, col = st.node_row[node], st.columns.index(column)
    return int(st.alloc[row, col] - st.used[row, col])


def test_a_pod_gets_the_devices_of_its_claim_on_the_node_it_is_bound_to() -> None:
    w = DraWorld()
    w.node("n0")
    w.claim("train", 2)
    uid = w.pod("p", "train")
    d = w.step()
    assert w.node_of(uid) == "n0"
    [b] = d.binds
    [write] = b.claims
    assert write.name == "train" and write.uid == "claim-train"
    assert write.reserved_for == ({"resource": "pods", "name": "p", "uid": uid},)
    assert sorted(w.devices_of("train")) == ["gpu-0", "gpu-1"]
    alloc = w.claims["train"]["status"]["allocation"]
    assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n0"]


def test_two_pods_never_get_the_same_device_and_a_third_waits_told_why() -> None:
    w = DraWorld()
    w.node("n0", 4)
    for name in ("a", "b", "c"):
        w.claim(name, 2)
    a, b = w.pod("a", "a"), w.pod("b", "b")
    w.step()
    assert w.node_of(a) == w.node_of(b) == "n0"
    assert not set(w.devices_of("a")) & set(w.devices_of("b"))
    c = w.pod("c", "c")
    d = w.step()
    assert not w.node_of(c)
    assert w.told(d, c).startswith(f"0/1 nodes fit: 1 insufficient {class_column('gpu.nvidia.com')}; "
                                   "holds a reservation on node(s) n0")


def test_a_gang_with_claims_is_placed_whole_or_not_at_all() -> None:
    w = DraWorld()
    w.node("n0", 8)
    w.session.on_podgroup("ADDED", parse_podgroup(XK8S, make_group("big").min_member(3).obj()))
    for i in range(3):
        w.claim(f"big-{i}", 4)
    members = [w.pod(f"big-{i}", f"big-{i}", group="big") for i in range(3)]
    w.step()
    assert not any(w.node_of(u) for u in members), "a gang of 3 x 4 GPUs must not be bound partly on 8 GPUs"
    assert all(not w.claims[f"big-{i}"]["status"].get("allocation") for i in range(3))
    w.session.on_podgroup("ADDED", parse_podgroup(XK8S, make_group("pair").min_member(2).obj()))
    for i in range(2):
        w.claim(f"pair-{i}", 4)
    pair = [w.pod(f"pair-{i}", f"pair-{i}", group="pair") for i in range(2)]
    w.step(after=5)
    assert all(w.node_of(u) == "n0" for u in pair)
    assert not set(w.devices_of("pair-0")) & set(w.devices_of("pair-1"))


def test_a_whole_gpu_and_its_mig_partitions_are_never_both_handed_out() -> None:
    w = DraWorld()
    w.node("n0", 1, mig=True)
    w.claim("whole", 1)
    w.claim("part", 1, device_class="mig.nvidia.com")
    whole = w.pod("whole", "whole")
    w.step()
    assert w.node_of(whole) == "n0"
    part = w.pod("part", "part")
    w.step()
    assert not w.node_of(part), "the GPU is held whole: none of its partitions is free"
    w.node("n1", 1, mig=True)
    w.step(after=5)
    assert w.node_of(part) == "n1"
    assert w.devices_of("part")[0].startswith("gpu-0-mig-3g-")


def test_a_restarted_scheduler_rebuilds_device_use_from_the_claims() -> None:
    w = DraWorld()
    w.node("n0", 2)
    w.claim("first", 2)
    first = w.pod("first", "first")
    w.step()
    assert w.node_of(first) == "n0"
    w.restart()
    w.claim("second", 1)
    second = w.pod("second", "second")
    w.step()
    assert not w.node_of(second), "both GPUs are held by the first claim, as its status says"
    assert free(w, "n0", class_column("gpu.nvidia.com")) == 0
    assert w.session.state.nodes["n0"].allocatable[class_column("gpu.nvidia.com")] == 2  # held by the first pod


def test_a_refused_binding_gives_its_devices_back() -> None:
    w = DraWorld()
    w.node("n0", 2)
    w.claim("a", 2)
    w.claim("b", 2)
    a = w.pod("a", "a")
    d = w.step(refuse={a})
    assert [len(b.claims) for b in d.binds] == [1]
    assert not w.node_of(a)
    assert not w.session.intake.devices.assumed
    # the devices its claim was to get are free: a later pod gets them
    b = w.pod("b", "b", priority=10)
    w.step(after=30)
    assert w.node_of(b) == "n0" and not w.node_of(a)
    assert sorted(w.devices_of("b")) == ["gpu-0", "gpu-1"]


def test_a_pod_waits_for_the_claim_its_template_makes_then_is_placed() -> None:
    w = DraWorld()
    w.node("n0")
    uid = w.pod("p", template="one-gpu")
    d = w.step()
    assert not w.node_of(uid)
    assert "to be made from ResourceClaimTemplate one-gpu" in w.told(d, uid)
    # kube-controller-manager makes the claim and names it in the pod's status
    w.claim("p-gpu-x7k2q", 1)
    w.pods[uid]["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2q"}]
    w.session.on_pod("MODIFIED", parse_pod(w.pods[uid]))
    w.step(after=30)
    assert w.node_of(uid) == "n0"
    assert len(w.devices_of("p-gpu-x7k2q")) == 1


def test_a_claim_no_node_can_serve_is_told_at_once() -> None:
    w = DraWorld()
    w.node("n0", 2)
    w.claim("huge", 4)
    uid = w.pod("p", "huge")
    d = w.step()
    assert not w.node_of(uid)
    assert "cannot be allocated on any of 1 nodes" in w.told(d, uid)


def test_a_claim_taking_all_of_more_devices_than_a_claim_holds_on_any_node_is_refused_not_placed_elsewhere() -> None:
    """As kube-scheduler: a request of ``allocationMode: All`` that matches more than 32
    devices on one node it may go to is an error of the claim, so the pod is refused
    even though a smaller node would hold every matching device (found by the
    differential test against kube-scheduler: world 24 of seed 523479, MIG partitions)."""
    w = DraWorld()
    w.node("big", 40)
    w.node("small", 4)
    w.claim("every", allocationMode="All")
    uid = w.pod("p", "every")
    d = w.step()
    assert not w.node_of(uid)
    told = w.told(d, uid)
    assert "claim default/every asks for 40 devices on node big, more than the 32 one claim may hold" in told, told
    # with the big node gone (its slice goes with it) the same claim fits the small one
    w.session.on_node("DELETED", parse_node(make_node("big").obj()))
    w.session.on_resource_slice("DELETED", parse_resource_slice(gpu_slice("big", 40)))
    w.step(after=60.0)
    assert w.node_of(uid) == "small"
    assert len(w.devices_of("every")) == 4


def test_a_gang_one_of_whose_claims_is_in_error_waits_whole_told_why() -> None:
    """The claim error above, met by a gang: one member's claim takes all of more GPUs than
    a claim may hold on a node the gang may go to; no member is bound (not even those whose
    claims fit), no claim is allocated, and the member in error says why."""
    w = DraWorld()
    w.node("big", 40)
    w.node("small", 4)
    w.session.on_podgroup("ADDED", parse_podgroup(XK8S, make_group("g").min_member(2).obj()))
    w.claim("one", 1)
    w.claim("every", allocationMode="All")
    fine = w.pod("g-0", "one", group="g")
    wrong = w.pod("g-1", "every", group="g")
    d = w.step()
    assert not w.node_of(fine) and not w.node_of(wrong)
    assert not w.devices_of("one") and not w.devices_of("every")
    told = w.told(d, wrong)
    assert "asks for 40 devices on node big, more than the 32 one claim may hold" in told, told


def test_an_urgent_pod_preempts_the_pod_holding_its_devices_and_gets_them() -> None:
    w = DraWorld()
    w.node("n0", 2)
    w.claim("low", 2)
    w.claim("urgent", 2)
    low = w.pod("low", "low")
    w.step()
    assert w.node_of(low) == "n0"
    urgent = w.pod("urgent", "urgent", priority=1000)
    d = w.step(after=5)
    assert [e.name for e in d.evictions] == ["low"], "evicting the low pod frees the devices its claim holds"
    assert low not in w.pods
    w.step(after=5)
    assert w.node_of(urgent) == "n0"
    assert sorted(w.devices_of("urgent")) == ["gpu-0", "gpu-1"]


def test_a_gang_preempts_whole_pods_holding_devices_on_two_nodes() -> None:
    w = DraWorld()
    for n in ("n0", "n1"):
        w.node(n, 2)
    lows = []
    for i in range(2):
        w.claim(f"low-{i}", 2)
        lows.append(w.pod(f"low-{i}", f"low-{i}"))
    w.step()
    assert {w.node_of(u) for u in lows} == {"n0", "n1"}
    w.session.on_podgroup("ADDED", parse_podgroup(XK8S, make_group("urgent").min_member(2).obj()))
    members = []
    for i in range(2):
        w.claim(f"urgent-{i}", 2)
        members.append(w.pod(f"urgent-{i}", f"urgent-{i}", group="urgent", priority=1000))
    d = w.step(after=5)
    assert sorted(e.name for e in d.evictions) == ["low-0", "low-1"]
    w.step(after=5)
    assert {w.node_of(u) for u in members} == {"n0", "n1"}


def test_a_queue_quota_over_a_device_class_holds() -> None:
    w = DraWorld()
    w.node("n0", 8)
    column = class_column("gpu.nvidia.com")
    w.queues = [{
        "apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team"},
        "spec": {"resources": [{"name": column, "nominal": 3}]},
    }]
    w.session.on_queues_listed(w.queues)
    for name in ("a", "b", "c"):
        w.claim(name, 1 if name != "c" else 2)
    a, b = w.pod("a", "a", queue="team"), w.pod("b", "b", queue="team")
    w.step()
    assert w.node_of(a) and w.node_of(b)
    # a restarted scheduler counts the devices the running pods' claims hold against the quota
    w.restart()
    c = w.pod("c", "c", queue="team")
    d = w.step(after=5)
    assert not w.node_of(c), "2 GPUs held of a quota of 3: a claim of 2 more waits"
    assert "team" in w.told(d, c)
    w.delete(a)
    w.step(after=30)
    assert w.node_of(c) == "n0"


def test_a_pod_refused_by_the_devices_of_one_node_goes_to_another_in_the_same_cycle() -> None:
    """The class column counts a node's free GPUs, not which of them a request's selector
    accepts: node a has two free 40Gi GPUs left, the pod wants two of 80Gi. Placed on a
    first (it packs), its claim cannot be allocated there; it goes to b at once."""
    w = DraWorld()
    w.node("a", 4, memory=["80Gi", "80Gi", "40Gi", "40Gi"])
    w.node("b", 2, memory=["80Gi", "80Gi"])
    big = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"
    w.claim("first", 2, selectors=[{"cel": {"expression": big}}])
    w.claim("second", 2, selectors=[{"cel": {"expression": big}}])
    first = w.pod("first", "first")
    w.step()
    assert w.node_of(first) in ("a", "b")
    second = w.pod("second", "second")
    w.step()
    assert {w.node_of(first), w.node_of(second)} == {"a", "b"}
    assert all(d in ("gpu-0", "gpu-1") for d in w.devices_of("second") + w.devices_of("first"))


def test_explain_says_which_devices_a_waiting_job_asks_for() -> None:
    from batchsched.insight.explain import Insight, summary

    w = DraWorld()
    w.node("n0", 2)
    w.claim("all", 2)
    w.claim("more", 2)
    w.pod("first", "all")
    w.step()
    w.pod("second", "more")
    w.step(after=5)
    insight = Insight(w.session, use_jit=False)
    insight.refresh(w.now)
    out = insight.explain(w.now, kind="pod", namespace="default", name="second")
    assert out["job"]["devices"] == {"gpu.nvidia.com": 2}
    lines = summary(out["job"], out.get("queue"), out.get("ahead") or [])
    assert "asking 0 GPU(s) and 2 device(s) of DeviceClass gpu.nvidia.com" in lines[1]
    assert "insufficient deviceclass.resource.kubernetes.io/gpu.nvidia.com" in out["job"]["message"]


def test_claims_of_capacity_share_one_gpu_until_its_memory_is_spent() -> None:
    """A device shared by capacity (``allowMultipleAllocations``, 40Gi) serves two claims
    of 16Gi in one cycle; the third waits, told which capacity is short."""
    from batchsched.sandbox import gpudra

    w = DraWorld()
    w.session.on_node("ADDED", parse_node(make_node("s0").cap(cpu="64", memory="512Gi").obj()))
    for body in gpudra.shared_gpu_slices("s0", gpus=1):
        w.session.on_resource_slice("ADDED", parse_resource_slice(body))
    spec = gpudra.device_claim("gpu.nvidia.com", capacity={"memory": "16Gi"},
                               selectors=["device.allowMultipleAllocations"])
    uids = []
    for i in range(3):
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"cu{i}", "resourceVersion": w._rv()},
               "spec": spec, "status": {}}
        w.claims[f"c{i}"] = obj
        w.session.on_resource_claim("ADDED", parse_resource_claim(obj))
        uids.append(w.pod(f"p{i}", f"c{i}"))
    d = w.step()
    assert [w.node_of(u) for u in uids] == ["s0", "s0", ""]
    shares = [w.claims[f"c{i}"]["status"]["allocation"]["devices"]["results"][0] for i in range(2)]
    assert shares[0]["device"] == shares[1]["device"] and shares[0]["shareID"] != shares[1]["shareID"]
    assert shares[0]["consumedCapacity"]["memory"] == "16Gi"
    assert "without enough capacity left" in w.told(d, uids[2])


def test_nodes_that_refused_a_pods_devices_are_not_tried_again_until_their_devices_change() -> None:
    """Four nodes each have their one 80Gi GPU in use and 40Gi GPUs free, so their class
    column shows room; the pod wants an 80Gi GPU, free only on node z. Each cycle tries at
    most three nodes: the nodes that refused it are remembered, so the second cycle reaches
    z instead of trying the same three again (without that, the holders themselves are
    never all placed)."""
    w = DraWorld()
    big = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"
    for name in ("a", "b", "c", "d"):
        w.node(name, 3, memory=["80Gi", "40Gi", "40Gi"])
        w.claim(f"hold-{name}", 1, selectors=[{"cel": {"expression": big}}])
        w.pod(f"hold-{name}", f"hold-{name}")
    for _ in range(3):  # the holders themselves meet the refusals (three nodes a cycle)
        w.step(after=30)
    assert sorted(w.node_of(u) for u in w.pods) == ["a", "b", "c", "d"]
    w.node("z", 1, memory=["80Gi"])
    w.claim("want", 1, selectors=[{"cel": {"expression": big}}])
    want = w.pod("want", "want")
    d = w.step()
    first = w.node_of(want)
    if not first:
        assert "cannot be allocated on node" in w.told(d, want)
        for _ in range(2):  # after its back-off
            w.step(after=30)
    assert w.node_of(want) == "z"


def test_a_pod_kept_to_some_nodes_has_its_claims_tried_there_only() -> None:
    """A pod whose nodeSelector allows one small node is told its claims fit on none of the
    nodes it may go to; a large node elsewhere that could serve them does not count."""
    w = DraWorld()
    w.session.on_node("ADDED", parse_node(make_node("small").cap(cpu="64", memory="512Gi").label({"rack": "a"}).obj()))
    w.session.on_resource_slice("ADDED", parse_resource_slice(gpu_slice("small", 2)))
    w.node("large", 8)
    w.claim("four", 4)
    uid = w.pod("p", "four")
    w.pods[uid]["spec"]["nodeSelector"] = {"rack": "a"}
    w.session.on_pod("MODIFIED", parse_pod(w.pods[uid]))
    d = w.step()
    assert not w.node_of(uid)
    assert "cannot be allocated on any of 1 nodes" in w.told(d, uid)


def test_two_requests_of_a_claim_share_the_one_gpu_that_allows_multiple_allocations() -> None:
    """One GPU shared by capacity (allowMultipleAllocations): a claim asking one GPU in
    each of two requests gets two shares of it, as kube-scheduler allocates them; the
    node's one device does not refuse the two requests as two whole devices."""
    w = DraWorld()
    w.session.on_node("ADDED", parse_node(make_node("n0").cap(cpu="64", memory="512Gi").obj()))
    shared = gpu_slice("n0", 1)
    shared["spec"]["devices"][0]["allowMultipleAllocations"] = True
    shared["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {"default": "1Gi"}
    w.session.on_resource_slice("ADDED", parse_resource_slice(shared))
    w.claim("two", 1)
    w.claims["two"]["spec"]["devices"]["requests"].append(
        {"name": "more", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1,
                                      "capacity": {"requests": {"memory": "16Gi"}}}})
    w.session.on_resource_claim("MODIFIED", parse_resource_claim(w.claims["two"]))
    uid = w.pod("p", "two")
    d = w.step()
    assert w.node_of(uid) == "n0", w.told(d, uid)
    assert w.devices_of("two") == ["gpu-0", "gpu-0"]


def test_a_slice_event_counts_again_the_devices_of_its_node_only() -> None:
    w = DraWorld()
    for n in ("n0", "n1", "n2"):
        w.node(n, 4)
    book = w.session.intake.devices
    gone = book.slices["n1-gpu.nvidia.com"]
    change = book.slice_event("DELETED", gone)
    assert change.nodes == frozenset({"n1"}) and change.claims is None
    w.session.on_resource_slice("DELETED", gone)
    column = class_column("gpu.nvidia.com")
    assert [free(w, n, column) for n in ("n0", "n1", "n2")] == [4, 0, 4]
    w.session.on_resource_slice("ADDED", gone)
    assert [free(w, n, column) for n in ("n0", "n1", "n2")] == [4, 4, 4]


def test_devices_alike_in_what_a_class_reads_share_one_selector_run_and_unlike_ones_do_not() -> None:
    """The class columns count each device by the values the class's selectors read: a
    class on the driver and type counts every GPU; one on the index only those it names."""
    w = DraWorld()
    low = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "low.nvidia.com"},
           "spec": {"selectors": [{"cel": {"expression":
               "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].index < 2"}}]}}
    w.session.on_device_classes_listed([parse_device_class(GPU_CLASS), parse_device_class(low)])
    for n in ("n0", "n1"):
        w.node(n, 4)
    assert [free(w, n, class_column("gpu.nvidia.com")) for n in ("n0", "n1")] == [4, 4]
    assert [free(w, n, class_column("low.nvidia.com")) for n in ("n0", "n1")] == [2, 2]
    book = w.session.intake.devices
    assert len(book._shapes) == 1 + 4, "one run for every GPU of the gpu class, one per index for the other"


def test_pools_kept_up_to_date_slice_by_slice_equal_pools_built_anew() -> None:
    import random

    from batchsched.core.dra.objects import Pools

    w = DraWorld()
    for i in range(6):
        w.node(f"n{i}", 2, mig=i % 2 == 0)
    book = w.session.intake.devices
    rng = random.Random(7)
    for step in range(40):
        name = rng.choice(sorted(book.slices))
        rs = book.slices[name]
        if rng.random() < 0.4:
            w.session.on_resource_slice("DELETED", rs)
            w.session.on_resource_slice("ADDED", rs)
        else:
            newer = dataclasses.replace(rs, generation=rs.generation + 1, devices=rs.devices[: rng.randint(0, len(rs.devices))])
            w.session.on_resource_slice("MODIFIED", newer)
        fresh = Pools(book.slices.values())
        kept = book.pools
        assert kept.pools == fresh.pools, step
        for n in (f"n{i}" for i in range(6)):
            assert kept.for_node(n, {}) == fresh.for_node(n, {}), (step, n)
        for d in rs.devices:
            assert kept.device(d.id) == fresh.device(d.id), (step, d.id)
