"""The schedulers the suite compares, each configured as fairly as we know how.

Each :class:`Peer` says how to start its scheduler as a process against a sandbox, which
``schedulerName`` its pods carry, how a gang is declared to it, and which apiserver
flags it needs (a workload's control plane gets the union of its peers' flags, so every
peer runs against the same apiserver). Settings, as issue 6 asks:

* **batchsched**: ``python -m batchsched run`` with its default configuration, leader
  election off, metrics on a free local port (scraped after the run for its cycle times).
  Its modules are byte-compiled before the first start (:func:`byte_compiled`), as pip
  does when it installs the package and the image when it is built: a checkout run where
  ``PYTHONDONTWRITEBYTECODE`` is set would otherwise compile every module at every start.
* **kube-scheduler** (the sandbox's release, built by the sandbox): a KubeSchedulerConfiguration
  with NodeResourcesFit RequestedToCapacityRatio on ``nvidia.com/gpu`` (shape 0:0, 100:10,
  as MLBatch configures it), client QPS/burst 5000, leader election off, and the feature
  gates the sandbox's control plane runs with (:mod:`batchsched.sandbox.features`).
* **kube-scheduler-gang**: the same binary and configuration with its gang scheduling (on
  with ``GenericWorkload``, one of those gates), at its best settings from PEERS.md:
  ``WatchListClient=false``, ``NominatedNodeNameForExpectation=false``, and
  ``SchedulerAsyncAPICalls=true`` (measured on 1.37). Gangs are
  ``scheduling.k8s.io/v1beta1`` PodGroups, which the sandbox's apiserver serves
  (``spec.schedulingPolicy.gang.minCount``); pods name theirs in
  ``spec.schedulingGroup.podGroupName``.
* **coscheduling**: scheduler-plugins' scheduler (built from ``gomod/scheduler-plugins``)
  with the Coscheduling profile of its own manifests (Coscheduling as queue sort and at
  every extension point) plus the same NodeResourcesFit and client settings. Gangs are
  ``scheduling.x-k8s.io/v1alpha1`` PodGroups (``spec.minMember``) and the
  ``scheduling.x-k8s.io/pod-group`` pod label.

batchsched declares gangs the upstream way, as kube-scheduler-gang does: a workload's gangs
are the same ``scheduling.k8s.io/v1beta1`` PodGroup objects for both (priority class,
disruption mode and topology constraint included), so the two are compared on exactly what
a user of Kubernetes 1.37 writes. batchsched reads the scheduler-plugins format too;
:data:`BATCHSCHED_GANG_STYLE` is the one line to change to measure it on that one.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchsched.sandbox.build import kube_version
from batchsched.sandbox.features import FEATURE_GATES
from perf.workload import Expanded, PodSpec

GANG_X_K8S = "x-k8s"
GANG_K8S = "k8s"
BATCHSCHED_GANG_STYLE = GANG_K8S

X_K8S_LABEL = "scheduling.x-k8s.io/pod-group"
CLASS_LABEL = "perf.batchsched.io/class"
GANG_LABEL = "perf.batchsched.io/gang"

#: the Workload API's group version the gangs of kube-scheduler-gang are declared in
K8S_GANG_API = "scheduling.k8s.io/v1beta1"
#: its best for gangs: the first two from PEERS.md (v1.36; on v1.37.2 without them gang-64
#: waited 73 s for its first bind and bound 76 pods/s), SchedulerAsyncAPICalls (beta, off by
#: default: the scheduler's API calls made asynchronous; 124 against 102 pods/s on gang-64)
K8S_GANG_GATES = (*FEATURE_GATES, "WatchListClient=false", "NominatedNodeNameForExpectation=false",
                  "SchedulerAsyncAPICalls=true")

RTCR_GPU = {
    "name": "NodeResourcesFit",
    "args": {
        "scoringStrategy": {
            "type": "RequestedToCapacityRatio",
            "resources": [{"name": "nvidia.com/gpu", "weight": 1}],
            "requestedToCapacityRatio": {
                "shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]
            },
        }
    },
}


class PeerUnavailable(RuntimeError):
    """A peer cannot run here (it could not be built); the message says why."""


@functools.cache
def byte_compiled() -> None:
    """batchsched's modules byte-compiled next to their sources (once per process), as an
    installed package's are."""
    import batchsched

    compileall.compile_dir(str(Path(batchsched.__file__).parent), quiet=1)


def free_port() -> int:
    from batchsched.sandbox.cluster import free_port as sandbox_port

    return sandbox_port()


@dataclass(slots=True)
class Running:
    """A scheduler process started by :meth:`Peer.start`; stop it with :meth:`stop`."""

    peer: Peer
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    metrics_url: str = ""
    #: answers 200 once the scheduler says it is ready (caches synced)
    ready_url: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 15.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait()


@dataclass(slots=True, frozen=True)
class Peer:
    name: str
    #: what the pods' ``spec.schedulerName`` says
    scheduler_name: str
    #: how a gang is declared: GANG_X_K8S, GANG_K8S, or None (cannot schedule gangs)
    gang_style: str | None
    #: one line for the report: the settings it ran with
    settings: str
    apiserver_args: tuple[str, ...] = ()
    feature_gates: tuple[str, ...] = ()
    binary: Callable[[], Path] | None = None
    profile: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Build (or find) the binary; :class:`PeerUnavailable` with the reason if it cannot."""
        if self.binary is None:
            return
        from batchsched.sandbox.build import BuildError

        try:
            self.binary()
        except BuildError as exc:
            raise PeerUnavailable(f"{self.name} could not be built: {exc}") from exc

    def start(self, kubeconfig: str, workdir: Path, *, profile: Path | None = None) -> Running:
        """Start the scheduler; with ``profile`` (batchsched only), under cProfile into that file."""
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir / f"{self.name}.log"
        metrics_url = ready_url = ""
        if self.binary is None:
            byte_compiled()
            port = free_port()
            cfg = workdir / f"{self.name}-config.yaml"
            cfg.write_text(yaml.safe_dump({
                "leaderElection": {"enabled": False},
                "metricsAddress": f"127.0.0.1:{port}",
            }))
            prof = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
            cmd = [sys.executable, *prof, "-m", "batchsched", "run", "--kubeconfig", kubeconfig, "--config", str(cfg)]
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            ready_url = f"http://127.0.0.1:{port}/readyz"
        else:
            cfg = workdir / f"{self.name}-config.yaml"
            cfg.write_text(yaml.safe_dump(self.scheduler_configuration(kubeconfig), sort_keys=False))
            port = free_port()
            # /readyz is one of kube-scheduler's always-allowed paths: no credentials needed
            ready_url = f"https://127.0.0.1:{port}/readyz"
            cmd = [str(self.binary()), f"--config={cfg}", f"--secure-port={port}", "--v=1"]
            if self.feature_gates:
                cmd.append("--feature-gates=" + ",".join(self.feature_gates))
        with open(log, "wb") as out:
            started = time.monotonic()
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=workdir,
            )
        return Running(peer=self, proc=proc, log=log, started=started, metrics_url=metrics_url, ready_url=ready_url)

    def scheduler_configuration(self, kubeconfig: str) -> dict[str, Any]:
        profile: dict[str, Any] = {"schedulerName": self.scheduler_name, **self.profile}
        profile["pluginConfig"] = [*self.profile.get("pluginConfig", []), RTCR_GPU]
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig, "qps": 5000, "burst": 5000},
            "leaderElection": {"leaderElect": False},
            "profiles": [profile],
        }

    # -- rendering a workload for this peer -----------------------------------------------

    def unsupported(self, ex: Expanded) -> str:
        """Why this peer cannot run ``ex`` ("" when it can)."""
        if self.gang_style is None and ex.gangs:
            return f"{self.name} cannot schedule gangs"
        heads = ex.gang_heads.values()
        if self.gang_style != GANG_K8S and any(h.topology or h.disruption for h in heads):
            return f"{self.name}'s PodGroups have no topology constraint or disruption mode"
        return ""

    def group_objects(self, ex: Expanded, namespace: str, *, after: bool | None = None) -> list[tuple[str, dict[str, Any]]]:
        """(collection path, body) of every PodGroup the workload needs, for this peer; with
        ``after`` True or False, only the gangs of the pods created after (or before) the
        cluster was filled."""
        out: list[tuple[str, dict[str, Any]]] = []
        for gang, head in sorted(ex.gang_heads.items()):
            if after is not None and head.after != after:
                continue
            if self.gang_style == GANG_X_K8S:
                out.append((
                    f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups",
                    {
                        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                        "metadata": {"name": gang},
                        "spec": {"minMember": head.min_count},
                    },
                ))
            elif self.gang_style == GANG_K8S:
                out.append((f"/apis/{K8S_GANG_API}/namespaces/{namespace}/podgroups", k8s_podgroup(gang, head)))
        return out

    def pod(self, spec: PodSpec) -> dict[str, Any]:
        if spec.claim_template:
            from perf import dra

            if spec.gang:
                raise ValueError(f"pod {spec.name}: the DRA workloads have no gangs yet")
            return dra.pod(spec, self.scheduler_name, {CLASS_LABEL: spec.klass})
        requests = {"cpu": spec.cpu, "memory": spec.memory}
        limits = {}
        if spec.gpus:
            requests["nvidia.com/gpu"] = str(spec.gpus)
            limits["nvidia.com/gpu"] = str(spec.gpus)
        labels = {CLASS_LABEL: spec.klass}
        body_spec: dict[str, Any] = {
            "schedulerName": self.scheduler_name,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": "trainer:latest",
                "resources": {"requests": requests, **({"limits": limits} if limits else {})},
            }],
        }
        if spec.priority_class:
            body_spec["priorityClassName"] = spec.priority_class
        if spec.gang:
            labels[GANG_LABEL] = spec.gang
            if self.gang_style == GANG_X_K8S:
                labels[X_K8S_LABEL] = spec.gang
            elif self.gang_style == GANG_K8S:
                body_spec["schedulingGroup"] = {"podGroupName": spec.gang}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": spec.name, "labels": labels},
            "spec": body_spec,
        }


def k8s_podgroup(name: str, head: PodSpec) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1beta1`` PodGroup for the gang ``head`` belongs to.

    ``priorityClassName`` only: the apiserver's priority admission fills ``priority`` (and,
    with PodGroupPreemptionPolicy, ``preemptionPolicy``) in from the class and refuses a
    PodGroup that sets them otherwise; the members carry the same class, since
    kube-scheduler refuses a group whose pods' preemption policy differs from the group's.
    """
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": head.min_count}}}
    if head.priority_class:
        spec["priorityClassName"] = head.priority_class
    if head.disruption:
        spec["disruptionMode"] = {head.disruption: {}}
    if head.topology:
        spec["schedulingConstraints"] = {"topology": [{"key": head.topology}]}
    return {"apiVersion": K8S_GANG_API, "kind": "PodGroup", "metadata": {"name": name}, "spec": spec}


def _kube_scheduler() -> Path:
    from batchsched.sandbox import build

    return build.kube_binaries()["kube-scheduler"]


def _scheduler_plugins() -> Path:
    from batchsched.sandbox import build

    return build.scheduler_plugins_binary()


PEERS: dict[str, Peer] = {
    "batchsched": Peer(
        name="batchsched",
        scheduler_name="batchsched",
        gang_style=BATCHSCHED_GANG_STYLE,
        settings="default config, leader election off",
    ),
    # the same scheduler on the scheduler-plugins PodGroups: not in any workload's list; run
    # it by name (--schedulers) to tell the cost of reading upstream PodGroups from the rest
    "batchsched-x-k8s": Peer(
        name="batchsched-x-k8s",
        scheduler_name="batchsched",
        gang_style=GANG_X_K8S,
        settings="batchsched as above, gangs as scheduling.x-k8s.io/v1alpha1 PodGroups",
    ),
    "kube-scheduler": Peer(
        name="kube-scheduler",
        scheduler_name="default-scheduler",
        gang_style=None,
        settings=f"{kube_version()}; NodeResourcesFit RequestedToCapacityRatio nvidia.com/gpu 0:0,100:10; "
                 "QPS/burst 5000; leader election off; gates " + ",".join(FEATURE_GATES),
        feature_gates=FEATURE_GATES,
        binary=_kube_scheduler,
    ),
    "kube-scheduler-gang": Peer(
        name="kube-scheduler-gang",
        scheduler_name="default-scheduler",
        gang_style=GANG_K8S,
        settings=f"{kube_version()}, as kube-scheduler plus gates "
                 + ",".join(K8S_GANG_GATES[len(FEATURE_GATES):]) + f"; gangs in {K8S_GANG_API}",
        feature_gates=K8S_GANG_GATES,
        binary=_kube_scheduler,
    ),
    "coscheduling": Peer(
        name="coscheduling",
        scheduler_name="scheduler-plugins-scheduler",
        gang_style=GANG_X_K8S,
        settings="scheduler-plugins v0.34.7 (Kubernetes v1.34.4 libraries); Coscheduling "
                 "queueSort + multiPoint; NodeResourcesFit RTCR as kube-scheduler; QPS/burst 5000",
        binary=_scheduler_plugins,
        profile={
            "plugins": {
                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
            },
            "pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 60}}],
        },
    ),
}


def get_peer(name: str) -> Peer:
    try:
        return PEERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r} (known: {', '.join(PEERS)})") from None


def apiserver_args(peers: list[Peer]) -> list[str]:
    """The union of the peers' apiserver flags, feature gates merged into one flag."""
    gates: list[str] = []
    other: list[str] = []
    for p in peers:
        for arg in p.apiserver_args:
            if arg.startswith("--feature-gates="):
                for g in arg.split("=", 1)[1].split(","):
                    if g not in gates:
                        gates.append(g)
            elif arg not in other:
                other.append(arg)
    return ([f"--feature-gates={','.join(gates)}"] if gates else []) + other
