"""batchsched installed as users install it: the Helm chart (``charts/batchsched/``) and the
kustomize base and overlays (``manifests/base/``, ``manifests/overlays/``), rendered by the
real ``helm template`` and ``kubectl kustomize``, applied to the sandbox with a server-side
dry run and then for real, and the scheduler run from what they render.

The kwok nodes run no containers, so the Deployment's pods never start. The scheduler runs
as a process instead, with the identity and configuration the Deployment would give it: a
token of the rendered ServiceAccount (TokenRequest API) and the file of the rendered
ConfigMap that the Deployment mounts where its command reads it. Only ``metricsAddress`` and
``explain.address`` are changed, to free ports on loopback (other control planes share the
machine). It must bind
a 2-pod gang whole, and its ServiceAccount must be granted exactly what
``manifests/base/rbac.yaml``'s ClusterRole grants: every use of it, and none of a list of
others. The overlays run as ``batchsched-system/batchsched``, the account the sandbox's
audit log records, so a request RBAC refused would also fail the run at its end.

The chart goes into a namespace of its own under a release name of its own; the overlays
into ``batchsched-system``, where the sandbox's own install already holds the CRDs, RBAC and
PriorityClasses (applying them again changes nothing). Every object a test created that was
not there before is deleted after it, cluster-scoped ones included.

helm is built once from ``batchsched/sandbox/gomod/helm`` (about 3 minutes the first time,
cached after); kubectl, with kustomize built in, is the sandbox's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from batchsched.config import parse_config
from batchsched.kube.client import KubeClient
from batchsched.sandbox.nodes import SANDBOX_LABEL
from batchsched.sandbox.pki import write_kubeconfig
from tests.conftest import IN_CI, RBAC, rbac_denials, scheduler_requests
from tests.integration.helpers import (
    XK8S,
    bound,
    create_group,
    create_pods,
    events_for,
    get_group,
    list_pods,
    pod_body,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "batchsched"
BASE = ROOT / "manifests" / "base"
OVERLAYS = ROOT / "manifests" / "overlays"
MONITORING = OVERLAYS / "with-monitoring"
FIELD_MANAGER = "batchsched-packaging-test"

Use = tuple[str, str, str]  # (API group, resource[/subresource], verb)

#: requests the scheduler never makes: its ServiceAccount must be refused each
NOT_GRANTED: tuple[Use, ...] = (
    ("", "secrets", "get"), ("", "secrets", "list"), ("", "configmaps", "list"),
    ("", "pods", "create"), ("", "pods", "delete"), ("", "pods", "update"),
    ("", "nodes", "patch"), ("", "nodes", "get"), ("apps", "deployments", "list"),
    ("batchsched.io", "queues", "update"), ("scheduling.x-k8s.io", "podgroups", "create"),
    ("coordination.k8s.io", "leases", "delete"), ("rbac.authorization.k8s.io", "clusterroles", "list"),
)

#: The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, reduced to the fields
#: the monitoring manifests use (group, versions, kinds, scope as the operator defines
#: them). kubectl applies with strict field validation, so a misspelt field still fails.
_STRING = {"type": "string"}
_STRINGS = {"type": "array", "items": _STRING}
_STRING_MAP = {"type": "object", "additionalProperties": _STRING}
_SELECTOR = {"type": "object", "properties": {"matchLabels": _STRING_MAP}}
MONITORING_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": spec},
            }}}],
        },
    }
    for kind, plural, spec in [
        ("ServiceMonitor", "servicemonitors", {"type": "object", "properties": {
            "jobLabel": _STRING,
            "selector": _SELECTOR,
            "namespaceSelector": {"type": "object", "properties": {"matchNames": _STRINGS}},
            "endpoints": {"type": "array", "items": {"type": "object", "properties": {
                "port": _STRING, "path": _STRING, "interval": _STRING, "scrapeTimeout": _STRING,
            }}},
        }}),
        ("PrometheusRule", "prometheusrules", {"type": "object", "properties": {
            "groups": {"type": "array", "items": {"type": "object", "properties": {
                "name": _STRING,
                "rules": {"type": "array", "items": {"type": "object", "properties": {
                    "alert": _STRING, "record": _STRING, "expr": _STRING, "for": _STRING,
                    "labels": _STRING_MAP, "annotations": _STRING_MAP,
                }}},
            }}},
        }}),
    ]
]


# -- the tools ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm, built from its pinned Go module the first time."""
    from batchsched.sandbox import build

    try:
        return build.module_binary("helm", "helm", "helm.sh/helm/v3/cmd/helm", "helm v3")
    except build.BuildError as exc:
        if IN_CI:
            pytest.fail(f"helm could not be built: {exc}", pytrace=False)
        pytest.skip(f"helm could not be built: {exc}")


@pytest.fixture(scope="session")
def kubectl() -> Path:
    from batchsched.sandbox import build

    return build.ensure_binaries().kubectl


def run(*cmd: str | Path, stdin: str | None = None) -> str:
    """Run a command; its standard output, or a failure with its standard error."""
    done = subprocess.run([str(c) for c in cmd], input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stderr}"
    return done.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def render_chart(helm: Path, release: str, namespace: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``helm template`` of the chart, CRDs included (as ``helm install`` applies them)."""
    return documents(run(helm, "template", release, CHART, "--namespace", namespace, "--include-crds",
                         "--values", "-", stdin=yaml.safe_dump(values or {})))


def render_kustomize(kubectl: Path, path: Path) -> list[dict[str, Any]]:
    return documents(run(kubectl, "kustomize", path))


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def rules_of(path: Path, name: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = one(documents(path.read_text()), "ClusterRole", name)["rules"]
    return rules


def uses(rules: list[dict[str, Any]]) -> set[Use]:
    """Every (API group, resource, verb) the resource rules grant."""
    return {
        (group, resource, verb)
        for rule in rules if "resources" in rule
        for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]
    }


# -- what the chart renders is the base's ---------------------------------------------------


def test_the_chart_renders_the_rules_crds_and_configuration_of_the_base(helm: Path, kubectl: Path) -> None:
    run(helm, "lint", "--strict", CHART)
    chart = render_chart(helm, "batchsched", "batchsched-system")
    base = render_kustomize(kubectl, BASE)
    # the same ClusterRoles, rule for rule, under the names the base gives them
    for name in ("batchsched", "batchsched-viewer"):
        assert one(chart, "ClusterRole", name)["rules"] == rules_of(RBAC, name) == one(base, "ClusterRole", name)["rules"]
    assert one(chart, "ClusterRoleBinding")["subjects"] == one(base, "ClusterRoleBinding")["subjects"]
    # the same Roles in the Lease's namespace (the Lease itself, the workload mix's ConfigMap)
    for name in ("batchsched-leader-election", "batchsched-workload-mix"):
        assert one(chart, "Role", name)["rules"] == one(base, "Role", name)["rules"]
        assert one(chart, "Role", name)["metadata"]["namespace"] == one(base, "Role", name)["metadata"]["namespace"]
    # the same CRDs and PriorityClasses
    for kind in ("CustomResourceDefinition", "PriorityClass"):
        assert sorted((d for d in chart if d["kind"] == kind), key=json.dumps) == \
            sorted((d for d in base if d["kind"] == kind), key=json.dumps)
    # everything else of the base, by kind and name (the Namespace is helm's
    # --create-namespace; the base's ConfigMap name ends in a hash of its content)
    def names(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        kinds = {key(d) for d in docs if d["kind"] != "Namespace"}
        return {(k, ns, "batchsched-config" if k == "ConfigMap" and n.startswith("batchsched-config") else n)
                for k, ns, n in kinds}

    assert names(chart) == names(base)
    # the same configuration: what the chart writes parses to what the base's file does
    assert parse_config(config_of(chart)[2]) == parse_config(config_of(base)[2])
    # and the Deployment's pod as the base has it, but for the chart's labels and annotations
    chart_pod, base_pod = (one(d, "Deployment")["spec"]["template"]["spec"] for d in (chart, base))
    for pod in (chart_pod, base_pod):
        pod["volumes"][0]["configMap"]["name"] = "config"
        pod["containers"][0].pop("imagePullPolicy", None)
    assert chart_pod == base_pod
    # a key with a value of its own is refused under config (it would be overwritten)
    refused = subprocess.run([str(helm), "template", "x", str(CHART), "--set", "config.schedulerNames={a}"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "not config.schedulerNames" in refused.stderr, refused.stderr


def test_the_chart_renders_the_monitoring_of_the_overlay(helm: Path, kubectl: Path) -> None:
    values = {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
              "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}
    chart = render_chart(helm, "obs", "observability", values)
    overlay = render_kustomize(kubectl, MONITORING)
    assert one(chart, "PrometheusRule")["spec"] == one(overlay, "PrometheusRule")["spec"]
    dashboard = one(chart, "ConfigMap", "obs-batchsched-dashboard")
    assert dashboard["data"] == one(overlay, "ConfigMap", "batchsched-dashboard")["data"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    monitor = one(chart, "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == one(overlay, "ServiceMonitor")["spec"]["endpoints"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["observability"]}
    assert monitor["metadata"]["labels"]["release"] == "kps"
    # the alert rules select job="batchsched": the job takes the Service's name label, not
    # the release's name
    service = one(chart, "Service")
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "batchsched"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= \
        one(chart, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    # nothing of it unless asked
    assert not {d["kind"] for d in render_chart(helm, "obs", "observability")} & \
        {"Service", "ServiceMonitor", "PrometheusRule"}


# -- installed, and scheduling ---------------------------------------------------------------


def config_of(docs: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """The Deployment's ServiceAccount, namespace and configuration: the file its command
    reads (``--config``), from the ConfigMap mounted there."""
    deploy = one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    [container] = pod["containers"]
    command = container["command"]
    path = PurePosixPath(command[command.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    data = yaml.safe_load(config_map["data"][str(path.relative_to(mount["mountPath"]))])
    return pod["serviceAccountName"], deploy["metadata"]["namespace"], data


class Installer:
    """Applies rendered objects with kubectl (server-side) and deletes afterwards those
    that were not there before."""

    def __init__(self, kubectl: Path, kubeconfig: str, workdir: Path) -> None:
        self.kubectl, self.kubeconfig, self.workdir = kubectl, kubeconfig, workdir
        self.created: list[dict[str, Any]] = []

    def _file(self, docs: list[dict[str, Any]]) -> Path:
        path = self.workdir / f"objects-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        return path

    def present(self, docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        """(kind, namespace, name) of those of ``docs`` the apiserver holds."""
        out = run(self.kubectl, "--kubeconfig", self.kubeconfig, "get", "-f", self._file(docs),
                  "--ignore-not-found", "-o", "json")
        items = json.loads(out)["items"] if out.strip() else []
        return {key(i) for i in items}

    def apply(self, docs: list[dict[str, Any]], *, dry_run: bool) -> str:
        return run(self.kubectl, "--kubeconfig", self.kubeconfig, "apply", "--server-side",
                   f"--field-manager={FIELD_MANAGER}", "-f", self._file(docs),
                   *(["--dry-run=server"] if dry_run else []))

    def install(self, docs: list[dict[str, Any]]) -> None:
        """Dry run (nothing new appears), then for real (everything is there)."""
        before = self.present(docs)
        out = self.apply(docs, dry_run=True)
        assert out.count("(server dry run)") == len(docs), out
        assert self.present(docs) == before, "the server-side dry run created objects"
        self.created += [d for d in docs if key(d) not in before]
        self.apply(docs, dry_run=False)
        assert self.present(docs) == {key(d) for d in docs}

    def remove(self) -> None:
        if not self.created:
            return
        run(self.kubectl, "--kubeconfig", self.kubeconfig, "delete", "--ignore-not-found",
            "--wait=false", "-f", self._file(self.created))
        # cluster-scoped objects outlive the test's namespace: they must be gone at once
        cluster_scoped = [d for d in self.created if not d["metadata"].get("namespace") and d["kind"] != "Namespace"]
        assert not cluster_scoped or not self.present(cluster_scoped), "cluster-scoped objects left behind"


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.fixture
def installer(sandbox: Any, kubectl: Path, tmp_path: Path) -> Iterator[Installer]:
    inst = Installer(kubectl, sandbox.kubeconfig, tmp_path)
    try:
        yield inst
    finally:
        inst.remove()


@pytest.fixture(scope="module")
def monitoring_crds(sandbox: Any, kubectl: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The ServiceMonitor and PrometheusRule CRDs, for the time of this module."""
    path = tmp_path_factory.mktemp("crds") / "monitoring.yaml"
    path.write_text(yaml.safe_dump_all(MONITORING_CRDS))
    admin = ("--kubeconfig", sandbox.kubeconfig)
    run(kubectl, *admin, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", path)
    run(kubectl, *admin, "wait", "--for=condition=Established", "--timeout=60s", "-f", path)
    try:
        yield
    finally:
        run(kubectl, *admin, "delete", "--ignore-not-found", "-f", path)


async def token_kubeconfig(sandbox: Any, kube: KubeClient, namespace: str, account: str, path: Path) -> str:
    """A kubeconfig with a token of that ServiceAccount (TokenRequest API)."""
    issued = await kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    write_kubeconfig(path, sandbox.server, Path(sandbox.dir) / "pki" / "ca.crt", issued["status"]["token"],
                     f"system:serviceaccount:{namespace}:{account}")
    return str(path)


@contextlib.contextmanager
def scheduler_process(kubeconfig: str, config: dict[str, Any], workdir: Path) -> Iterator[Path]:
    """``python -m batchsched run`` with that kubeconfig and configuration; yields its log."""
    config_file, log = workdir / "batchsched.yaml", workdir / "batchsched.log"
    views = {**(config.get("explain") or {}), "address": "127.0.0.1:0"}
    config_file.write_text(yaml.safe_dump({**config, "metricsAddress": "127.0.0.1:0", "explain": views}))
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "batchsched", "run", "--kubeconfig", kubeconfig, "--config", str(config_file)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "BATCHSCHED_LOG_LEVEL": "INFO"},
        )
    try:
        yield log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def allowed(kube: KubeClient, user: str, namespace: str, use: Use, *, where: str = "any", name: str = "") -> bool:
    """May ``user`` (a ServiceAccount of ``namespace``) make that use, in the namespace
    ``where`` (of the object ``name``, when given)?"""
    group, resource, verb = use
    resource, _, subresource = resource.partition("/")
    review = await kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                          "system:authenticated"],
                 "resourceAttributes": {"group": group, "resource": resource, "subresource": subresource,
                                        "verb": verb, "namespace": where, "name": name}},
    })
    return bool(review["status"].get("allowed"))


TARGETS = ["chart", "base", "with-kueue", "with-monitoring"]


@pytest.mark.parametrize("target", TARGETS)
async def test_installed_from_the_package_it_binds_a_gang_as_its_own_account(
    sandbox: Any, kube: KubeClient, kubectl: Path, helm: Path, installer: Installer, monitoring_crds: None,
    namespace: str, make_nodes: Any, audit_log: Path, tmp_path: Path, target: str,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    if target == "chart":
        release, release_ns = f"p{suffix}", f"pkg-{suffix}"
        await kube.create("/api/v1/namespaces", {"metadata": {"name": release_ns}})
        installer.created.append({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": release_ns}})
        docs = render_chart(helm, release, release_ns, {
            "schedulerNames": [f"sched-{suffix}"],
            "replicas": 1,
            "leaderElection": {"leaseDurationSeconds": 4, "renewDeadlineSeconds": 3, "retryPeriodSeconds": 0.5},
            "config": {"cycle": {"retryUnschedulableSeconds": 30}},
            "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True},
        })
    else:
        docs = render_kustomize(kubectl, BASE if target == "base" else OVERLAYS / target)
    account, account_ns, config = config_of(docs)
    user = f"system:serviceaccount:{account_ns}:{account}"
    # the ServiceAccount is rendered, and the ClusterRoleBinding binds it to the scheduler's role
    one(docs, "ServiceAccount", account)
    [binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding"
                 and {"kind": "ServiceAccount", "name": account, "namespace": account_ns} in d["subjects"]]
    role = one(docs, "ClusterRole", binding["roleRef"]["name"])
    lease = config["leaderElection"]
    if target == "chart":
        assert config["schedulerNames"] == [f"sched-{suffix}"]
        assert (lease["namespace"], lease["leaseName"]) == (release_ns, f"{release}-batchsched")
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{lease['namespace']}/leases/{lease.get('leaseName', 'batchsched')}"
    lease_doc = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": lease_path.rsplit("/", 1)[1], "namespace": lease["namespace"]}}
    if key(lease_doc) not in installer.present([lease_doc]):
        installer.created.append(lease_doc)  # the scheduler makes it; removed afterwards

    installer.install(docs)

    # its account may do what the base's role grants, and nothing of what it does not need
    for use in sorted(uses(rules_of(RBAC, "batchsched"))):
        assert await allowed(kube, user, account_ns, use), f"{user} may not {use}"
    for use in NOT_GRANTED:
        assert not await allowed(kube, user, account_ns, use), f"{user} may {use}"
    assert uses(role["rules"]) == uses(rules_of(RBAC, "batchsched"))
    # its Lease, in the Lease's namespace only: a Role there, no grant of leases cluster-wide
    lease_ns, lease_name = lease["namespace"], lease.get("leaseName", "batchsched")
    for verb in ("get", "update"):
        use = ("coordination.k8s.io", "leases", verb)
        assert await allowed(kube, user, account_ns, use, where=lease_ns, name=lease_name), f"{user} may not {verb} its Lease"
        assert not await allowed(kube, user, account_ns, use, where=lease_ns, name="another"), f"{user} may {verb} any Lease"
        assert not await allowed(kube, user, account_ns, use, where="default", name=lease_name), \
            f"{user} may {verb} Leases outside {lease_ns}"
    assert await allowed(kube, user, account_ns, ("coordination.k8s.io", "leases", "create"), where=lease_ns)
    assert not await allowed(kube, user, account_ns, ("coordination.k8s.io", "leases", "create"), where="default")

    # the scheduler as the Deployment would run it binds a gang whole
    pool = f"pk{suffix}"
    await make_nodes(count=2, prefix=pool, gpus=4)
    scheduler = config["schedulerNames"][-1]
    await create_group(kube, XK8S, namespace, "train", {"minMember": 2})
    await create_pods(kube, namespace, [
        pod_body(f"train-{i}", gpu=4, scheduler=scheduler, spec={"nodeSelector": {SANDBOX_LABEL: pool}},
                 metadata={"labels": {"scheduling.x-k8s.io/pod-group": "train"}})
        for i in range(2)
    ])
    kubeconfig = await token_kubeconfig(sandbox, kube, account_ns, account, tmp_path / "kubeconfig")
    with scheduler_process(kubeconfig, config, tmp_path) as log:
        async def gang_running() -> bool:
            status = (await get_group(kube, XK8S, namespace, "train")).get("status") or {}
            return status.get("phase") == "Running" and status.get("running") == 2

        try:
            await wait_for(gang_running, timeout=120)
        except AssertionError:
            raise AssertionError(f"the gang did not run; scheduler log:\n{log.read_text()[-4000:]}") from None
        pods = await list_pods(kube, namespace)
        assert sorted(bound(pods, "train-")) == ["train-0", "train-1"]
        assert len({p["spec"]["nodeName"] for p in pods}) == 2
        assert await events_for(kube, namespace, "train-0", "Scheduled")
        held = await kube.get(lease_path)
        assert held["spec"].get("holderIdentity"), held
    output = log.read_text()
    assert "forbidden" not in output.lower(), output[-4000:]
    if user == "system:serviceaccount:batchsched-system:batchsched":
        # the account the audit log records: its Bindings of this run are there, and no refusal
        bindings = [e for e in scheduler_requests(audit_log)
                    if (e.get("objectRef") or {}).get("namespace") == namespace
                    and (e.get("objectRef") or {}).get("subresource") == "binding"]
        assert bindings, "the scheduler's Bindings are not in the audit log"
        assert rbac_denials(audit_log) == []
