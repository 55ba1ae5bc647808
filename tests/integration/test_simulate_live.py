"""The simulator against the live scheduler: a snapshot of the sandbox, replayed through the
simulator, gives the placements the running scheduler makes on the real control plane.

The pods are created while no scheduler runs, so the scheduler's first cycle sees them all,
as the replay's one step does. The test's nodes carry a taint only its pods tolerate, so
pods other tests leave pending can neither take nor reserve them. The DRA case runs first:
the other leaves pods holding card shares on nodes it deletes, which a later replay's
session cannot read (a pod holding a share of a card on a node no longer listed).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import urllib.request
from typing import Any

import pytest

from batchsched.cli import main as cli_main
from batchsched.core.devices import ELASTIC_CONTAINER_PREFIX, annotations_for
from batchsched.core.model import parse_pod
from batchsched.kube.client import KubeClient
from batchsched.kube.snapshot import take_snapshot
from batchsched.kube.tls import client_context
from batchsched.sandbox.nodes import SANDBOX_LABEL
from batchsched.simulate import snapshot as replay_snapshot
from tests.conftest import admin_token
from tests.integration.helpers import (
    config,
    create_pods,
    list_pods,
    pod_body,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

CORE = "elasticgpu.io/gpu-core"
SETTINGS = {"gpuSharing": {"policy": "binpack"}, "debugSnapshot": True}


def task(pool: str, name: str, core: int, cpu: str) -> dict[str, Any]:
    body = pod_body(name, cpu=cpu, spec={
        "nodeSelector": {SANDBOX_LABEL: pool},
        "tolerations": [{"key": pool, "operator": "Exists", "effect": "NoSchedule"}],
    })
    if core:
        res = body["spec"]["containers"][0]["resources"]
        res["requests"][CORE] = str(core)
        res["limits"] = {CORE: str(core)}
    return body


MIX = [("a", 50, "2"), ("b", 30, "1"), ("c", 100, "4"), ("d", 70, "1"), ("e", 20, "8"), ("f", 200, "2"),
       ("g", 0, "6"), ("h", 40, "1"), ("i", 60, "2"), ("j", 10, "1"), ("k", 300, "1"), ("l", 90, "12")]


def placements(pods: list[dict[str, Any]], names: set[str]) -> dict[str, tuple[str, str]]:
    out = {}
    for p in pods:
        name = p["metadata"]["name"]
        if name in names and p["spec"].get("nodeName"):
            notes = p["metadata"].get("annotations") or {}
            out[name] = (p["spec"]["nodeName"], notes.get(ELASTIC_CONTAINER_PREFIX + "main", ""))
    return out


async def test_a_snapshot_with_dra_claims_replays_to_the_devices_the_live_scheduler_allocates(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox import gpudra

    dra = "/apis/resource.k8s.io/v1"
    nodes = await make_nodes(count=2, prefix=namespace, gpus=0, cpu="16",
                             taints=({"key": namespace, "effect": "NoSchedule"},))
    for c in gpudra.device_classes(extended_resource=False):
        with contextlib.suppress(Exception):
            await kube.create(f"{dra}/deviceclasses", c)
    made = []
    for n in nodes:
        uid = (await kube.get(f"/api/v1/nodes/{n}"))["metadata"]["uid"]
        made += [await kube.create(f"{dra}/resourceslices", s) for s in gpudra.gpu_node_slices(n, gpus=2, node_uid=uid)]
    try:
        # 4 whole GPUs on 2 nodes; 5 pods ask for 7. (Not MIG partitions: a pod the cycle puts
        # on a node whose partitions' shared counters then refuse it is tried elsewhere only
        # in a later cycle, which a replay's one step does not run.)
        for name, count in (("one", 1), ("two", 2)):
            await kube.create(f"{dra}/namespaces/{namespace}/resourceclaimtemplates",
                              gpudra.claim_template(name, "gpu.nvidia.com", count))
        mix = [("m0", "two"), ("m1", "one"), ("m2", "one"), ("m3", "two"), ("m4", "one")]
        for name, template in mix:
            body = gpudra.pod_with_claims(name, templates={"gpu": template},
                                          tolerations=[{"key": namespace, "operator": "Exists", "effect": "NoSchedule"}])
            body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)

        async def claims_made() -> bool | None:  # kube-controller-manager's part, before the snapshot
            pods = await list_pods(kube, namespace)
            return True if all((p.get("status") or {}).get("resourceClaimStatuses") for p in pods) else None

        await wait_for(claims_made, timeout=30)
        snap = json.loads(json.dumps(await take_snapshot(kube, config(namespace, **SETTINGS).document())))
        assert {c["metadata"]["namespace"] for c in snap["objects"]["resourceclaims"]} >= {namespace}
        by_uid = {p["metadata"]["uid"]: p["metadata"]["name"] for p in snap["objects"]["pods"]}
        simulated = {by_uid[uid]: (w.node, sorted(w.devices)) for uid, w in replay_snapshot.replay(snap, now=0.0).items()
                     if by_uid[uid] in dict(mix)}

        async def live_devices() -> dict[str, tuple[str, list[str]]]:
            claims, _ = await kube.list(f"{dra}/namespaces/{namespace}/resourceclaims")
            held = {r["uid"]: c for c in claims for r in (c.get("status") or {}).get("reservedFor") or []}
            out = {}
            for p in await list_pods(kube, namespace):
                c = held.get(p["metadata"]["uid"])
                if p["spec"].get("nodeName") and c is not None:
                    results = c["status"]["allocation"]["devices"]["results"]
                    out[p["metadata"]["name"]] = (p["spec"]["nodeName"], sorted(f"{r['pool']}/{r['device']}" for r in results))
            return out

        async with running_scheduler(sandbox, namespace, **SETTINGS):
            async def settled() -> dict[str, tuple[str, list[str]]] | None:
                got = await live_devices()
                return got if len(got) >= len(simulated) else None

            with contextlib.suppress(AssertionError):
                await wait_for(settled, timeout=30)
            await asyncio.sleep(2.0)  # nothing more is bound afterwards
            live = await live_devices()
        # some fit, some wait: the comparison means something. How many fit depends on the
        # pods' order, their resourceVersions once kube-controller-manager has written their
        # claims (all are created within one second): the two-GPU pods first fill both
        # nodes with two pods, otherwise three fit.
        assert 2 <= len(simulated) < len(mix), simulated
        assert live == simulated
    finally:
        for s in made:
            with contextlib.suppress(Exception):
                await kube.delete(f"{dra}/resourceslices/{s['metadata']['name']}")


async def test_a_snapshot_replays_to_the_placements_the_live_scheduler_makes(
    sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    await make_nodes(count=3, prefix=namespace, gpus=0, cpu="16",
                     extended={CORE: "400", "elasticgpu.io/gpu-memory": "65536"},
                     taints=({"key": namespace, "effect": "NoSchedule"},))
    await create_pods(kube, namespace, [task(namespace, n, c, cpu) for n, c, cpu in MIX])
    snap = await take_snapshot(kube, config(namespace, **SETTINGS).document())
    assert {p["metadata"]["name"] for p in snap["objects"]["pods"]} >= {n for n, _, _ in MIX}

    # the same through the commands a user runs: batchsched snapshot, batchsched simulate --snapshot
    conf = tmp_path / "batchsched.yaml"
    conf.write_text(json.dumps(config(namespace, **SETTINGS).document()))
    out_file = tmp_path / "snapshot.json"
    assert await asyncio.to_thread(cli_main, ["snapshot", "--kubeconfig", sandbox.kubeconfig,
                                              "--config", str(conf), "-o", str(out_file)]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert await asyncio.to_thread(cli_main, ["simulate", "--snapshot", str(out_file), "-o", "json"]) == 0
    from_cli = {r["name"]: (r["node"], r["cards"].get(ELASTIC_CONTAINER_PREFIX + "main", ""))
                for r in json.loads(printed.getvalue())["placed"] if r["namespace"] == namespace}

    # the simulator: the snapshot's objects through the session, one step
    placed = replay_snapshot.replay(json.loads(json.dumps(snap)), now=0.0)
    by_uid = {p["metadata"]["uid"]: p for p in snap["objects"]["pods"]}
    simulated: dict[str, tuple[str, str]] = {}
    for uid, where in placed.items():
        pod = by_uid[uid]
        name = pod["metadata"]["name"]
        if pod["metadata"]["namespace"] == namespace:
            notes, _ = annotations_for(parse_pod(pod).card_asks, where.cards or ())
            simulated[name] = (where.node, notes.get(ELASTIC_CONTAINER_PREFIX + "main", ""))

    # the live scheduler on the same cluster and configuration
    names = {n for n, _, _ in MIX}
    async with running_scheduler(sandbox, namespace, **SETTINGS) as sched:
        async def settled() -> dict[str, tuple[str, str]] | None:
            got = placements(await list_pods(kube, namespace), names)
            return got if len(got) == len(simulated) else None

        live = await wait_for(settled, timeout=30)
        await asyncio.sleep(1.0)  # nothing more is bound afterwards
        assert placements(await list_pods(kube, namespace), names) == live

        # the running scheduler serves the same snapshot
        assert sched.tls is not None
        verified = client_context(sched.tls.ca_pem)
        url = f"https://127.0.0.1:{sched.views_port}/debug/snapshot"
        ask = urllib.request.Request(url, headers={"Authorization": f"Bearer {admin_token(sandbox.kubeconfig)}"})
        body = await asyncio.to_thread(
            lambda: json.loads(urllib.request.urlopen(ask, timeout=10, context=verified).read()))
        assert body["kind"] == "BatchschedSnapshot" and body["config"]["gpuSharing"]["policy"] == "binpack"
        assert {n["metadata"]["name"] for n in body["objects"]["nodes"]} >= {
            n for n, _ in {v for v in live.values()}}

    assert len(simulated) >= 9  # most of the mix fits: the comparison is not empty
    assert live == simulated
    assert from_cli == simulated

