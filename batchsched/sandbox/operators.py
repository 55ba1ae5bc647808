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
import base64
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError
from batchsched.sandbox import build
from batchsched.sandbox.cluster import (
    SandboxError,
    SandboxState,
    apply_manifests,
    free_port,
    http_ok,
    log_tail,
)

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


class TrainingOperator:
    """One training operator process against one running sandbox; a context manager."""

    def __init__(self, sandbox: SandboxState, *, binary: Path | None = None,
                 gang_scheduler: str = GANG_SCHEDULER) -> None:
        self.sandbox = sandbox
        self.binary = binary
        self.gang_scheduler = gang_scheduler
        self.log = Path(sandbox.dir) / "logs" / "training-operator.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.probe_port = 0

    def __enter__(self) -> TrainingOperator:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, *, timeout: float = 120.0) -> None:
        """Build (if needed), install its CRD and the objects its pod would have, start it
        and wait until it is ready; fail with a :class:`SandboxError`, leaving it stopped."""
        if self.process is not None:
            raise SandboxError("the training operator is already running")
        try:
            binary = self.binary or operator_binary()
        except build.BuildError as exc:
            raise SandboxError(str(exc)) from exc
        crds = operator_crds()
        deadline = time.monotonic() + timeout
        asyncio.run(self._install(crds / PYTORCHJOB_CRD))
        self.probe_port = free_port()
        args = [
            f"--gang-scheduler-name={self.gang_scheduler}",
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
            f"--webhook-server-port={free_port()}",
            "--zap-log-level=info",
        ]
        env = {**os.environ, "KUBECONFIG": self.sandbox.kubeconfig, "MY_POD_NAMESPACE": NAMESPACE}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [str(binary), *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.sandbox.dir, env=env,
            )
        try:
            asyncio.run(self._mount_certs(deadline))
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM the process this object started, SIGKILL it after ``grace`` seconds.

        (v1.8.1 exits with a panic, "close of closed channel", once it has shut down: its
        main closes the channel its certificate rotator already closed. Harmless.)"""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # -- what its pod would have ----------------------------------------------------------

    async def _install(self, crd: Path) -> None:
        client = await KubeClient.connect(self.sandbox.kubeconfig)
        try:
            await apply_manifests(client, [crd])
            await _create(client, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            # empty: the rotator fills it (and a Secret left by an earlier start is reused)
            await _create(client, f"/api/v1/namespaces/{NAMESPACE}/secrets",
                          {"metadata": {"name": WEBHOOK_SECRET}})
            await _create(client, "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                          {"metadata": {"name": WEBHOOK_CONFIGURATION}})
        finally:
            await client.close()

    async def _mount_certs(self, deadline: float) -> None:
        """Copy the certificates the rotator writes into its Secret where the operator
        expects the Secret mounted."""
        client = await KubeClient.connect(self.sandbox.kubeconfig)
        try:
            while True:
                self._check_alive()
                secret = await client.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}")
                data: dict[str, str] = secret.get("data") or {}
                if all(data.get(name) for name in CERT_FILES):
                    break
                if time.monotonic() > deadline:
                    raise SandboxError("the training operator wrote no certificates into its Secret "
                                       f"{NAMESPACE}/{WEBHOOK_SECRET}: {log_tail(str(self.log))}")
                await asyncio.sleep(0.2)
        finally:
            await client.close()
        CERT_DIR.mkdir(parents=True, exist_ok=True)
        for name in CERT_FILES:
            write_whole(CERT_DIR / name, base64.b64decode(data[name]))

    def _wait_ready(self, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.probe_port}/readyz"
        if not http_ok(url, deadline=deadline, alive=self._check_alive, interval=0.2):
            raise SandboxError(f"the training operator was not ready in time: {log_tail(str(self.log))}")

    def _check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise SandboxError(f"the training operator exited: {log_tail(str(self.log))}")


async def _create(client: KubeClient, collection: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(ConflictError):
        await client.create(collection, body)


def write_whole(path: Path, content: bytes) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
