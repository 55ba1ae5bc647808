"""A real local control plane on loopback: etcd, kube-apiserver, kube-controller-manager, kwok.

The Kubernetes release is the one ``gomod/kubernetes`` pins (see :mod:`.build`); the
apiserver and the controller manager run with the feature gates and API versions of
:mod:`.features` (the Workload API and its gangs, DRA), which ``apiserver_args`` may add to.

``Sandbox(name).up(...)`` starts the four processes (each in its own session, with its log
under the sandbox's state folder), waits for the apiserver's ``/readyz``, applies the
project's CRDs and example PriorityClasses from ``manifests/base/``, creates the requested fake
nodes and waits until every one is Ready with the admission-time ``not-ready`` taint lifted
by the controller manager. ``down()`` stops exactly the processes ``up`` started, by PID
(checked against the binary each PID was started from), and removes the state.

The state of a sandbox lives in ``<cache>/sandbox/<name>/``: ``state.json`` (PIDs, ports,
kubeconfig paths, each process's arguments), ``pki/`` (0700), ``etcd/``, ``logs/`` and the
kubeconfigs (0600).

For fault tests, one component can be stopped (``stop_component``, SIGKILL by default) and
started again with the same arguments and data (``start_component``, optionally with
arguments added, e.g. a smaller watch cache), and etcd's history compacted to its current
revision (``compact_etcd``), so a watch resumed from before gets a real 410 Gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError
from batchsched.sandbox import build, features, pki
from batchsched.sandbox.nodes import NodeShape, create_nodes, wait_nodes_ready

#: the CRDs, RBAC and PriorityClasses applied at start: the kustomize base of the
#: repository's manifests/, which the package carries as batchsched/manifests (a link to it
#: in a checkout); its kustomization.yaml is no object to apply
MANIFESTS = Path(__file__).parent.parent / "manifests" / "base"
KWOK_STAGES = Path(__file__).parent / "kwok-stages.yaml"
SERVICE_CIDR = "10.0.0.0/24"

# Node liveness at thousands of fake nodes. kwok renews every node's Lease each quarter of
# its duration; with kubelet's 40 s that is 100 renewals/s per 1,000 nodes, all on the one
# apiserver of this 2-core machine (70% of a core at 5,000 nodes when idle; at 10,000 the
# renewals fell behind, the node lifecycle controller marked nodes Unknown after its 50 s
# grace and kwok set them Ready again, so the cluster never became Ready). A 600 s Lease
# is renewed every 150 s (33/s at 5,000 nodes); the controller manager's grace periods
# stay above it. Fake nodes do not die, so the later detection of a lost node costs nothing.
NODE_LEASE_SECONDS = 600
NODE_MONITOR_GRACE = "900s"


class SandboxError(RuntimeError):
    """The sandbox could not do what was asked; the message is one line meant for a person."""


@dataclass(slots=True)
class ProcessInfo:
    name: str
    pid: int
    binary: str
    log: str
    #: the arguments it was started with (to start it again the same way)
    args: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SandboxState:
    name: str
    dir: str
    apiserver_port: int
    etcd_port: int
    kubeconfig: str
    kubeconfigs: dict[str, str]
    processes: list[ProcessInfo] = field(default_factory=list)
    nodes: int = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def save(self) -> None:
        data = asdict(self)
        Path(self.dir, "state.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))

    @classmethod
    def load(cls, directory: Path) -> SandboxState | None:
        path = directory / "state.json"
        if not path.exists():
            return None
        data = orjson.loads(path.read_bytes())
        procs = [ProcessInfo(**p) for p in data.pop("processes", [])]
        return cls(processes=procs, **data)


def port_free(port: int) -> bool:
    """Whether a server could listen on loopback ``port`` now. The probe binds as Go's
    servers (etcd, kube-apiserver) do, with ``SO_REUSEADDR``: connections a killed server
    leaves in TIME_WAIT do not keep it from listening again, a listener still there does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: ports handed out by :func:`free_port` in this process, never handed out twice
_HANDED: set[int] = set()
#: where :func:`free_port` looks when the kernel's range of local ports cannot be read
_LISTEN_PORTS = range(20000, 32768)


def _listen_ports() -> range:
    """Ports for the sandbox's servers: below the kernel's ephemeral range, so that no
    outgoing connection (of which the sandbox's own clients make thousands) can take a
    port between the moment it is chosen and the moment a server binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LISTEN_PORTS
    return range(10000, low) if low > 11000 else _LISTEN_PORTS


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, outside the ephemeral range, not
    handed out before by this process. (A port the kernel picks with ``bind(0)`` is an
    ephemeral one: an outgoing connection could take it before the server binds it.)"""
    ports = _listen_ports()
    for _ in range(200):
        port = random.randrange(ports.start, ports.stop)
        if port not in _HANDED and port_free(port):
            _HANDED.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_runs(pid: int, binary: str) -> bool:
    """True when ``pid`` is alive and still the process started from ``binary``."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return exe.removesuffix(" (deleted)") == os.path.realpath(binary)


def _stop(procs: Sequence[ProcessInfo], *, grace: float = 10.0) -> None:
    """SIGTERM each process still running its own binary, then SIGKILL what remains."""
    alive = [p for p in procs if pid_runs(p.pid, p.binary)]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        for p in alive:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p.pid, os.WNOHANG)
        alive = [p for p in alive if pid_runs(p.pid, p.binary)]
        if alive:
            time.sleep(0.1)
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(p.pid, 0)


def _ports(st: SandboxState, name: str) -> list[int]:
    """The loopback ports a component listens on, as its arguments say."""
    info = _component(st, name)
    ports = []
    for arg in info.args:
        flag, _, value = arg.partition("=")
        if flag in ("--secure-port", "--listen-client-urls", "--listen-peer-urls"):
            ports.append(int(value.rsplit(":", 1)[-1]))
    return ports


def _component(st: SandboxState, name: str) -> ProcessInfo:
    for p in st.processes:
        if p.name == name:
            return p
    raise SandboxError(f"sandbox {st.name!r} has no {name}")


def _admin_token(st: SandboxState) -> str:
    kc = yaml.safe_load(Path(st.kubeconfig).read_text())
    return str(kc["users"][0]["user"]["token"])


def http_ok(url: str, *, deadline: float, alive: Callable[[], None], interval: float = 0.1) -> bool:
    """Ask ``url`` until it answers 200 (True) or the monotonic ``deadline`` passes (False);
    ``alive()`` is called before each try and raises when the process serving it died."""
    import urllib.request

    while True:
        alive()
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def log_tail(path: str, lines: int = 8) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


class Sandbox:
    """One named local control plane. Methods are synchronous; they block until done."""

    def __init__(self, name: str = "default", *, root: Path | None = None) -> None:
        if not name or "/" in name or name.startswith("."):
            raise SandboxError(f"bad sandbox name {name!r}")
        self.name = name
        self.dir = (root or build.cache_dir() / "sandbox") / name

    # -- state -------------------------------------------------------------------

    def state(self) -> SandboxState | None:
        return SandboxState.load(self.dir)

    def running(self) -> bool:
        st = self.state()
        return bool(st and st.processes and all(pid_runs(p.pid, p.binary) for p in st.processes))

    # -- up ----------------------------------------------------------------------

    def up(
        self,
        shapes: Iterable[NodeShape] = (),
        *,
        apiserver_port: int | None = None,
        ready_timeout: float = 120.0,
        apiserver_args: Sequence[str] = (),
    ) -> SandboxState:
        """Start the control plane, or fail with a :class:`SandboxError` leaving nothing running."""
        shapes = list(shapes)
        if self.running():
            raise SandboxError(f"sandbox {self.name!r} is already running; `batchsched sandbox down` first")
        if apiserver_port is not None:
            if not 1 <= apiserver_port <= 65535:
                raise SandboxError(f"port {apiserver_port} is not a valid TCP port")
            if not port_free(apiserver_port):
                raise SandboxError(f"port {apiserver_port} on 127.0.0.1 is already in use")
        try:
            bins = build.ensure_binaries()
        except build.BuildError as exc:
            raise SandboxError(str(exc)) from exc

        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "logs").mkdir(parents=True)
        material = pki.make_pki(self.dir / "pki")
        api_port = apiserver_port or free_port()
        etcd_port, etcd_peer = free_port(), free_port()
        server = f"https://127.0.0.1:{api_port}"
        kubeconfigs = {}
        for user in pki.TOKEN_USERS:
            path = self.dir / f"kubeconfig-{user.replace(':', '-')}"
            pki.write_kubeconfig(path, server, material.ca_cert, material.tokens[user], user)
            kubeconfigs[user] = str(path)
        admin_kc = self.dir / "kubeconfig"
        shutil.copy(kubeconfigs["admin"], admin_kc)
        os.chmod(admin_kc, 0o600)
        st = SandboxState(
            name=self.name, dir=str(self.dir), apiserver_port=api_port, etcd_port=etcd_port,
            kubeconfig=str(admin_kc), kubeconfigs=kubeconfigs,
        )
        try:
            self._start(st, "etcd", bins.etcd, [
                "--name=sandbox", f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=sandbox=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync", "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ])
            self._wait_http(st, f"http://127.0.0.1:{etcd_port}/health", "etcd", timeout=30)
            self._start(st, "kube-apiserver", bins.kube_apiserver, features.apiserver_args([
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                # no Endpoints for the `kubernetes` Service: they would point at loopback,
                # which no pod could reach, and since 1.37 a reconciler refuses the address
                "--endpoint-reconciler-type=none",
                f"--secure-port={api_port}",
                f"--tls-cert-file={material.serving_cert}",
                f"--tls-private-key-file={material.serving_key}",
                f"--client-ca-file={material.ca_cert}",
                f"--token-auth-file={material.token_file}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={material.sa_pub}",
                f"--service-account-signing-key-file={material.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--requestheader-client-ca-file={material.front_proxy_ca}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={material.front_proxy_cert}",
                f"--proxy-client-key-file={material.front_proxy_key}",
                "--allow-privileged=true",
                "--max-requests-inflight=3000", "--max-mutating-requests-inflight=1000",
                "--profiling=false", "--v=1",
                *apiserver_args,
            ]))
            self._wait_ready(st, material.tokens["admin"], timeout=ready_timeout)
            self._start(st, "kube-controller-manager", bins.kube_controller_manager, features.control_plane_args([
                f"--kubeconfig={kubeconfigs['system:kube-controller-manager']}",
                f"--authentication-kubeconfig={kubeconfigs['system:kube-controller-manager']}",
                f"--authorization-kubeconfig={kubeconfigs['system:kube-controller-manager']}",
                "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={material.sa_key}",
                f"--root-ca-file={material.ca_cert}",
                f"--cluster-signing-cert-file={material.ca_cert}",
                f"--cluster-signing-key-file={material.ca_key}",
                "--leader-elect=false",
                # the TTL controller re-annotates every node each time the cluster grows past
                # a size step (100, 500, 1,000, 2,000 nodes): writes for kubelets we do not have
                "--controllers=*,-ttl-controller",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                f"--node-startup-grace-period={NODE_MONITOR_GRACE}",
                "--kube-api-qps=500", "--kube-api-burst=1000",
                "--concurrent-gc-syncs=50", "--concurrent-namespace-syncs=20",
                "--profiling=false", "--v=1",
            ]))
            self._start(st, "kwok", bins.kwok, [
                f"--kubeconfig={kubeconfigs['kwok']}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--config={KWOK_STAGES}",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
                "--cidr=10.64.0.0/12", "--node-ip=10.96.0.1",
                "-v=WARN",
            ])
            asyncio.run(self._bootstrap(st, shapes, timeout=ready_timeout))
            st.nodes = sum(s.count for s in shapes)
            st.save()
        except BaseException:
            _stop(st.processes)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        return st

    def _start(self, st: SandboxState, name: str, binary: Path, args: list[str], *, append: bool = False) -> ProcessInfo:
        log = self.dir / "logs" / f"{name}.log"
        with open(log, "ab" if append else "wb") as out:
            proc = subprocess.Popen(
                [str(binary), *args], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.dir,
            )
        info = ProcessInfo(name=name, pid=proc.pid, binary=str(binary), log=str(log), args=list(args))
        st.processes = [p for p in st.processes if p.name != name] + [info]
        st.save()
        return info

    # -- one component at a time (fault tests) ----------------------------------------------

    def _running_state(self) -> SandboxState:
        st = self.state()
        if st is None:
            raise SandboxError(f"sandbox {self.name!r} is not running")
        return st

    def stop_component(self, name: str, *, sig: int = signal.SIGKILL) -> None:
        """Stop one component (``etcd``, ``kube-apiserver``...) with ``sig`` and wait for it
        to exit; its arguments stay in the state for :meth:`start_component`."""
        st = self._running_state()
        info = _component(st, name)
        if not pid_runs(info.pid, info.binary):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, sig)
        deadline = time.monotonic() + 30
        while pid_runs(info.pid, info.binary) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(info.pid, os.WNOHANG)
            time.sleep(0.05)
        if pid_runs(info.pid, info.binary):
            raise SandboxError(f"{name} (pid {info.pid}) did not exit")
        # a killed process gives up its memory (and its /proc exe link) before its sockets:
        # wait until its ports can be listened on again
        while not all(port_free(p) for p in _ports(st, name)) and time.monotonic() < deadline:
            time.sleep(0.05)

    def start_component(self, name: str, *, extra_args: Sequence[str] = (), without: Sequence[str] = (),
                        timeout: float = 120.0) -> SandboxState:
        """Start a stopped component again with the arguments it last ran with (plus
        ``extra_args``, which replace an argument of the same ``--flag=``; less the
        arguments in ``without``), the same data and log; wait until it is healthy.
        Returns the updated state."""
        st = self._running_state()
        info = _component(st, name)
        if pid_runs(info.pid, info.binary):
            raise SandboxError(f"{name} is still running (pid {info.pid})")
        if not info.args:
            raise SandboxError(f"the state of sandbox {self.name!r} does not record how {name} was started")
        flags = {a.split("=", 1)[0] for a in extra_args}
        args = [a for a in info.args if a.split("=", 1)[0] not in flags and a not in without] + list(extra_args)
        self._start(st, name, Path(info.binary), args, append=True)
        if name == "etcd":
            self._wait_http(st, f"http://127.0.0.1:{st.etcd_port}/health", "etcd", timeout=timeout)
        elif name == "kube-apiserver":
            token = _admin_token(st)
            self._wait_ready(st, token, timeout=timeout)
        return st

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (as the apiserver does every
        five minutes); returns that revision. A watch from an older resourceVersion then
        gets 410 Gone from etcd."""
        import base64
        import urllib.request

        st = self._running_state()
        base = f"http://127.0.0.1:{st.etcd_port}/v3/kv"

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            req = urllib.request.Request(f"{base}/{path}", data=orjson.dumps(body), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                out: dict[str, Any] = orjson.loads(resp.read())
                return out

        head = post("range", {"key": base64.b64encode(b"/registry/").decode(), "limit": 1})
        revision = int(head["header"]["revision"])
        post("compaction", {"revision": revision})
        return revision

    def _check_alive(self, st: SandboxState) -> None:
        for p in st.processes:
            if not pid_runs(p.pid, p.binary):
                raise SandboxError(f"{p.name} exited during start-up: {log_tail(p.log)}")

    def _wait_http(self, st: SandboxState, url: str, what: str, *, timeout: float) -> None:
        if not http_ok(url, deadline=time.monotonic() + timeout, alive=lambda: self._check_alive(st)):
            raise SandboxError(f"{what} did not become healthy within {timeout:.0f} s")

    def _wait_ready(self, st: SandboxState, token: str, *, timeout: float) -> None:
        import ssl
        import urllib.request

        ctx = ssl.create_default_context(cafile=str(self.dir / "pki" / "ca.crt"))
        req = urllib.request.Request(
            f"{st.server}/readyz", headers={"Authorization": f"Bearer {token}"}
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive(st)
            with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
            time.sleep(0.2)
        raise SandboxError(f"kube-apiserver was not ready within {timeout:.0f} s")

    async def _bootstrap(self, st: SandboxState, shapes: list[NodeShape], *, timeout: float) -> None:
        client = await KubeClient.connect(st.kubeconfig)
        try:
            await apply_manifests(client, sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml"))
            if shapes:
                names = await create_nodes(client, shapes)
                await self._while_alive(st, wait_nodes_ready(client, names, timeout=timeout))
        finally:
            await client.close()

    async def _while_alive(self, st: SandboxState, waiting: Coroutine[Any, Any, None]) -> None:
        """Await ``waiting``, failing at once if a control-plane process exits meanwhile."""
        task = asyncio.ensure_future(waiting)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                if not task.done():
                    self._check_alive(st)
            task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    # -- down / status -------------------------------------------------------------

    def down(self) -> bool:
        """Stop what ``up`` started and remove the state; False if there was nothing."""
        st = self.state()
        if st is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return False
        _stop(list(reversed(st.processes)))
        shutil.rmtree(self.dir, ignore_errors=True)
        return True

    def status(self) -> dict[str, Any]:
        st = self.state()
        if st is None:
            return {"name": self.name, "running": False}
        procs = {p.name: {"pid": p.pid, "alive": pid_runs(p.pid, p.binary)} for p in st.processes}
        return {
            "name": self.name,
            "running": all(p["alive"] for p in procs.values()),
            "server": st.server,
            "kubeconfig": st.kubeconfig,
            "nodes": st.nodes,
            "processes": procs,
        }


# -- applying manifests ---------------------------------------------------------------

_CLUSTER_SCOPED = {
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ("scheduling.k8s.io/v1", "PriorityClass"): "/apis/scheduling.k8s.io/v1/priorityclasses",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    ("v1", "Namespace"): "/api/v1/namespaces",
}


def collection_path(obj: dict[str, Any]) -> str:
    """The REST collection an object of a built-in kind is created in."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key in _CLUSTER_SCOPED:
        return _CLUSTER_SCOPED[key]
    ns = obj.get("metadata", {}).get("namespace") or "default"
    group_version = obj["apiVersion"]
    plural = obj["kind"].lower() + "s"
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return f"{base}/namespaces/{ns}/{plural}"


async def apply_manifests(client: KubeClient, files: Iterable[Path], *, only_cluster_scoped: bool = True) -> None:
    """Create or update the CRDs, PriorityClasses and cluster RBAC in ``files``.

    Namespaced objects (the scheduler's own Deployment) are skipped when
    ``only_cluster_scoped``: the sandbox does not run pods with real containers.
    """
    crds: list[str] = []
    for path in files:
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj:
                continue
            key = (obj.get("apiVersion", ""), obj.get("kind", ""))
            if only_cluster_scoped and key not in _CLUSTER_SCOPED:
                continue
            await create_or_replace(client, collection_path(obj), obj)
            if key[1] == "CustomResourceDefinition":
                crds.append(obj["metadata"]["name"])
    for name in crds:
        await _wait_crd(client, name)


async def create_or_replace(client: KubeClient, collection: str, body: dict[str, Any]) -> None:
    """Create ``body`` in ``collection``, or replace the object of its name with it."""
    try:
        await client.create(collection, body)
    except ConflictError:
        path = f"{collection}/{body['metadata']['name']}"
        current = await client.get(path)
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        await client.replace(path, body)


async def grant_lease_namespace(client: KubeClient, namespace: str, rbac: Path = MANIFESTS / "rbac.yaml") -> None:
    """The Roles and RoleBindings of ``rbac`` made in ``namespace`` instead of their own: what
    a scheduler whose Lease is kept there needs (the workload mix's ConfigMap sits next to
    it), as the chart puts them in the Lease's namespace."""
    for obj in yaml.safe_load_all(rbac.read_text()):
        if obj and obj.get("kind") in ("Role", "RoleBinding"):
            body = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
            await client.create(collection_path(body), body)


async def _wait_crd(client: KubeClient, name: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    while time.monotonic() < deadline:
        crd = await client.get(path)
        conds = (crd.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
            return
        await asyncio.sleep(0.1)
    raise SandboxError(f"CRD {name} was not established within {timeout:.0f} s")


__all__ = [
    "KubeError", "Sandbox", "SandboxError", "SandboxState", "apply_manifests", "free_port", "grant_lease_namespace",
    "http_ok", "log_tail",
]
