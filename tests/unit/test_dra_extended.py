"""Extended resources served by DRA devices: a pod asking ``nvidia.com/gpu`` on nodes whose
GPUs a DRA driver publishes, under a DeviceClass naming that resource.

The request mappings are checked against upstream's rules; the Session end to end: the
claim it makes for the pod (created, allocated, named in the pod's status before the
Binding), nodes of both kinds in one cluster, one quota over both, preemption, a restart,
and a claim left by an attempt that bound nothing."""

from __future__ import annotations

import copy
from typing import Any

from batchsched.core.dra.extended import claim_requests, resolve
from batchsched.core.dra.objects import parse_device_class, parse_resource_claim
from batchsched.core.model import parse_node, parse_pod
from tests.builders import make_node, make_pod
from tests.unit.test_dra_scheduling import GPU_CLASS, MIG_CLASS, DraWorld, free

GPU = "nvidia.com/gpu"


def _class(name: str, resource: str | None = None, created: str = "2026-01-01T00:00:00Z") -> Any:
    obj = copy.deepcopy(GPU_CLASS)
    obj["metadata"] = {"name": name, "creationTimestamp": created}
    if resource is not None:
        obj["spec"]["extendedResourceName"] = resource
    return parse_device_class(obj)


def _asks(spec: dict[str, Any]) -> Any:
    return parse_pod({"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": spec}).extended


# -- which class serves a resource, and the requests of the claim --------------------------


def test_the_newest_class_naming_a_resource_serves_it_and_every_class_its_implicit_name() -> None:
    served = resolve([
        _class("old", GPU, "2026-01-01T00:00:00Z"),
        _class("new", GPU, "2026-02-01T00:00:00Z"),
        _class("plain"),
    ])
    assert served[GPU] == "new"
    assert served["deviceclass.resource.kubernetes.io/plain"] == "plain"
    assert served["deviceclass.resource.kubernetes.io/old"] == "old"
    # made in the same second: the name first in order
    same = resolve([_class("b", GPU), _class("a", GPU)])
    assert same[GPU] == "a"


def test_each_container_gets_its_own_request_named_by_its_index_and_the_resource_index() -> None:
    asks = _asks({"containers": [
        {"name": "a", "resources": {"requests": {"cpu": "1", GPU: "2"}}},
        {"name": "b", "resources": {"requests": {GPU: "1", "example.com/nic": "1"}}},
        {"name": "c", "resources": {"requests": {"cpu": "1"}}},
    ]})
    requests, mappings = claim_requests(asks, {GPU: "gpu.nvidia.com"})
    assert requests == [
        {"name": "container-0-request-1",
         "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}},
        {"name": "container-1-request-1",
         "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}},
    ]
    assert mappings == [
        {"containerName": "a", "resourceName": GPU, "requestName": "container-0-request-1"},
        {"containerName": "b", "resourceName": GPU, "requestName": "container-1-request-1"},
    ]


def test_init_containers_share_the_largest_request_and_reuse_the_later_containers() -> None:
    """Init containers run one at a time before the containers: the largest of their asks
    is one request they all use; one that asks no more than the containers after it hold
    uses theirs."""
    asks = _asks({
        "initContainers": [
            {"name": "i0", "resources": {"requests": {GPU: "3"}}},
            {"name": "i1", "resources": {"requests": {GPU: "1"}}},
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {GPU: "1"}}},
        ],
        "containers": [{"name": "main", "resources": {"requests": {GPU: "1"}}}],
    })
    requests, mappings = claim_requests(asks, {GPU: "gpu.nvidia.com"})
    counts = {r["name"]: r["exactly"]["count"] for r in requests}
    # i0 needs 3 beyond the sidecar's and main's 2 it may reuse: 1 more; i1's 1 is covered
    assert counts == {"container-0-request-0": 1, "container-2-request-0": 1, "container-3-request-0": 1}
    by = {(m["containerName"], m["requestName"]) for m in mappings}
    assert ("i0", "container-0-request-0") in by and ("i0", "container-2-request-0") in by
    assert ("i1", "container-2-request-0") in by and ("i1", "container-0-request-0") not in by
    assert ("main", "container-3-request-0") in by and ("side", "container-2-request-0") in by


# -- the Session -------------------------------------------------------------------------


class ExtendedWorld(DraWorld):
    """DRA nodes whose GPU class names ``nvidia.com/gpu``, beside device-plugin nodes."""

    def __init__(self) -> None:
        super().__init__()
        self._classes()

    def _classes(self) -> None:
        gpu = copy.deepcopy(GPU_CLASS)
        gpu["spec"]["extendedResourceName"] = GPU
        self.session.on_device_classes_listed([parse_device_class(gpu), parse_device_class(MIG_CLASS)])

    def plugin_node(self, name: str, gpus: int) -> None:
        self.session.on_node("ADDED", parse_node(make_node(name).cap(cpu="64", memory="512Gi", **{GPU: str(gpus)}).obj()))

    def gpu_pod(self, name: str, gpus: int, *, priority: int = 0, queue: str = "") -> str:
        b = make_pod(name).req(cpu="1", **{GPU: str(gpus)}).created(self.now).priority(priority)
        if queue:
            b = b.label({"batchsched.io/queue": queue})
        obj = b.obj()
        self.pods[obj["metadata"]["uid"]] = obj
        self.session.on_pod("ADDED", parse_pod(obj))
        return str(obj["metadata"]["uid"])

    def restart(self) -> None:
        super().restart()
        self._classes()

    def claim_of(self, uid: str) -> dict[str, Any] | None:
        return next((c for c in self.claims.values()
                     if any(o["uid"] == uid for o in c["metadata"].get("ownerReferences", []))), None)


def test_a_pod_asking_nvidia_gpu_on_a_dra_node_gets_a_claim_made_allocated_and_mapped() -> None:
    w = ExtendedWorld()
    w.node("n0", 8)
    uid = w.gpu_pod("train", 2)
    d = w.step()
    assert w.node_of(uid) == "n0"
    [b] = d.binds
    [write] = b.claims
    assert write.create is not None
    meta = write.create["metadata"]
    assert meta["generateName"] == "train-extended-resources-"
    assert meta["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert meta["ownerReferences"][0]["uid"] == uid and meta["ownerReferences"][0]["controller"] is True
    assert write.mappings == ({"containerName": "main", "resourceName": GPU, "requestName": "container-0-request-1"},)
    claim = w.claim_of(uid)
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"]
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "train", "uid": uid}]
    assert free(w, "n0", GPU) == 6, "the node offers its 8 DRA GPUs as nvidia.com/gpu, 2 taken"


def test_pods_by_extended_resource_and_by_claim_never_get_the_same_gpu() -> None:
    w = ExtendedWorld()
    w.node("n0", 4)
    a = w.gpu_pod("a", 2)
    w.claim("explicit", 2)
    b = w.pod("b", "explicit")
    w.step()
    assert w.node_of(a) == w.node_of(b) == "n0"
    mine = w.claim_of(a)
    assert mine is not None
    held = {r["device"] for r in mine["status"]["allocation"]["devices"]["results"]}
    assert held.isdisjoint(w.devices_of("explicit")) and len(held | set(w.devices_of("explicit"))) == 4
    c = w.gpu_pod("c", 1)
    d = w.step(after=5)
    assert not w.node_of(c)
    assert GPU in w.told(d, c), w.told(d, c)


def test_device_plugin_nodes_and_dra_nodes_serve_one_kind_of_pod() -> None:
    w = ExtendedWorld()
    w.plugin_node("plugin", 2)
    w.node("dra", 2)
    pods = [w.gpu_pod(f"p{i}", 1) for i in range(4)]
    d = w.step()
    assert sorted(w.node_of(p) for p in pods) == ["dra", "dra", "plugin", "plugin"]
    for b in d.binds:
        if b.node == "plugin":
            assert b.claims == (), "a device plugin serves nvidia.com/gpu there: no claim"
        else:
            assert len(b.claims) == 1 and b.claims[0].mappings
    late = w.gpu_pod("late", 1)
    w.step(after=5)
    assert not w.node_of(late)


def test_one_quota_on_nvidia_gpu_covers_both_kinds_of_nodes_across_a_restart() -> None:
    w = ExtendedWorld()
    w.plugin_node("plugin", 2)
    w.node("dra", 4)
    w.queues = [{
        "apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team"},
        "spec": {"resources": [{"name": GPU, "nominal": 3}]},
    }]
    w.session.on_queues_listed(w.queues)
    first = [w.gpu_pod(f"p{i}", 1, queue="team") for i in range(3)]
    w.step()
    assert all(w.node_of(p) for p in first)
    w.restart()
    extra = w.gpu_pod("extra", 1, queue="team")
    d = w.step(after=5)
    assert not w.node_of(extra), "3 of a quota of 3 GPUs are in use, on either kind of node"
    assert "team" in w.told(d, extra)
    gone = next(p for p in first if w.node_of(p) == "dra")
    w.delete(gone)
    w.step(after=30)
    assert w.node_of(extra)


def test_a_restart_counts_the_gpus_the_claims_made_for_pods_hold() -> None:
    w = ExtendedWorld()
    w.node("n0", 4)
    a = w.gpu_pod("a", 3)
    w.step()
    assert w.node_of(a) == "n0"
    w.restart()
    assert free(w, "n0", GPU) == 1
    b = w.gpu_pod("b", 2)
    w.step(after=5)
    assert not w.node_of(b)
    c = w.gpu_pod("c", 1)
    w.step(after=5)
    assert w.node_of(c) == "n0"
    held = {r["device"] for p in (a, c) for r in (w.claim_of(p) or {})["status"]["allocation"]["devices"]["results"]}
    assert len(held) == 4


def test_an_urgent_pod_preempts_a_pod_holding_gpus_through_its_claim_and_gets_them() -> None:
    w = ExtendedWorld()
    w.node("n0", 4)
    low = w.gpu_pod("low", 4)
    w.step()
    assert w.node_of(low) == "n0"
    urgent = w.gpu_pod("urgent", 4, priority=1000)
    d = w.step(after=5)
    assert [e.name for e in d.evictions] == ["low"]
    assert w.claim_of(low) is None, "the claim made for the evicted pod goes with it"
    w.step(after=5)
    assert w.node_of(urgent) == "n0"
    assert len((w.claim_of(urgent) or {})["status"]["allocation"]["devices"]["results"]) == 4


def test_a_claim_left_by_an_attempt_that_bound_nothing_is_deleted_before_the_pod_is_placed() -> None:
    """The claim was made and allocated, the Binding then failed and the claim could not be
    deleted (or the scheduler restarted in between): it holds GPUs for a pod that is not
    bound. It is deleted first, then the pod is placed anew."""
    w = ExtendedWorld()
    w.node("n0", 2)
    uid = w.gpu_pod("p", 2)
    d = w.session.step(w.now + 1)
    [b] = d.binds
    w.create(b.claims[0])  # made; the Binding's outcome then is a failure
    left = w.claim_of(uid)
    assert left is not None
    left["status"]["allocation"] = copy.deepcopy(dict(b.claims[0].allocation or {}))
    w.session.on_resource_claim("MODIFIED", parse_resource_claim(left))
    w.session.on_bind_result(b, "failed", now=w.now + 1, error="refused")
    w.now += 2
    d = w.session.step(w.now)
    assert not d.binds
    assert d.claim_deletes == [("default", left["metadata"]["name"], left["metadata"]["uid"])]
    del w.claims[left["metadata"]["name"]]
    w.session.on_resource_claim("DELETED", parse_resource_claim(left))
    w.step(after=5)
    assert w.node_of(uid) == "n0"
    assert w.claim_of(uid) is not None and w.claim_of(uid) is not left


def test_a_gpu_share_never_goes_to_gpus_served_by_dra_and_whole_gpus_still_do() -> None:
    """A DRA node offers its GPUs by count under nvidia.com/gpu: no card of it can be named
    for a share (no device plugin or node agent hands shares out there, and the allocator
    could give the same GPU to a claim)."""
    w = ExtendedWorld()
    w.node("dra", 2)
    share = make_pod("share").req(cpu="1").annotate({"gpu-fraction": "0.5"}).created(w.now).obj()
    w.pods[share["metadata"]["uid"]] = share
    w.session.on_pod("ADDED", parse_pod(share))
    whole = w.gpu_pod("whole", 1)
    d = w.step()
    assert w.node_of(whole) == "dra"
    assert not w.node_of(share["metadata"]["uid"])
    assert w.told(d, share["metadata"]["uid"])
    # a node with GPUs of a device plugin takes the share
    w.plugin_node("plugin", 1)
    w.step(after=5)
    assert w.node_of(share["metadata"]["uid"]) == "plugin"


def test_a_pods_own_claims_of_the_class_naming_nvidia_gpu_count_under_that_quota_too() -> None:
    """One quota on nvidia.com/gpu: pods asking for it on a device-plugin node, pods asking
    for it on a DRA node, and pods whose own claims ask the class that names it."""
    w = ExtendedWorld()
    w.plugin_node("plugin", 1)
    w.node("dra", 4)
    w.queues = [{
        "apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team"},
        "spec": {"resources": [{"name": GPU, "nominal": 4}]},
    }]
    w.session.on_queues_listed(w.queues)
    w.claim("own", 2)
    by_claim = w.pod("own", "own", queue="team")
    asking = [w.gpu_pod(f"p{i}", 1, queue="team") for i in range(2)]
    w.step()
    assert w.node_of(by_claim) == "dra" and all(w.node_of(p) for p in asking)
    w.restart()
    w.claim("more", 1)
    more = w.pod("more", "more", queue="team")
    late = w.gpu_pod("late", 1, queue="team")
    d = w.step(after=5)
    assert not w.node_of(more) and not w.node_of(late), "4 of a quota of 4 GPUs in use"
    assert "team" in w.told(d, more) and "team" in w.told(d, late)
    w.delete(by_claim)
    w.step(after=30)
    assert w.node_of(more) == "dra" and w.node_of(late)


def test_a_pod_asking_more_devices_than_a_claim_holds_waits_told_why_and_others_go_on() -> None:
    w = ExtendedWorld()
    w.node("big", 48)
    implicit = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
    huge = make_pod("huge").req(cpu="1", **{implicit: "40"}).created(w.now).obj()
    w.pods[huge["metadata"]["uid"]] = huge
    w.session.on_pod("ADDED", parse_pod(huge))
    small = w.gpu_pod("small", 2)
    d = w.step()
    assert w.node_of(small) == "big"
    assert not w.node_of(huge["metadata"]["uid"])
    assert "at most 32" in w.told(d, huge["metadata"]["uid"]), w.told(d, huge["metadata"]["uid"])
