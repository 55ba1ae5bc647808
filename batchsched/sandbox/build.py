"""Build the control-plane binaries from their Go modules, once, and cache them.

Nothing is downloaded but Go modules (through the module proxy) and Python packages:

* kube-apiserver, kube-controller-manager, kube-scheduler and kubectl come from
  ``k8s.io/kubernetes`` pinned in ``gomod/kubernetes/go.mod`` (with a replace line per
  staging module, since the upstream module's own local replaces do not apply to a
  dependency);
* kwok comes from ``sigs.k8s.io/kwok`` at :data:`KWOK_VERSION`;
* etcd comes from ``go.etcd.io/etcd/server/v3`` pinned in ``gomod/etcd/go.mod`` (the same
  replace treatment for its sibling modules);
* scheduler-plugins' scheduler (Coscheduling), a peer for the perf suite only, comes from
  ``sigs.k8s.io/scheduler-plugins`` pinned in ``gomod/scheduler-plugins/go.mod``; it is
  built on demand (:func:`scheduler_plugins_binary`), never by :func:`ensure_binaries`.

The Kubernetes commands are linked with the version of the pinned release written into
them (:func:`kube_ldflags`), as the release build does: built from the module alone they
would report ``v0.0.0-master+$Format:%H$``, which clients that parse the server's version
(Kueue, for one) refuse.

Builds land in ``$BATCHSCHED_CACHE`` (default ``~/.cache/batchsched``) under a key made
from the pinned versions, the Go toolchain and the linker flags, so a second start finds
them at once and a changed flag builds again. A file lock keeps two processes from
building the same thing at the same time.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KWOK_VERSION = "v0.8.0"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
GOMOD = Path(__file__).parent / "gomod"
#: what every build is linked with: no symbol table, no DWARF (smaller, faster to link)
STRIP_LDFLAGS = "-s -w"
#: the packages whose version variables the Kubernetes release build sets at link time
KUBE_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


class BuildError(RuntimeError):
    """A binary could not be built or found."""


@dataclass(slots=True, frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path


def cache_dir() -> Path:
    root = os.environ.get("BATCHSCHED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "batchsched"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _locked(name: str) -> Iterator[None]:
    lock_path = cache_dir() / f"{name}.lock"
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def go_command() -> str:
    """The Go toolchain's `go`: on PATH, or where the official archive installs it."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if not go:
        raise BuildError("the Go toolchain is not on PATH; it is needed to build the control plane")
    return go


def _go_version(go: str) -> str:
    return subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _run_build(cmd: list[str], *, cwd: Path | None, env: dict[str, str], what: str, log: Path) -> None:
    print(f"batchsched: building {what} from Go modules (first time only; a few minutes)...",
          file=sys.stderr, flush=True)
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise BuildError(f"building {what} failed (log {log}):\n" + "\n".join(tail))
    print(f"batchsched: built {what} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env["CGO_ENABLED"] = "0"
    return env


def required_version(module: str, path: str) -> str:
    """The version of Go module ``path`` that wrapper module ``gomod/<module>`` requires."""
    text = (GOMOD / module / "go.mod").read_text()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(path)}\s+(v\S+)", text, re.MULTILINE)
    if found is None:
        raise BuildError(f"gomod/{module}/go.mod does not require {path}")
    return found.group(1)


def kube_version() -> str:
    """The Kubernetes release the sandbox builds (``v1.37.2``), as ``gomod/kubernetes`` pins it."""
    return required_version("kubernetes", "k8s.io/kubernetes")


def kube_ldflags() -> str:
    """Linker flags that write the pinned release into the Kubernetes commands, as its
    release build does (``gitVersion``, major, minor, a clean tree; the build date of a
    build without one), so the apiserver's ``/version`` and ``kubectl version`` say it."""
    version = kube_version()
    numbers = re.match(r"v(\d+)\.(\d+)\.", version)
    if numbers is None:
        raise BuildError(f"the pinned Kubernetes version {version!r} is not vMAJOR.MINOR.PATCH")
    values = {
        "gitVersion": version, "gitMajor": numbers.group(1), "gitMinor": numbers.group(2),
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
    }
    flags = [f"-X {pkg}.{var}={value}" for pkg in KUBE_VERSION_PACKAGES for var, value in values.items()]
    return " ".join([STRIP_LDFLAGS, *flags])


def _module_out(module: str, go: str, ldflags: str) -> Path:
    """Where the binaries of wrapper module ``gomod/<module>`` are cached."""
    mod = GOMOD / module
    key = _key((mod / "go.mod").read_bytes(), (mod / "go.sum").read_bytes(), _go_version(go), ldflags)
    return cache_dir() / "bin" / f"{module}-{key}"


def _module_binaries(module: str, packages: dict[str, str], what: str,
                     *, ldflags: str = STRIP_LDFLAGS) -> dict[str, Path]:
    """Build ``packages`` (binary name -> Go package) in the wrapper module ``gomod/<module>``."""
    go = go_command()
    mod = GOMOD / module
    out = _module_out(module, go, ldflags)
    paths = {name: out / name for name in packages}
    if all(p.exists() for p in paths.values()):
        return paths
    with _locked(module):
        if all(p.exists() for p in paths.values()):
            return paths
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if len(packages) == 1:
            [(name, pkg)] = packages.items()
            cmd = [go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp / name), pkg]
        else:
            cmd = [go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp) + "/", *packages.values()]
        _run_build(cmd, cwd=mod, env=_go_env(), what=what, log=cache_dir() / f"build-{module}.log")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return paths


def module_binary(module: str, name: str, package: str, what: str) -> Path:
    """The binary ``name`` of Go package ``package``, pinned by the wrapper module
    ``gomod/<module>`` (its go.mod and go.sum), built once and cached."""
    return _module_binaries(module, {name: package}, what)[name]


def module_source(module: str, go_module: str, marker: str) -> Path:
    """The source folder of Go module ``go_module`` in the module cache, at the version the
    wrapper module ``gomod/<module>`` pins: where a tool's own manifests (CRDs, webhook
    configurations) are read from, never copied into this repository. ``marker`` is a path
    in that folder that must exist; the module is downloaded if it is not there yet (a
    machine where only the binary is cached)."""
    go = go_command()
    cwd = GOMOD / module

    def folder() -> Path | None:
        out = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", go_module], cwd=cwd,
                             capture_output=True, text=True, check=False)
        found = Path(out.stdout.strip())
        return found if out.returncode == 0 and out.stdout.strip() and (found / marker).exists() else None

    found = folder()
    if found is None:
        subprocess.run([go, "mod", "download", go_module], cwd=cwd, capture_output=True, check=False)
        found = folder()
    if found is None:
        raise BuildError(f"{go_module} ({marker}) is not in the Go module cache")
    return found


def cached_module_binary(module: str, name: str) -> Path | None:
    """That binary if it is already built, else None (never builds)."""
    try:
        path = _module_out(module, go_command(), STRIP_LDFLAGS) / name
    except (BuildError, OSError, subprocess.CalledProcessError):
        return None
    return path if path.exists() else None


def kube_binaries() -> dict[str, Path]:
    """kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, built if missing."""
    return _module_binaries(
        "kubernetes",
        {name: f"k8s.io/kubernetes/cmd/{name}" for name in KUBE_COMMANDS},
        "Kubernetes " + ", ".join(KUBE_COMMANDS),
        ldflags=kube_ldflags(),
    )


def kwok_binary() -> Path:
    """kwok at :data:`KWOK_VERSION`, built if missing."""
    go = go_command()
    out = cache_dir() / "bin" / f"kwok-{KWOK_VERSION}-{_key(_go_version(go))}"
    path = out / "kwok"
    if path.exists():
        return path
    with _locked("kwok"):
        if path.exists():
            return path
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        env = _go_env()
        env["GOBIN"] = str(tmp)
        env.pop("GOFLAGS", None)
        _run_build(
            [go, "install", "-trimpath", f"-ldflags={STRIP_LDFLAGS}", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"],
            cwd=None, env=env, what=f"kwok {KWOK_VERSION}", log=cache_dir() / "build-kwok.log",
        )
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return path


def etcd_binary() -> Path:
    """etcd, built from the pinned etcd server module if missing."""
    return _module_binaries("etcd", {"etcd": "go.etcd.io/etcd/server/v3"}, "etcd")["etcd"]


SCHEDULER_PLUGINS = "scheduler-plugins-scheduler"


def scheduler_plugins_binary() -> Path:
    """scheduler-plugins' ``cmd/scheduler`` (kube-scheduler plus Coscheduling and friends).

    A peer for the perf suite: built only when asked for, so the sandbox and the tests that
    do not need it never pay for it. See ``gomod/scheduler-plugins/go.mod`` for the pinned
    release and the Kubernetes version it is built against.
    """
    return module_binary(
        "scheduler-plugins", SCHEDULER_PLUGINS, "sigs.k8s.io/scheduler-plugins/cmd/scheduler",
        "scheduler-plugins scheduler",
    )


def cached_scheduler_plugins_binary() -> Path | None:
    """The scheduler-plugins binary if it is already built, else None (never builds)."""
    return cached_module_binary("scheduler-plugins", SCHEDULER_PLUGINS)


def ensure_binaries() -> Binaries:
    """Every binary the sandbox runs, building what is not cached yet."""
    kube = kube_binaries()
    return Binaries(
        etcd=etcd_binary(),
        kube_apiserver=kube["kube-apiserver"],
        kube_controller_manager=kube["kube-controller-manager"],
        kube_scheduler=kube["kube-scheduler"],
        kubectl=kube["kubectl"],
        kwok=kwok_binary(),
    )
