"""Tools the tests take from Debian's packages (Chromium, promtool): found on the machine,
or installed with apt-get when the tests run as root (as CI does on a fresh machine).

Without the tool a test is skipped on a developer's machine and fails when ``CI=true``, as
the control plane's fixtures do.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def debian_tool(path: str, package: str, *names: str) -> str:
    """The executable at ``path`` (or one of ``names`` on PATH), installing Debian's
    ``package`` when it is missing and we are root."""
    found = _find(path, names)
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", package]
        if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
            # the package lists may be stale or absent (a fresh image): read them, then try again
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
            subprocess.run(install, env=env, capture_output=True, timeout=900)
        found = _find(path, names)
    if found is None:
        message = f"{path} is not installed (Debian's package {package!r})"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


def _find(path: str, names: tuple[str, ...]) -> str | None:
    if os.access(path, os.X_OK):
        return path
    for name in (os.path.basename(path), *names):
        found = shutil.which(name)
        if found:
            return found
    return None
