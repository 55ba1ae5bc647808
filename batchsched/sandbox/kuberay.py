"""The KubeRay operator, run out of cluster against a sandbox.

Users of Ray on Kubernetes hand their RayClusters to the KubeRay operator, which makes the
pods; with ``--batch-scheduler=scheduler-plugins`` it also makes the PodGroup a secondary
scheduler places them by. Running the operator itself checks batchsched against what
v1.5.0 really does (read in its source, ``controllers/ray/batchscheduler/scheduler-plugins``):

* every pod it makes names ``schedulerName: scheduler-plugins-scheduler``
  (:data:`SCHEDULER_NAME`), the name batchsched must claim in ``schedulerNames``;
* only a RayCluster labelled ``ray.io/gang-scheduling-enabled`` (any value,
  :data:`GANG_LABEL`) gets a ``scheduling.x-k8s.io/v1alpha1`` PodGroup: named after the
  cluster, owned by it, ``minMember`` = the head + each worker group's replicas (clamped
  to its ``minReplicas``..``maxReplicas``, times ``numOfHosts``), ``minResources`` summed
  from the templates, and its pods labelled ``scheduling.x-k8s.io/pod-group``. The
  PodGroup is made once, when the cluster is first reconciled, and never updated: workers
  the autoscaler adds later are members beyond the quorum. A cluster without the label
  gets no PodGroup, yet its pods still name the scheduler;
* a RayJob goes through the same batch scheduler, which in v1.5.0 accepts only a
  RayCluster: a RayJob's reconcile fails (``currently only RayCluster is supported``) and
  it makes no cluster. RayJobs are not usable with this batch scheduler in v1.5.0.

The operator is built from ``gomod/kuberay`` (pinned to v1.5.0, see its go.mod) like the
control plane; its CRDs (RayCluster, RayJob, RayService) are read from that module in the
Go module cache, never copied into this repository, and applied with the scheduler-plugins
PodGroup CRD the sandbox installs from ``manifests/base`` (applied again here, so a
sandbox started without it still gets it). Its metrics and health endpoints listen on free
loopback ports, leader election is off, and its output goes to ``logs/kuberay-operator.log``
in the sandbox's folder. :meth:`KubeRayOperator.start` returns once its ``/readyz`` answers
and its RayCluster controller has started its workers; :meth:`KubeRayOperator.stop`
stops exactly the process it started.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from batchsched.kube.client import KubeClient
from batchsched.sandbox import build
from batchsched.sandbox.cluster import (
    MANIFESTS,
    SandboxError,
    SandboxState,
    apply_manifests,
    free_port,
    log_tail,
)
from batchsched.sandbox.tool import ToolProcess

#: the wrapper module under gomod/ that pins the operator
MODULE = "kuberay"
GO_MODULE = "github.com/ray-project/kuberay/ray-operator"
BINARY = "kuberay-operator"
#: the batch scheduler the operator is started with
BATCH_SCHEDULER = "scheduler-plugins"
#: what the operator writes into every pod's ``schedulerName`` with that batch scheduler
SCHEDULER_NAME = "scheduler-plugins-scheduler"
#: the RayCluster label (any value) that makes the operator create a PodGroup
GANG_LABEL = "ray.io/gang-scheduling-enabled"
CRDS = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")
PODGROUP_CRD = MANIFESTS / "crd-podgroups-x-k8s.yaml"
#: what the operator logs once its RayCluster controller runs (controller-runtime's words)
_STARTED = "Starting workers"
_CONTROLLER = "raycluster"


def operator_binary() -> Path:
    """The KubeRay operator's binary, built once from its pinned module and cached."""
    return build.module_binary(MODULE, BINARY, GO_MODULE, "KubeRay operator")


def operator_crds() -> Path:
    """The folder of the operator's CRDs in the Go module cache."""
    try:
        return build.module_source(MODULE, GO_MODULE, f"config/crd/bases/{CRDS[0]}") / "config" / "crd" / "bases"
    except build.BuildError as exc:
        raise SandboxError(str(exc)) from exc


class KubeRayOperator(ToolProcess):
    """One KubeRay operator process against one running sandbox; a context manager."""

    what = "the KubeRay operator"
    log_name = "kuberay-operator.log"

    def __init__(self, sandbox: SandboxState, *, binary: Path | None = None,
                 batch_scheduler: str = BATCH_SCHEDULER) -> None:
        super().__init__(sandbox, binary=binary)
        self.batch_scheduler = batch_scheduler

    def start(self, *, timeout: float = 60.0) -> None:
        """Build (if needed), install its CRDs and the PodGroup CRD, start it and wait
        until its RayCluster controller runs; fail with a :class:`SandboxError`, leaving
        it stopped."""
        binary = self._binary(operator_binary)
        crds = operator_crds()
        deadline = time.monotonic() + timeout
        asyncio.run(self._install([PODGROUP_CRD, *(crds / name for name in CRDS)]))
        probe_port = free_port()
        args = [
            f"--batch-scheduler={self.batch_scheduler}",
            f"--metrics-addr=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--enable-leader-election=false",
            "--log-stdout-encoder=console",
        ]
        self._spawn(binary, args)
        try:
            self._wait_ready(probe_port, deadline)
        except BaseException:
            self.stop()
            raise

    async def _install(self, files: list[Path]) -> None:
        client = await KubeClient.connect(self.sandbox.kubeconfig)
        try:
            await apply_manifests(client, files)
        finally:
            await client.close()

    def _wait_ready(self, probe_port: int, deadline: float) -> None:
        """Its ``/readyz`` (answered as soon as its manager serves probes), then the line
        its RayCluster controller logs once its caches are synced and its workers run."""
        self._wait_http(f"http://127.0.0.1:{probe_port}/readyz", deadline)
        while not self._controller_started():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SandboxError(f"the KubeRay operator's RayCluster controller did not start in time: "
                                   f"{log_tail(str(self.log))}")
            time.sleep(0.2)

    def _controller_started(self) -> bool:
        text = self.log.read_text(errors="replace")
        return any(_STARTED in line and _CONTROLLER in line.lower() for line in text.splitlines())
