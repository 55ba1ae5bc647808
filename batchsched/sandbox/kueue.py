"""Kueue, run out of cluster against a sandbox, with its real webhooks.

Kueue's admission is done in its webhooks as much as in its controllers: the pod webhook
gates a managed pod (``kueue.x-k8s.io/admission``) and labels it, the Job webhook suspends
a Job until its Workload is admitted, the queue webhooks default and validate. Tests that
shape those objects by hand check batchsched against our reading of Kueue; running Kueue
checks it against Kueue.

Kueue v0.17.0 is built from ``gomod/kueue`` like the control plane; its CRDs and webhook
configurations are read from that module in the Go module cache (never copied into this
repository) and installed as its kustomize configuration would install them, with three
changes a process on loopback needs:

* the apiserver reaches the webhooks through the Service ``kueue-webhook-service`` of type
  ``ExternalName`` naming ``localhost``: the apiserver resolves such a Service to that host
  and the webhook's port, and still checks the certificate against the name
  ``kueue-webhook-service.kueue-system.svc``, which Kueue's certificate is made for;
* every webhook on pods, Jobs, Deployments and StatefulSets answers only in namespaces
  labelled :data:`NAMESPACE_LABEL`, so Kueue sees the tests that ask for it and no
  other test sharing the sandbox (upstream excludes only kube-system and kueue-system);
* the webhook configurations are deleted when Kueue stops (their ``failurePolicy`` is
  ``Fail``: left behind, they would refuse every pod of those namespaces).

Kueue's own certificate management stays on: it writes a CA and a serving certificate
into the Secret ``kueue-webhook-server-cert``, injects the CA into the webhook
configurations and the CRDs' conversion webhooks, then waits until the Secret is mounted
in its ``certDir``; :class:`Kueue` plays the kubelet and copies the Secret's files there (a
folder of the sandbox's own). Leader election is off, metrics and probes listen on free
loopback ports, the visibility API server is not started (it would be an aggregated API
the sandbox does not register). :meth:`Kueue.start` returns once Kueue answers
``/readyz`` and its webhooks admit a dry-run ResourceFlavor.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import time
from pathlib import Path
from typing import Any

import yaml

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError
from batchsched.sandbox import build
from batchsched.sandbox.cluster import (
    SandboxError,
    SandboxState,
    apply_manifests,
    create_or_replace,
    free_port,
    log_tail,
)
from batchsched.sandbox.tool import ToolProcess, create_once

#: the wrapper module under gomod/ that pins Kueue
MODULE = "kueue"
GO_MODULE = "sigs.k8s.io/kueue"
BINARY = "kueue"
PACKAGE = f"{GO_MODULE}/cmd/kueue"
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
WEBHOOKS = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
#: the label a namespace carries for Kueue's webhooks on pods and workloads to see it
NAMESPACE_LABEL = "kueue.batchsched.io/managed"
#: CRDs whose conversion goes through Kueue's webhook (as its kustomize patches set it)
CONVERTED_CRDS = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
CRD_FOLDER = "config/components/crd/bases"
WEBHOOK_MANIFEST = "config/components/webhook/manifests.yaml"
#: the API groups of the workload webhooks limited to namespaces carrying NAMESPACE_LABEL
_WORKLOAD_GROUPS = {"", "batch", "apps"}
CERT_FILES = ("tls.crt", "tls.key", "ca.crt")
WEBHOOK_API = "/apis/admissionregistration.k8s.io/v1"
#: the integrations Kueue manages by default here (its Configuration's frameworks)
FRAMEWORKS = ("batch/job", "pod")


def kueue_binary() -> Path:
    """Kueue's manager binary, built once from its pinned module and cached."""
    return build.module_binary(MODULE, BINARY, PACKAGE, "Kueue")


def kueue_source() -> Path:
    """Kueue's module folder in the Go module cache (its CRDs and webhook manifests)."""
    try:
        return build.module_source(MODULE, GO_MODULE, WEBHOOK_MANIFEST)
    except build.BuildError as exc:
        raise SandboxError(str(exc)) from exc


def crd_documents(source: Path, port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs, those of :data:`CONVERTED_CRDS` with conversion through its webhook."""
    crds = []
    for path in sorted((source / CRD_FOLDER).glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"service": {"namespace": NAMESPACE, "name": SERVICE,
                                                 "path": "/convert", "port": port}},
                },
            }
        crds.append(crd)
    return crds


def webhook_documents(source: Path, port: int) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, named and pointed at its Service as its kustomize
    configuration does, on ``port``; workload webhooks limited to :data:`NAMESPACE_LABEL`."""
    docs = []
    for doc in yaml.safe_load_all((source / WEBHOOK_MANIFEST).read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": WEBHOOKS[doc["kind"]]}
        for hook in doc.get("webhooks") or []:
            service = hook["clientConfig"]["service"]
            service.update(namespace=NAMESPACE, name=SERVICE, port=port)
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if groups & _WORKLOAD_GROUPS:
                hook["namespaceSelector"] = {
                    "matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "Exists"}],
                }
        docs.append(doc)
    return docs


def configuration(*, webhook_port: int, probe_port: int, metrics_port: int, cert_dir: Path,
                  frameworks: tuple[str, ...] = FRAMEWORKS) -> dict[str, Any]:
    """Kueue's Configuration (``config.kueue.x-k8s.io/v1beta2``) for a run on loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE,
                                   "webhookSecretName": SECRET},
        "managedJobsNamespaceSelector": {
            "matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "Exists"}],
        },
        "integrations": {"frameworks": list(frameworks)},
    }


def embedded_kubeconfig(sandbox: SandboxState) -> str:
    """The sandbox's admin kubeconfig with its CA written in (``certificate-authority-data``):
    what MultiKueue's manager is given in a Secret to reach this sandbox as a worker (it
    refuses a kubeconfig that names files)."""
    config = yaml.safe_load(Path(sandbox.kubeconfig).read_text())
    for entry in config.get("clusters") or []:
        cluster = entry["cluster"]
        path = cluster.pop("certificate-authority", None)
        if path:
            cluster["certificate-authority-data"] = base64.b64encode(Path(path).read_bytes()).decode()
    return str(yaml.safe_dump(config))


class Kueue(ToolProcess):
    """One Kueue process against one running sandbox; a context manager."""

    what = "Kueue"
    log_name = "kueue.log"

    def __init__(self, sandbox: SandboxState, *, binary: Path | None = None,
                 frameworks: tuple[str, ...] = FRAMEWORKS) -> None:
        super().__init__(sandbox, binary=binary)
        self.frameworks = frameworks
        self.dir = Path(sandbox.dir) / "kueue"

    def start(self, *, timeout: float = 180.0) -> None:
        """Build (if needed), install its CRDs, Service, Secret and webhook configurations,
        start it and wait until its webhooks answer; fail with a :class:`SandboxError`,
        leaving it stopped and its webhooks removed."""
        binary = self._binary(kueue_binary)
        source = kueue_source()
        deadline = time.monotonic() + timeout
        webhook_port, probe_port = free_port(), free_port()
        cert_dir = self.dir / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "config.yaml"
        config.write_text(yaml.safe_dump(configuration(
            webhook_port=webhook_port, probe_port=probe_port, metrics_port=free_port(),
            cert_dir=cert_dir, frameworks=self.frameworks)))
        asyncio.run(self._install(source, webhook_port))
        self._spawn(binary, [f"--config={config}", "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2"])
        try:
            asyncio.run(self._mount_secret(NAMESPACE, SECRET, CERT_FILES, cert_dir, deadline))
            self._wait_http(f"http://127.0.0.1:{probe_port}/readyz", deadline)
            asyncio.run(self._wait_webhooks(deadline))
        except BaseException:
            self.stop()
            raise

    def _before_stop(self) -> None:
        """Its webhook configurations go first: with ``failurePolicy: Fail`` and Kueue gone,
        they would refuse every pod of the namespaces they select."""
        asyncio.run(self._remove_webhooks())

    # -- what its Deployment would have -------------------------------------------------------

    async def _install(self, source: Path, port: int) -> None:
        async with await KubeClient.connect(self.sandbox.kubeconfig) as client:
            await create_once(client, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            # empty: Kueue's certificate rotator fills it (one left by an earlier start is reused)
            await create_once(client, f"/api/v1/namespaces/{NAMESPACE}/secrets", {"metadata": {"name": SECRET}})
            await create_or_replace(client, f"/api/v1/namespaces/{NAMESPACE}/services", {
                "metadata": {"name": SERVICE},
                "spec": {"type": "ExternalName", "externalName": "localhost",
                         "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}]},
            })
            folder = self.dir / "manifests"
            folder.mkdir(parents=True, exist_ok=True)
            crds = folder / "crds.yaml"
            crds.write_text(yaml.safe_dump_all(crd_documents(source, port)))
            await apply_manifests(client, [crds])
            for doc in webhook_documents(source, port):
                kind = doc["kind"].lower() + "s"
                await create_or_replace(client, f"{WEBHOOK_API}/{kind}", doc)

    async def _wait_webhooks(self, deadline: float) -> None:
        """Until the apiserver reaches Kueue's webhooks with the CA injected: a dry-run
        ResourceFlavor goes through its defaulting and validating webhooks."""
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "batchsched-probe"}}
        async with await KubeClient.connect(self.sandbox.kubeconfig) as client:
            while True:
                self._check_alive()
                try:
                    await client.request("POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
                                         body=body, params={"dryRun": "All"})
                    return
                except ConflictError:
                    return
                except KubeError as exc:
                    if time.monotonic() > deadline:
                        raise SandboxError(f"Kueue's webhooks did not answer: {exc}; "
                                           f"{log_tail(str(self.log))}") from exc
                await asyncio.sleep(0.3)

    async def _remove_webhooks(self) -> None:
        with contextlib.suppress(OSError, KubeError):
            async with await KubeClient.connect(self.sandbox.kubeconfig) as client:
                for kind, name in WEBHOOKS.items():
                    with contextlib.suppress(NotFoundError):
                        await client.delete(f"{WEBHOOK_API}/{kind.lower()}s/{name}")
