"""Installed as users install it: a wheel built from this repository, put into a fresh
virtualenv with its dependencies but no extras. Every verb works without an extra; the
package carries the manifests the sandbox applies and the web view's files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration]


def run(*cmd: str | Path, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env, check=False)


def test_a_wheel_without_extras_runs_and_every_verb_works_or_names_its_extra(tmp_path: Path) -> None:
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", REPO)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("batchsched-*.whl")
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0
    bin_ = venv / "bin"
    installed = run(bin_ / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    assert installed.returncode == 0, installed.stderr
    # cryptography comes with it: the scheduler makes its views' certificate by default
    probe = run(bin_ / "python", "-c", "import importlib.util as u; print(u.find_spec('cryptography') is None)")
    assert probe.stdout.strip() == "False", "the plain install cannot make the views' certificate"

    # what works after a plain install
    for words in (["--help"], ["run", "--help"], ["simulate", "--help"], ["explain", "--help"],
                  ["jobs", "--help"], ["dashboard", "--help"]):
        done = run(bin_ / "batchsched", *words, cwd=tmp_path)
        assert done.returncode == 0, (words, done.stderr)
    assert run(bin_ / "kubectl-batchsched", "--help").returncode == 0
    bad = run(bin_ / "batchsched", "explain", "pod", "x", "--kubeconfig", tmp_path / "missing", cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr.startswith("batchsched: error: ") and "Traceback" not in bad.stderr

    # the sandbox's verbs need no extra either (its status: none of that name is running)
    done = run(bin_ / "batchsched", "sandbox", "status", "--name", "no-extra", cwd=tmp_path)
    assert done.returncode == 3 and '"running": false' in done.stdout, (done.stdout, done.stderr)

    # the package carries what the sandbox applies and what the web view serves
    files = run(bin_ / "python", "-c", "import importlib.resources as r, batchsched; "
                "p = r.files('batchsched'); print(sorted(f.name for f in (p / 'manifests' / 'base').iterdir())); "
                "print((p / 'insight' / 'web' / 'index.html').is_file())")
    assert files.returncode == 0, files.stderr
    listed, web = files.stdout.strip().splitlines()
    assert "crd-queues.yaml" in listed and "rbac.yaml" in listed and "crd-podgroups-x-k8s.yaml" in listed
    assert "kustomization.yaml" in listed and "config" in listed  # the whole kustomize base
    assert web == "True"
