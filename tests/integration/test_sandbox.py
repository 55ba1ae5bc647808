"""The local control plane is real: nodes, bindings, kwok, RBAC, the controller manager, the CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchsched.kube.client import Credentials, KubeClient
from batchsched.kube.errors import ForbiddenError
from batchsched.sandbox.nodes import BLOCK_LABEL, GPU_MODEL_LABEL, RACK_LABEL

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def wait_for(check, timeout: float = 30.0, interval: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


async def test_the_apiserver_reports_the_pinned_release(kube: KubeClient) -> None:
    """``/version`` says the release gomod/kubernetes pins (tools that parse it, Kueue
    among them, refuse the ``v0.0.0-master+$Format:%H$`` of a build without version flags)."""
    from batchsched.sandbox.build import kube_version

    version = await kube.get("/version")
    assert version["gitVersion"] == kube_version() == "v1.37.2"
    assert (version["major"], version["minor"]) == ("1", "37")
    assert version["gitTreeState"] == "clean"


async def test_node_shape_becomes_ready(kube: KubeClient, make_nodes) -> None:  # type: ignore[no-untyped-def]
    names = await make_nodes(
        count=6, gpus=4, gpu_model="H100", cpu="32", memory="256Gi",
        nodes_per_rack=2, racks_per_block=2, labels={"pool": "h100"},
    )
    assert len(names) == 6
    nodes = {n: await kube.get(f"/api/v1/nodes/{n}") for n in names}
    for node in nodes.values():
        conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conds["Ready"] == "True"
        taints = [t["key"] for t in node["spec"].get("taints") or []]
        assert "node.kubernetes.io/not-ready" not in taints
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        assert node["status"]["allocatable"]["cpu"] == "32"
        assert node["metadata"]["labels"][GPU_MODEL_LABEL] == "H100"
        assert node["metadata"]["labels"]["pool"] == "h100"
    racks = {nodes[n]["metadata"]["labels"][RACK_LABEL] for n in names}
    blocks = {nodes[n]["metadata"]["labels"][BLOCK_LABEL] for n in names}
    assert len(racks) == 3 and len(blocks) == 2


async def test_binding_makes_kwok_run_and_complete_the_pod(kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    [node] = await make_nodes(count=1, gpus=8)
    pod = await kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": "trainer", "annotations": {"batchsched.io/sim-duration": "2s"}},
            "spec": {
                "schedulerName": "batchsched",
                "containers": [{
                    "name": "main", "image": "trainer:latest",
                    "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}},
                }],
            },
        },
    )
    assert pod["spec"].get("nodeName") is None
    await kube.create(
        f"/api/v1/namespaces/{namespace}/pods/trainer/binding",
        {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "trainer", "uid": pod["metadata"]["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )

    async def phase() -> str:
        p = await kube.get(f"/api/v1/namespaces/{namespace}/pods/trainer")
        return str(p["status"].get("phase"))

    async def running() -> bool:
        return await phase() == "Running"

    await wait_for(running, timeout=20)
    bound = await kube.get(f"/api/v1/namespaces/{namespace}/pods/trainer")
    assert bound["spec"]["nodeName"] == node

    async def succeeded() -> bool:
        return await phase() == "Succeeded"

    await wait_for(succeeded, timeout=30)


async def test_binding_with_a_stale_uid_is_refused(kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    from batchsched.kube.errors import ConflictError

    [node] = await make_nodes(count=1)
    await kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    with pytest.raises(ConflictError):
        await kube.create(
            f"/api/v1/namespaces/{namespace}/pods/p/binding",
            {
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": "p", "uid": "00000000-0000-0000-0000-000000000000"},
                "target": {"kind": "Node", "name": node},
            },
        )


async def test_rbac_refuses_an_unprivileged_service_account(kube: KubeClient, namespace: str, sandbox) -> None:  # type: ignore[no-untyped-def]
    # the controller manager creates the default ServiceAccount in every new namespace
    async def default_sa() -> bool:
        items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/serviceaccounts")
        return any(sa["metadata"]["name"] == "default" for sa in items)

    await wait_for(default_sa, timeout=30)
    await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "reader"}})
    token_req = await kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/reader/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
    )
    token = token_req["status"]["token"]
    creds = Credentials(host=kube.creds.host, ca_file=kube.creds.ca_file, token=f"Bearer {token}")
    sa_client = KubeClient.from_credentials(creds)
    try:
        with pytest.raises(ForbiddenError):
            await sa_client.list(f"/api/v1/namespaces/{namespace}/pods")
        # once RBAC allows it, the same token may list pods in that namespace only
        await kube.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
            {"metadata": {"name": "pod-reader"},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]}]},
        )
        await kube.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
            {"metadata": {"name": "reader-pods"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]},
        )

        async def allowed() -> bool:
            try:
                await sa_client.list(f"/api/v1/namespaces/{namespace}/pods")
            except ForbiddenError:
                return False
            return True

        await wait_for(allowed, timeout=10)
        with pytest.raises(ForbiddenError):
            await sa_client.list("/api/v1/namespaces/kube-system/pods")
        with pytest.raises(ForbiddenError):
            await sa_client.create(f"/api/v1/namespaces/{namespace}/pods",
                                   {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    finally:
        await sa_client.close()


async def test_namespace_deletion_and_garbage_collection(kube: KubeClient, namespace: str) -> None:
    """The controller manager runs: owner references are collected, namespaces finish deleting."""
    owner = await kube.create(f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "owner"}})
    await kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": "child", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}]},
         "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    await kube.delete(f"/api/v1/namespaces/{namespace}/configmaps/owner")

    async def child_gone() -> bool:
        items, _ = await kube.list(f"/api/v1/namespaces/{namespace}/pods")
        return not items

    await wait_for(child_gone, timeout=30)

    await kube.create("/api/v1/namespaces", {"metadata": {"name": f"{namespace}-x"}})
    await kube.delete(f"/api/v1/namespaces/{namespace}-x")

    async def ns_gone() -> bool:
        items, _ = await kube.list("/api/v1/namespaces")
        return all(n["metadata"]["name"] != f"{namespace}-x" for n in items)

    await wait_for(ns_gone, timeout=60)


# -- the command line -------------------------------------------------------------------


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsched", *args],
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ),
    )


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that does not reap it has stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _sandbox_processes(name: str) -> set[int]:
    """PIDs of processes started for the sandbox ``name`` (they run in its state folder)."""
    from batchsched.sandbox.build import cache_dir

    folder = str(cache_dir() / "sandbox" / name)
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd").removesuffix(" (deleted)") == folder:
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.anyio
async def test_cli_bad_input_is_one_line_and_leaves_nothing_running(sandbox) -> None:  # type: ignore[no-untyped-def]
    for args, fragment in (
        (("sandbox", "up", "--name", "cli-bad", "--frobnicate"), "unrecognized arguments"),
        (("sandbox", "up", "--name", "cli-bad", "--nodes", "0"), "at least 1"),
        (("sandbox", "up", "--name", "cli-bad", "--memory", "lots"), "not a positive quantity"),
        (("sandbox", "up", "--name", "cli-bad", "--port", str(sandbox.apiserver_port)), "already in use"),
    ):
        result = _cli(*args)
        assert result.returncode != 0, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert fragment in lines[0]
        assert _sandbox_processes("cli-bad") == set()


@pytest.mark.anyio
async def test_cli_up_status_down(sandbox) -> None:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    up = _cli("sandbox", "up", "--name", "cli-test", "--nodes", "100", "--gpus-per-node", "8")
    took = time.monotonic() - start
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = up.stdout.strip().splitlines()[-1]
        assert Path(kubeconfig).exists()
        assert Path(kubeconfig).stat().st_mode & 0o077 == 0
        print(f"\nsandbox up with 100 GPU nodes (warm cache): {took:.1f} s")
        client = await KubeClient.connect(kubeconfig)
        try:
            items, _ = await client.list("/api/v1/nodes")
            assert len(items) == 100
        finally:
            await client.close()
        status = _cli("sandbox", "status", "--name", "cli-test")
        assert status.returncode == 0 and '"running": true' in status.stdout
        started = _sandbox_processes("cli-test")
        assert len(started) == 4  # etcd, kube-apiserver, kube-controller-manager, kwok
    finally:
        down = _cli("sandbox", "down", "--name", "cli-test")
    assert down.returncode == 0
    assert not any(_alive(pid) for pid in started)
    status = _cli("sandbox", "status", "--name", "cli-test")
    assert status.returncode != 0


def test_a_thousand_nodes_become_ready_with_long_leases() -> None:
    """At scale the nodes' liveness must not load the apiserver (kwok's Leases last 600 s).

    With kubelet's 40 s Leases kwok renewed 100 Leases a second per 1,000 nodes; at 10,000
    nodes the renewals fell behind, nodes were marked Unknown and the sandbox never became
    Ready. This brings up its own 1,000-node sandbox (about 25 s here) and checks the Leases.
    """
    from batchsched.sandbox.cluster import NODE_LEASE_SECONDS, Sandbox
    from batchsched.sandbox.nodes import NodeShape, node_is_ready

    box = Sandbox(f"pytest-scale-{os.getpid()}")
    start = time.monotonic()
    state = box.up([NodeShape(count=1000, prefix="scale")], ready_timeout=120)
    took = time.monotonic() - start
    try:
        async def check() -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
            client = await KubeClient.connect(state.kubeconfig)
            try:
                nodes, _ = await client.list("/api/v1/nodes", page=1000)
                leases, _ = await client.list("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", page=1000)
            finally:
                await client.close()
            return nodes, leases

        nodes, leases = asyncio.run(check())
        print(f"\nsandbox up with 1,000 nodes: {took:.1f} s")
        assert len(nodes) == 1000 and all(node_is_ready(n) for n in nodes)
        assert {lease["spec"]["leaseDurationSeconds"] for lease in leases} == {NODE_LEASE_SECONDS}
    finally:
        box.down()
