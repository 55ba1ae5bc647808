"""The scheduler's image, built from the repository's Containerfile where no container
registry is reached.

The Containerfile starts from ``BASE`` (by default the Python project's slim Debian image
from a registry). Here the base is made from Debian's own packages instead: ``debootstrap``
lays out a minimal Debian (:data:`SUITE`, with ``python3``, its ``venv`` module and the CA
certificates) in a folder, and ``buildah`` commits that folder as the image
:data:`BASE_IMAGE`, once (it is kept in buildah's storage and reused). Then ``buildah bud``
builds the Containerfile on it, as ``podman build`` or ``docker build`` would with a
registry's base. Both run daemonless, as root, with the ``vfs`` storage driver and
``chroot`` isolation, which need no kernel feature beyond a chroot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from batchsched.sandbox.build import BuildError, cache_dir

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: what the base holds beyond debootstrap's minimal set
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_IMAGE = f"localhost/batchsched-base:{SUITE}"
#: the repository name of the image the chart and the Deployment run (tagged with the version)
IMAGE = "batchsched"


def buildah_command() -> list[str]:
    """buildah with the storage driver and isolation this machine allows."""
    buildah = shutil.which("buildah")
    if buildah is None:
        raise BuildError("buildah is not installed (Debian's package buildah)")
    return [buildah, "--storage-driver", "vfs"]


def _env() -> dict[str, str]:
    return {**os.environ, "BUILDAH_ISOLATION": "chroot", "STORAGE_DRIVER": "vfs"}


def _run(cmd: list[str], what: str, log: Path, *, timeout: float = 1800) -> str:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=out, text=True, env=_env(), timeout=timeout)
        out.write(proc.stdout)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise BuildError(f"{what} failed (log {log}):\n" + "\n".join(tail))
    return proc.stdout


def image_exists(name: str) -> bool:
    done = subprocess.run([*buildah_command(), "inspect", "--type", "image", name],
                          capture_output=True, env=_env())
    return done.returncode == 0


def ensure_base(log: Path) -> str:
    """:data:`BASE_IMAGE`, made from Debian's packages the first time."""
    if image_exists(BASE_IMAGE):
        return BASE_IMAGE
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise BuildError("debootstrap is not installed (Debian's package debootstrap)")
    buildah = buildah_command()
    with tempfile.TemporaryDirectory(prefix="batchsched-rootfs-", dir=cache_dir()) as root:
        _run([debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, root, MIRROR],
             f"debootstrap of Debian {SUITE}", log)
        container = _run([*buildah, "from", "scratch"], "buildah from scratch", log).strip()
        try:
            _run([*buildah, "copy", container, root, "/"], "copying the base's files", log)
            _run([*buildah, "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "--env", "LANG=C.UTF-8", "--cmd", "python3", container], "configuring the base", log)
            _run([*buildah, "commit", "--rm", container, BASE_IMAGE], "committing the base", log)
        except BaseException:
            subprocess.run([*buildah, "rm", container], capture_output=True, env=_env())
            raise
    return BASE_IMAGE


#: where the build sees the CA bundle pip is told to trust on this machine
BUILD_CA = "/run/build-ca.crt"


def host_ca_bundle() -> str | None:
    """The CA bundle pip trusts on this machine when one is named (``PIP_CERT``, else
    ``SSL_CERT_FILE``): a proxy that re-signs TLS is trusted inside the build too."""
    for name in ("PIP_CERT", "SSL_CERT_FILE"):
        path = os.environ.get(name)
        if path and os.path.isfile(path):
            return path
    return None


def build(context: Path, version: str, *, log: Path | None = None) -> str:
    """Build the Containerfile in ``context`` (the repository) on the Debian base; returns
    the image's name, ``localhost/batchsched:<version>``."""
    log = log or cache_dir() / "build-image.log"
    log.write_text("")
    base = ensure_base(log)
    tag = f"localhost/{IMAGE}:{version}"
    ca = host_ca_bundle()
    trust = ["-v", f"{ca}:{BUILD_CA}:ro", "--build-arg", f"PIP_CERT={BUILD_CA}"] if ca else []
    _run([*buildah_command(), "bud", "--isolation", "chroot", "--layers=false", "--build-arg", f"BASE={base}",
          *trust, "-f", str(context / "Containerfile"), "-t", tag, str(context)], "building the image", log)
    return tag


def inspect(name: str) -> dict[str, Any]:
    """The image's configuration as buildah reports it (``OCIv1.config``: User, Entrypoint...)."""
    out = subprocess.run([*buildah_command(), "inspect", "--type", "image", name],
                         capture_output=True, text=True, env=_env(), check=True).stdout
    found: dict[str, Any] = json.loads(out)
    return found


def run_in(name: str, *cmd: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``cmd`` in a new container of image ``name`` (as its configured user), removed after."""
    buildah = buildah_command()
    container = subprocess.run([*buildah, "from", name], capture_output=True, text=True, env=_env(),
                               check=True).stdout.strip()
    try:
        return subprocess.run([*buildah, "run", "--isolation", "chroot", container, "--", *cmd],
                              capture_output=True, text=True, env=_env(), timeout=timeout)
    finally:
        subprocess.run([*buildah, "rm", container], capture_output=True, env=_env())
