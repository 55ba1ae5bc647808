"""Shared fixtures: one real control plane per test session, a namespace per test.

The control plane is the project's own sandbox (etcd, kube-apiserver,
kube-controller-manager and kwok on 127.0.0.1). Where it cannot start, integration tests
are skipped on a developer's machine and fail when ``CI=true``: CI must never pass
without having run them.

batchsched runs in these tests as it runs in a cluster: under its own ServiceAccount
(``batchsched-system/batchsched``), bound to exactly the ClusterRole of
``manifests/base/rbac.yaml``, so a permission missing there fails a test instead of hiding
behind the admin kubeconfig. The tests' own client (creating nodes, pods, queues) stays
admin. The apiserver keeps an audit log of that ServiceAccount's requests, which
``tests/integration/test_rbac.py`` reads to find refused requests and unused grants.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from batchsched.sandbox.cluster import grant_lease_namespace

IN_CI = os.environ.get("CI", "").lower() == "true"

ROOT = Path(__file__).resolve().parent.parent
RBAC = ROOT / "manifests" / "base" / "rbac.yaml"
#: where manifests/base/deployment.yaml runs the scheduler, and as whom
SCHEDULER_NAMESPACE = "batchsched-system"
SCHEDULER_ACCOUNT = "batchsched"
SCHEDULER_USER = f"system:serviceaccount:{SCHEDULER_NAMESPACE}:{SCHEDULER_ACCOUNT}"
#: the scheduler's token must outlive the whole test run
TOKEN_SECONDS = 6 * 3600
#: the apiserver's audit log (JSON lines, in the sandbox's logs) holds only these requests
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "users": [SCHEDULER_USER]},
        {"level": "None"},
    ],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The control plane; ``sandbox.kubeconfig`` is admin, ``sandbox.kubeconfigs[SCHEDULER_USER]``
    batchsched's own (see :func:`tests.integration.helpers.scheduler_kubeconfig`)."""
    from batchsched.sandbox.cluster import Sandbox

    box = Sandbox(f"pytest-{os.getpid()}")
    policy = tmp_path_factory.mktemp("audit") / "policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    try:
        state = box.up([], apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={box.dir / 'logs' / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=100000",  # MB: never rotated during a run, read whole at its end
        ])
    except Exception as exc:  # any failure to start is reported the same way
        message = f"the local control plane could not start: {exc}"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    denied: list[str] = []
    try:
        state.kubeconfigs[SCHEDULER_USER] = _scheduler_identity(state)
        _compile_kernels()
        yield state
        denied = rbac_denials(Path(state.dir) / "logs" / "audit.log")
    finally:
        box.down()
    if denied:  # whichever test made them: a rule is missing from rbac.yaml
        pytest.fail("requests of batchsched refused by RBAC during the run:\n" + "\n".join(denied))


def _compile_kernels() -> None:
    """Compile the placement kernels once, before any test waits for a scheduler to be ready.

    A scheduler warms its kernels up before it reports ready; on a fresh machine that is a
    compilation of a minute or more, which would fall inside the first test's wait. Done
    here, the schedulers this process runs find them compiled, and those started as
    processes of their own load them from numba's cache on disk (``cache=True``)."""
    from batchsched.core.placement import kernels

    kernels.warm_up()


@pytest.fixture(scope="session")
def scheduler_kubeconfig(sandbox: Any) -> str:
    """The kubeconfig batchsched runs with: its ServiceAccount's token."""
    return str(sandbox.kubeconfigs[SCHEDULER_USER])


@pytest.fixture(scope="session")
def audit_log(sandbox: Any) -> Path:
    """The apiserver's audit log of batchsched's requests (JSON lines, one per stage)."""
    return Path(sandbox.dir) / "logs" / "audit.log"


def scheduler_requests(log: Path) -> Iterator[dict[str, Any]]:
    """The audit events of batchsched's ServiceAccount, in the order they were logged (the
    apiserver creates the log at its first entry)."""
    if not log.exists():
        return
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event["user"]["username"] == SCHEDULER_USER:
                yield event


def rbac_denials(log: Path) -> list[str]:
    """The requests of batchsched that RBAC refused (a namespace being deleted refuses
    writes with 403 as well: those are not counted)."""
    return sorted({
        f"{e['verb']} {e['requestURI']}"
        for e in scheduler_requests(log)
        if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"
    })


def _scheduler_identity(state: Any) -> str:
    """Check that the sandbox holds rbac.yaml's ClusterRole and binding as written, create
    the ServiceAccount they bind, and write a kubeconfig with a token for it."""
    ca = Path(state.dir) / "pki" / "ca.crt"
    context = ssl.create_default_context(cafile=str(ca))
    token = admin_token(state.kubeconfig)

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            state.server + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                     "Accept": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            answer: dict[str, Any] = json.load(response)
            return answer

    def create(path: str, body: dict[str, Any]) -> None:
        try:
            call("POST", path, body)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(RBAC.read_text()) if d}
    role, binding = docs[("ClusterRole", "batchsched")], docs[("ClusterRoleBinding", "batchsched")]
    served_role = call("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}")
    served_binding = call(
        "GET", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding['metadata']['name']}"
    )
    assert _rules(served_role["rules"]) == _rules(role["rules"]), "the sandbox's ClusterRole is not rbac.yaml's"
    assert served_binding["roleRef"] == binding["roleRef"]
    assert served_binding["subjects"] == binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SCHEDULER_ACCOUNT, "namespace": SCHEDULER_NAMESPACE}
    ]

    create("/api/v1/namespaces", {"metadata": {"name": SCHEDULER_NAMESPACE}})
    create(f"/api/v1/namespaces/{SCHEDULER_NAMESPACE}/serviceaccounts",
           {"metadata": {"name": SCHEDULER_ACCOUNT}})
    issued = call(
        "POST",
        f"/api/v1/namespaces/{SCHEDULER_NAMESPACE}/serviceaccounts/{SCHEDULER_ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": TOKEN_SECONDS}},
    )
    from batchsched.sandbox.pki import write_kubeconfig

    path = Path(state.dir) / "kubeconfig-batchsched"
    write_kubeconfig(path, state.server, ca, issued["status"]["token"], SCHEDULER_USER)
    return str(path)


def admin_token(kubeconfig: str) -> str:
    [user] = yaml.safe_load(Path(kubeconfig).read_text())["users"]
    return str(user["user"]["token"])


def _rules(rules: list[dict[str, Any]]) -> list[dict[str, list[str]]]:
    """Policy rules compared as sets of strings per field."""
    return sorted(
        ({k: sorted(v) for k, v in rule.items() if v} for rule in rules),
        key=lambda r: json.dumps(r, sort_keys=True),
    )


@pytest.fixture
async def kube(sandbox: object) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(sandbox.kubeconfig)  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def scheduler_kube(scheduler_kubeconfig: str) -> AsyncIterator[KubeClient]:
    """A client as batchsched, for tests that drive its parts (elector, writers) directly."""
    client = await KubeClient.connect(scheduler_kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    await kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    # the tests' schedulers keep their Lease, and the workload mix's ConfigMap, here
    await grant_lease_namespace(kube, name, RBAC)
    try:
        yield name
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/namespaces/{name}", gracePeriodSeconds=0)


@pytest.fixture
async def make_nodes(kube: KubeClient) -> AsyncIterator[Callable[..., Awaitable[list[str]]]]:
    """``await make_nodes(count=4, gpus=8, ...)`` creates Ready nodes, deleted after the test."""
    from batchsched.sandbox.nodes import NodeShape, create_nodes, delete_nodes, wait_nodes_ready

    created: list[str] = []

    async def make(count: int, **shape: object) -> list[str]:
        prefix = str(shape.pop("prefix", f"n{uuid.uuid4().hex[:6]}"))
        names = await create_nodes(kube, [NodeShape(count=count, prefix=prefix, **shape)])  # type: ignore[arg-type]
        created.extend(names)
        await wait_nodes_ready(kube, names, timeout=60)
        return names

    try:
        yield make
    finally:
        await delete_nodes(kube, created)
