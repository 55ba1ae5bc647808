"""``batchsched explain`` on the real control plane, through the CLI and kubectl's plugin
mechanism: a gang waiting for GPUs, its place and estimated start (held to when it really
starts), a suspended job, a stopped queue.

Two nodes of 8 GPUs run a gang ``first`` (2 x 8 GPUs) for 40 s (kwok ends each pod after its
``batchsched.io/sim-duration``, and the pods declare it with
``batchsched.io/expected-runtime``); ``second`` (2 x 8 GPUs, 20 s) and ``third`` wait behind
it in the same queue. A third node holds the suspend and queue-stop cases.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.tls import make_self_signed
from batchsched.sandbox import build
from tests.integration.helpers import (
    QUEUES,
    XK8S,
    bound_at,
    create_group,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"
FIRST_SECONDS = 40


def member(name: str, group: str, pool: str, queue: str, seconds: int, gpu: int = 8) -> dict[str, Any]:
    return pod_body(name, gpu=gpu, metadata={
        "labels": {"scheduling.x-k8s.io/pod-group": group, "batchsched.io/queue": queue},
        "annotations": {"batchsched.io/sim-duration": f"{seconds}s", "batchsched.io/expected-runtime": f"{seconds}s"},
    }, spec={"nodeSelector": {"pool": pool}})


async def cli(sandbox: Any, namespace: str, *args: str, kubectl: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: `batchsched ...`, or `kubectl batchsched ...` (kubectl finds
    the plugin executable on PATH and hands it the rest of the words). In a thread: the
    scheduler answering it runs on this event loop."""
    env = {**os.environ, "KUBECONFIG": str(sandbox.kubeconfig),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    words = [*args, "--lease-namespace", namespace]
    cmd = [str(build.ensure_binaries().kubectl), "batchsched", *words] if kubectl else [
        str(Path(sys.executable).parent / "batchsched"), *words]
    return await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


async def explained(sandbox: Any, namespace: str, *args: str) -> dict[str, Any]:
    out = await cli(sandbox, namespace, "explain", *args, "-n", namespace, "-o", "json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


async def test_explain_names_the_numbers_the_position_and_a_start_that_holds(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    team = f"team-{tag}"
    await make_nodes(count=2, gpus=8, labels={"pool": f"train-{tag}"})
    pool = f"train-{tag}"
    async with queues(kube, (team, {"resources": [{"name": GPU, "nominal": 64}]})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        await create_group(kube, XK8S, namespace, "first", {"minMember": 2})
        await create_pods(kube, namespace, [member(f"first-{i}", "first", pool, team, FIRST_SECONDS) for i in range(2)])
        first_start = await bound_at(kube, namespace, "first-", 2)
        for name, seconds in (("second", 20), ("third", 20)):
            await create_group(kube, XK8S, namespace, name, {"minMember": 2})
            await create_pods(kube, namespace, [member(f"{name}-{i}", name, pool, team, seconds) for i in range(2)])
            await asyncio.sleep(1.0)
        await asyncio.sleep(3.0)  # the gangs are tried and told why

        asked = time.time()
        out = await explained(sandbox, namespace, "podgroup", "second")
        job = out["job"]
        assert job["state"] in ("queued", "reserved"), job
        assert job["members"] == {"bound": 0, "required": 2, "total": 2}
        assert job["queue"] == team and job["position"] == 1 and job["queueLength"] == 2
        assert "16 nvidia.com/gpu" in job["message"] and "0/2 nodes" in job["message"], job["message"]
        assert out["queue"]["resources"][0]["used"] == 16  # what first holds
        estimate = job["estimate"]
        assert estimate["confidence"] == "high", estimate
        third = await explained(sandbox, namespace, "pod", "third-1")
        assert third["job"]["name"] == "third" and third["job"]["position"] == 2
        assert [a["name"] for a in third["ahead"]] == ["second"]
        text = await cli(sandbox, namespace, "explain", "pg", "third", "-n", namespace)
        assert text.returncode == 0, text.stderr
        assert f"PodGroup {namespace}/third:" in text.stdout
        assert f"2 of 2 waiting in queue {team}" in text.stdout
        assert f"ahead: {namespace}/second" in text.stdout
        third_estimate = third["job"]["estimate"]["start"]

        # through kubectl's plugin mechanism, with nothing but the kubeconfig
        plugin = await cli(sandbox, namespace, "explain", "podgroup", "second", "-n", namespace, kubectl=True)
        assert plugin.returncode == 0, plugin.stderr
        assert f"PodGroup {namespace}/second: queued" in plugin.stdout or "holding a reservation" in plugin.stdout
        assert "why: gang needs 2 pods (" in plugin.stdout
        assert "16 nvidia.com/gpu) placed together; only 0 fit now" in plugin.stdout
        assert "start: expected to start in about" in plugin.stdout

        started = await bound_at(kube, namespace, "second-", 2)
        error = abs(started - estimate["start"])
        print(f"second: asked {asked - first_start:.1f} s after first started; estimated start in "
              f"{estimate['start'] - asked:.1f} s, started in {started - asked:.1f} s (error {error:.1f} s)")
        assert error <= 0.2 * (started - asked)
        third_started = await bound_at(kube, namespace, "third-", 2)
        print(f"third: estimated start in {third_estimate - asked:.1f} s, started in {third_started - asked:.1f} s")
        assert abs(third_started - third_estimate) <= 0.2 * (third_started - asked)

        rows = await cli(sandbox, namespace, "jobs", "-q", team)
        assert rows.returncode == 0, rows.stderr
        assert "third" in rows.stdout and "running" in rows.stdout


async def test_a_suspended_job_and_a_stopped_queue_say_so_and_resume(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    pool, team = f"hold-{tag}", f"held-{tag}"
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    async with queues(kube, (team, {"resources": [{"name": GPU, "nominal": 8}]})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        await create_group(kube, XK8S, namespace, "pausable", {"minMember": 2})
        await create_pods(kube, namespace, [member(f"pausable-{i}", "pausable", pool, team, 3600, gpu=2) for i in range(2)])
        await bound_at(kube, namespace, "pausable-", 2)

        # suspended while it runs: evicted whole, its recreated pods held
        await kube.patch(f"{XK8S}/namespaces/{namespace}/podgroups/pausable",
                         {"metadata": {"annotations": {"batchsched.io/suspend": "true"}}})

        async def gone() -> bool:
            return not [p for p in await list_pods(kube, namespace) if p["metadata"]["name"].startswith("pausable-")]
        await wait_for(gone, timeout=30)
        await create_pods(kube, namespace, [member(f"pausable-{i}b", "pausable", pool, team, 3600, gpu=2) for i in range(2)])
        await asyncio.sleep(4.0)
        assert not any(p["spec"].get("nodeName") for p in await list_pods(kube, namespace))
        job = (await explained(sandbox, namespace, "podgroup", "pausable"))["job"]
        assert job["state"] == "suspended"
        assert job["message"].startswith(f"PodGroup {namespace}/pausable is suspended")
        evicted = await events_for(kube, namespace, "pausable", "GangEvicted")
        assert len(evicted) == 2 and all("was suspended" in e["message"] for e in evicted)
        told = await events_for(kube, namespace, "pausable-0b", "FailedScheduling")
        assert len(told) == 1 and "is suspended" in told[0]["message"]  # once, not every cycle

        # the queue stopped: new work in it waits and says why
        await kube.patch(f"{QUEUES}/{team}", {"spec": {"stopPolicy": "Hold"}})
        await create_pods(kube, namespace, [pod_body("single", gpu=1, metadata={"labels": {"batchsched.io/queue": team}},
                                                     spec={"nodeSelector": {"pool": pool}})])
        await asyncio.sleep(3.0)
        single = (await explained(sandbox, namespace, "pod", "single"))["job"]
        assert single["state"] == "queue-stopped"
        assert single["message"] == f"queue {team} is stopped (stopPolicy Hold): it admits no new work until its stopPolicy is None"
        stopped = await events_for(kube, namespace, "single", "FailedScheduling")
        assert [e["message"] for e in stopped] == [single["message"]]  # told once
        queue = await explained(sandbox, namespace, "queue", team)
        assert queue["queue"]["state"] == "Hold"
        text = await cli(sandbox, namespace, "queues")
        assert text.returncode == 0 and team in text.stdout and "Hold" in text.stdout

        # resumed: both placed
        await kube.patch(f"{XK8S}/namespaces/{namespace}/podgroups/pausable",
                         {"metadata": {"annotations": {"batchsched.io/suspend": None}}})
        await kube.patch(f"{QUEUES}/{team}", {"spec": {"stopPolicy": "None"}})
        await bound_at(kube, namespace, "pausable-", 2)
        await bound_at(kube, namespace, "single", 1)


async def test_the_cli_reaches_the_views_over_tls_verified_with_the_ca_on_the_lease(
    sandbox, kube: KubeClient, namespace: str, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """The leader publishes its views' address (https) and the CA of their certificate on
    its Lease; the CLI reads both with the user's kubeconfig and verifies the certificate:
    through the Lease, through a port-forward style ``--server https://localhost:...``, and
    never with another CA or over plain HTTP."""
    async with running_scheduler(sandbox, namespace) as sched:
        lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
        annotations = lease["metadata"]["annotations"]
        assert annotations["batchsched.io/endpoint"] == f"https://127.0.0.1:{sched.views_port}"
        assert annotations["batchsched.io/views-ca"].startswith("-----BEGIN CERTIFICATE-----")

        found = await cli(sandbox, namespace, "queues", "-o", "json")
        assert found.returncode == 0, found.stderr
        assert "queues" in json.loads(found.stdout)
        forwarded = await cli(sandbox, namespace, "jobs", "--server", f"https://localhost:{sched.views_port}")
        assert forwarded.returncode == 0, forwarded.stderr

        other = tmp_path / "other-ca.crt"
        other.write_bytes(make_self_signed(["127.0.0.1"]).ca_pem)
        refused = await cli(sandbox, namespace, "queues", "--ca-file", str(other))
        assert refused.returncode == 1 and refused.stdout == ""
        assert f"presented a certificate that the CA of {other} does not verify" in refused.stderr, refused.stderr
        plain = await cli(sandbox, namespace, "queues", "--server", f"http://127.0.0.1:{sched.views_port}")
        assert plain.returncode == 1 and plain.stdout == ""
        assert "the views are served over HTTPS only" in plain.stderr, plain.stderr


async def test_a_certificate_of_ones_own_is_served_and_checked_for_its_server_name(
    sandbox, kube: KubeClient, namespace: str, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """A certificate from files, as a cert-manager Certificate's Secret mounts them
    (tls.crt, tls.key, ca.crt), naming a Service's DNS name and none of the addresses the
    CLI connects to: the leader publishes that CA and ``serverName``, and the CLI checks
    the certificate for that name."""
    made = make_self_signed([f"batchsched-views.{namespace}.svc"])
    (tmp_path / "tls.crt").write_bytes(made.cert_pem)
    (tmp_path / "tls.key").write_bytes(made.key_pem)
    (tmp_path / "ca.crt").write_bytes(made.ca_pem)
    tls = {"certFile": str(tmp_path / "tls.crt"), "keyFile": str(tmp_path / "tls.key"),
           "caFile": str(tmp_path / "ca.crt"), "serverName": f"batchsched-views.{namespace}.svc"}
    async with running_scheduler(sandbox, namespace, explain={"tls": tls}):
        lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
        annotations = lease["metadata"]["annotations"]
        assert annotations["batchsched.io/views-ca"] == made.ca_pem.decode()
        assert annotations["batchsched.io/views-server-name"] == f"batchsched-views.{namespace}.svc"
        found = await cli(sandbox, namespace, "queues")
        assert found.returncode == 0, found.stderr
        # checked for the address's own host instead, the certificate does not name it
        misnamed = await cli(sandbox, namespace, "queues", "--tls-server-name", "127.0.0.1")
        assert misnamed.returncode == 1 and "does not verify" in misnamed.stderr, misnamed.stderr
