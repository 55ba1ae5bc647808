"""The Kubeflow training operator, run out of cluster against a sandbox.

Tests of gangs, preemption and queues mostly create the objects an operator would create,
shaped by hand. That checks batchsched against our reading of the operator; running the
operator itself checks it against what the operator really does: the PodGroup it writes
(named after the job, ``minMember`` = every replica, ``minResources`` summed from the pod
templates, the job's annotations, never the job's labels, queue or priority class), the
pods it creates one by one and the pods it creates again when batchsched evicts them.

The operator is built from ``gomod/training-operator`` (pinned to v1.8.1, see its go.mod)
like the control plane, and its PyTorchJob CRD is read from that module in the Go module
cache, never copied into this repository. It expects to run in a pod, so
:class:`TrainingOperator` stands in for what the pod would have:

* its namespace (``MY_POD_NAMESPACE``, here :data:`NAMESPACE`), and in it the Secret its
  certificate rotator fills (:data:`WEBHOOK_SECRET`) and the ValidatingWebhookConfiguration
  it injects its CA into (:data:`WEBHOOK_CONFIGURATION`). The configuration is created
  empty, so the apiserver never calls the operator's webhooks: nothing is validated by them
  (the sandbox could not reach a webhook Service anyway);
* the Secret mounted at ``/tmp/k8s-webhook-server/serving-certs``: the rotator writes the
  certificates into the Secret and then waits until ``tls.crt`` exists in that folder
  (a path fixed in the operator's code, not a flag). We copy the Secret's files there
  once it is filled, each written whole (a temporary file renamed), so two sandboxes on
  one machine only ever overwrite each other's files with complete ones; the operator
  checks only that the file exists, and its webhook server is never called.

Its metrics and health endpoints listen on free loopback ports; its webhook server on a
free port too, on every interface (the operator offers no flag for the address). Only the
PyTorchJob controller is enabled (``--enable-scheme=pytorchjob``). Its output goes to
``logs/training-operator.log`` in the sandbox's folder. :meth:`TrainingOperator.start`
returns once the operator reports ready (its ``/readyz``: certificates in place and the
webhook server started; its controllers start right after);
:meth:`TrainingOperator.stop` stops exactly the process it started.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from batchsched.kube.client import KubeClient
from batchsched.sandbox import build
from batchsched.sandbox.cluster import SandboxError, SandboxState, apply_manifests, free_port
from batchsched.sandbox.tool import ToolProcess, create_once

#: the wrapper module under gomod/ that pins the operator
MODULE = "training-operator"
GO_MODULE = "github.com/kubeflow/training-operator"
BINARY = "training-operator"
PACKAGE = f"{GO_MODULE}/cmd/training-operator.v1"
#: the name batchsched answers to, given to the operator as its gang scheduler
GANG_SCHEDULER = "batchsched"
#: where the operator would run, and the objects its certificate rotator expects there
NAMESPACE = "kubeflow"
WEBHOOK_SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
#: where the operator expects its Secret mounted (fixed in its code)
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
CERT_FILES = ("tls.crt", "tls.key", "ca.crt")
PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"


def operator_binary() -> Path:
    """The training operator's binary, built once from its pinned module and cached."""
    return build.module_binary(MODULE, BINARY, PACKAGE, "Kubeflow training operator")


def operator_crds() -> Path:
    """The folder of the operator's CRDs in the Go module cache."""
    try:
        return build.module_source(MODULE, GO_MODULE, f"manifests/base/crds/{PYTORCHJOB_CRD}") / "manifests" / "base" / "crds"
    except build.BuildError as exc:
        raise SandboxError(str(exc)) from exc


class TrainingOperator(ToolProcess):
    """One training operator process against one running sandbox; a context manager.

    (v1.8.1 exits with a panic, "close of closed channel", once it has shut down: its main
    closes the channel its certificate rotator already closed. Harmless.)"""

    what = "the training operator"
    log_name = "training-operator.log"

    def __init__(self, sandbox: SandboxState, *, binary: Path | None = None,
                 gang_scheduler: str = GANG_SCHEDULER) -> None:
        super().__init__(sandbox, binary=binary)
        self.gang_scheduler = gang_scheduler

    def start(self, *, timeout: float = 120.0) -> None:
        """Build (if needed), install its CRD and the objects its pod would have, start it
        and wait until it is ready; fail with a :class:`SandboxError`, leaving it stopped."""
        binary = self._binary(operator_binary)
        crds = operator_crds()
        deadline = time.monotonic() + timeout
        asyncio.run(self._install(crds / PYTORCHJOB_CRD))
        probe_port = free_port()
        args = [
            f"--gang-scheduler-name={self.gang_scheduler}",
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            f"--webhook-server-port={free_port()}",
            "--zap-log-level=info",
        ]
        self._spawn(binary, args, {"MY_POD_NAMESPACE": NAMESPACE})
        try:
            # the operator waits until the Secret its rotator fills is mounted at CERT_DIR
            asyncio.run(self._mount_secret(NAMESPACE, WEBHOOK_SECRET, CERT_FILES, CERT_DIR, deadline))
            self._wait_http(f"http://127.0.0.1:{probe_port}/readyz", deadline)
        except BaseException:
            self.stop()
            raise

    # -- what its pod would have ----------------------------------------------------------

    async def _install(self, crd: Path) -> None:
        client = await KubeClient.connect(self.sandbox.kubeconfig)
        try:
            await apply_manifests(client, [crd])
            await create_once(client, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            # empty: the rotator fills it (and a Secret left by an earlier start is reused)
            await create_once(client, f"/api/v1/namespaces/{NAMESPACE}/secrets",
                              {"metadata": {"name": WEBHOOK_SECRET}})
            await create_once(client, "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                              {"metadata": {"name": WEBHOOK_CONFIGURATION}})
        finally:
            await client.close()
