"""The simulator with DRA: a snapshot's ResourceSlices, DeviceClasses and ResourceClaims
replayed through the session, kube-controller-manager's part played (claims made from
templates, reservations dropped, claims deallocated), and what-if scenarios whose node pools
publish GPUs by DRA and whose jobs' pods use claim templates."""

from __future__ import annotations

from typing import Any

import pytest

from batchsched.config import parse_config
from batchsched.sandbox import gpudra
from batchsched.simulate import scenario, snapshot
from batchsched.simulate.engine import POD_CLAIM_NAME, Simulation
from batchsched.simulate.snapshot import KIND

MIG = "mig.nvidia.com"
PROFILE_3G = "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'"


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, *, template: str = "", claim: str = "", node_name: str = "") -> dict[str, Any]:
    body = gpudra.pod_with_claims(name, templates={"gpu": template} if template else None,
                                  claims={"gpu": claim} if claim else None)
    body["metadata"].update(namespace="default", uid=f"uid-{name}", creationTimestamp="2026-01-01T00:00:00Z")
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
    body["status"] = {"phase": "Running" if node_name else "Pending"}
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


def named(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"].update(namespace="default", uid=f"uid-{body['metadata']['name']}", resourceVersion="1")
    body.setdefault("status", {})
    return body


def allocated(devices: list[str], node_name: str, holder: str) -> dict[str, Any]:
    """A claim's status as batchsched writes it: ``devices`` of ``node_name``'s pool, for ``holder``."""
    return {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": gpudra.DRIVER, "pool": node_name,
                                                "device": d} for d in devices]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}},
        "reservedFor": [{"resource": "pods", "name": holder, "uid": f"uid-{holder}"}],
    }


def mig_world(gpus: int = 1) -> Simulation:
    """One node whose ``gpus`` A100s are MIG-partitionable, and the driver's classes."""
    sim = Simulation(parse_config(None).session_settings(), use_jit=False)
    sim.add_nodes([node("n0")])
    sim.add_devices(slices=gpudra.gpu_node_slices("n0", gpus=gpus, mig="partitionable", node_uid="uid-n0"),
                    classes=gpudra.device_classes(extended_resource=False))
    return sim


def test_a_snapshot_replays_pods_with_claims_without_handing_out_devices_a_bound_pod_holds() -> None:
    held = named(gpudra.resource_claim("held", MIG, 1, [PROFILE_3G]))
    held["status"] = allocated(["gpu-0-mig-3g20gb-9-0"], "n0", "running")
    mine = named(gpudra.resource_claim("mine", MIG, 1, [PROFILE_3G]))
    made = named(gpudra.resource_claim("waiting-gpu-x1", MIG, 1, [PROFILE_3G]))
    waiting = pod("waiting", template="three-g")
    waiting["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "waiting-gpu-x1"}]
    snap = {"kind": KIND, "objects": {
        "nodes": [node("n0")],
        "pods": [pod("running", claim="held", node_name="n0"), pod("named", claim="mine"), waiting],
        "resourceslices": gpudra.gpu_node_slices("n0", gpus=1, mig="partitionable", node_uid="uid-n0"),
        "deviceclasses": gpudra.device_classes(extended_resource=False),
        "resourceclaims": [held, mine, made],
    }}
    sim = snapshot.load(snap, now=1e9, use_jit=False)
    sim.step(1e9)
    # one A100 has two 3g.20gb placements: the running pod holds one, so one of the two waits
    assert set(sim.placed) in ({"uid-named"}, {"uid-waiting"})
    [(uid, where)] = sim.placed.items()
    assert where.node == "n0" and where.devices == ("n0/gpu-0-mig-3g20gb-9-4",)
    claim = sim.claims.objects[("default", "mine" if uid == "uid-named" else "waiting-gpu-x1")]
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": uid[4:], "uid": uid}]
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-0-mig-3g20gb-9-4"]


def test_a_pods_claim_is_made_from_its_template_and_named_in_its_status() -> None:
    sim = mig_world()
    sim.claims.add([], [named(gpudra.claim_template("three-g", MIG, 1, [PROFILE_3G]))])
    p = sim.add_pod(pod("p", template="three-g"))
    [entry] = p.resource_claims
    claim = sim.claims.objects[("default", entry.claim)]
    assert entry.claim.startswith("p-gpu-")
    assert claim["metadata"]["annotations"] == {POD_CLAIM_NAME: "gpu"}
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-p"
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == MIG
    sim.step(1.0)
    assert sim.placed["uid-p"].devices and claim["status"]["reservedFor"][0]["uid"] == "uid-p"


def test_a_pod_whose_template_is_missing_waits_told_why() -> None:
    sim = mig_world()
    sim.add_pod(pod("p", template="nowhere"))
    d = sim.step(1.0)
    assert not sim.placed
    [why] = [c.message for c in d.unschedulable]
    assert "ResourceClaimTemplate nowhere" in why


def test_a_finished_pod_frees_its_partition_for_the_next_and_its_made_claim_is_deleted() -> None:
    sim = mig_world()
    sim.claims.add([], [named(gpudra.claim_template("three-g", MIG, 1, [PROFILE_3G]))])
    first = [sim.add_pod(pod(f"p{i}", template="three-g")).uid for i in range(2)]
    sim.step(1.0)
    assert set(sim.placed) == set(first)  # the GPU's two 3g.20gb partitions
    late = sim.add_pod(pod("late", template="three-g")).uid
    sim.step(2.0)
    assert late not in sim.placed
    freed = sim.placed[first[0]].devices
    sim.finish_pod(first[0])
    assert not any(c["metadata"]["ownerReferences"][0]["uid"] == first[0] for c in sim.claims.objects.values())
    sim.step(3.0)
    assert sim.placed[late].devices == freed


def test_a_shared_claim_is_deallocated_once_its_last_pod_is_gone_and_kept() -> None:
    sim = mig_world()
    sim.claims.add([named(gpudra.resource_claim("shared", MIG, 1, [PROFILE_3G]))])
    a = sim.add_pod(pod("a", claim="shared")).uid
    sim.step(1.0)
    b = sim.add_pod(pod("b", claim="shared")).uid
    sim.step(2.0)
    claim = sim.claims.objects[("default", "shared")]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [a, b]
    assert sim.placed[b].devices == ()  # allocated already: b shares what a's Binding allocated
    sim.delete_pod(a)
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [b]
    sim.delete_pod(b)
    assert claim["status"] == {} and ("default", "shared") in sim.claims.objects


MIG_SCENARIO: dict[str, Any] = {
    "nodes": [{"prefix": "mig", "count": 1, "gpus": 2, "dra": "partitionable"},
              {"prefix": "plain", "count": 1, "gpus": 8}],
    "jobs": [
        {"name": "serve", "at": 0, "duration": 100, "pods": 4, "minMember": 4,
         "claim": {"class": MIG, "selectors": [PROFILE_3G]}},
        {"name": "late", "at": 10, "duration": 100, "pods": 1, "claim": {"class": MIG, "selectors": [PROFILE_3G]}},
        {"name": "whole", "at": 10, "duration": 50, "pods": 1, "claim": {"class": "gpu.nvidia.com"}},
        {"name": "classic", "at": 10, "duration": 50, "pods": 1, "gpus": 8},
    ],
}


def test_a_scenario_places_a_mig_gang_whole_and_later_claims_when_its_partitions_free_up() -> None:
    r = scenario.run(MIG_SCENARIO, use_jit=False)
    serve, late, whole, classic = (r.jobs[n] for n in ("serve", "late", "whole", "classic"))
    assert serve.started == 0 and serve.ended == 100  # 2 GPUs x 2 3g.20gb partitions: the gang of 4
    # every partition and both GPUs (partitioned) are taken until the gang ends
    assert late.started == 100 and whole.started == 100
    assert classic.wait == 0  # nvidia.com/gpu pods use the other pool, as before


@pytest.mark.parametrize(("edit", "reason"), [
    ({"dra": "dynamic"}, "node pool 'mig': dra: mig must be one of none, static, partitionable, got 'dynamic'"),
    ({"product": "T4"}, "node pool 'mig': dra: no GPU model 'T4'"),
])
def test_a_dra_node_pool_it_cannot_publish_is_refused_with_the_reason(edit: dict[str, Any], reason: str) -> None:
    doc = {"nodes": [{"prefix": "mig", "gpus": 2, "dra": "partitionable", **edit}]}
    with pytest.raises(ValueError, match="^" + reason.replace("(", r"\(").replace(")", r"\)")):
        scenario.run(doc, use_jit=False)


@pytest.mark.parametrize(("claim", "reason"), [
    ({"count": 2}, "job 'j': claim needs a class"),
    ({"class": MIG, "size": 2}, "job 'j': claim: unknown key(s) size (known: class, count, selectors)"),
    ({"class": MIG, "selectors": PROFILE_3G}, "job 'j': claim: selectors must be a list of CEL expressions"),
    ({"class": MIG, "count": 0}, "job 'j': claim: a request asks for at least one device, got count=0"),
])
def test_a_jobs_claim_it_cannot_read_is_refused_with_the_reason(claim: dict[str, Any], reason: str) -> None:
    doc = {"jobs": [{"name": "j", "claim": claim}]}
    with pytest.raises(ValueError) as err:
        scenario.run(doc, use_jit=False)
    assert str(err.value).startswith(reason)


def test_the_snapshot_command_prints_the_devices_each_claim_would_get(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from batchsched.cli import main

    snap = {"kind": KIND, "objects": {
        "nodes": [node("n0")], "pods": [pod("p", claim="mine")],
        "resourceslices": gpudra.gpu_node_slices("n0", gpus=1, mig="partitionable", node_uid="uid-n0"),
        "deviceclasses": gpudra.device_classes(extended_resource=False),
        "resourceclaims": [named(gpudra.resource_claim("mine", MIG, 2, [PROFILE_3G]))],
    }}
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snap))
    assert main(["simulate", "--snapshot", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  default/p -> n0 devices n0/gpu-0-mig-3g20gb-9-0,n0/gpu-0-mig-3g20gb-9-4"]
