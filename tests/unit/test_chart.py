"""The packaging's sources, without rendering them (tests/integration/test_packaging.py
renders and installs them): the chart reads the base's files rather than copies, and every
configuration file of the base and overlays is valid and agrees with the Deployment that
reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsched.config import Config, LeaderElectionSection, parse_config

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
CHART = ROOT / "charts" / "batchsched"
KUSTOMIZATIONS = [BASE, *sorted((MANIFESTS / "overlays").iterdir())]


def kustomization(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return data


def test_the_charts_crds_and_files_are_links_to_the_manifests() -> None:
    links = [*(CHART / "crds").iterdir(), *(CHART / "files").iterdir()]
    assert links
    for link in links:
        assert link.is_symlink(), f"{link} is a copy: link it to the file of manifests/ instead"
        assert link.resolve().is_relative_to(MANIFESTS.resolve()) and link.resolve().is_file(), link
    # crds/ holds exactly the base's CRDs
    base_crds = {r for r in kustomization(BASE)["resources"] if r.startswith("crd-")}
    assert {p.name for p in (CHART / "crds").iterdir()} == base_crds
    assert {p.resolve() for p in (CHART / "crds").iterdir()} == {(BASE / r).resolve() for r in base_crds}


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_every_file_a_kustomization_names_exists(folder: Path) -> None:
    k = kustomization(folder)
    named = list(k.get("resources", []))
    for generator in k.get("configMapGenerator", []):
        named += [f.split("=", 1)[-1] for f in generator.get("files", [])]
    assert named
    for name in named:
        assert (folder / name).exists(), f"{folder.name}/kustomization.yaml names {name}, which is missing"


def configuration_files() -> list[Path]:
    return [
        folder / f.split("=", 1)[-1]
        for folder in KUSTOMIZATIONS
        for generator in kustomization(folder).get("configMapGenerator", [])
        if generator["name"] == "batchsched-config"
        for f in generator["files"]
    ]


def test_the_base_and_with_kueue_have_a_configuration() -> None:
    assert {p.parts[-3] for p in configuration_files()} == {"base", "with-kueue"}


@pytest.mark.parametrize("path", configuration_files(), ids=lambda p: p.parts[-3])
def test_each_configuration_is_valid_and_agrees_with_the_deployment(path: Path) -> None:
    config = parse_config(yaml.safe_load(path.read_text()))
    deploy = next(d for d in yaml.safe_load_all((BASE / "deployment.yaml").read_text())
                  if d and d["kind"] == "Deployment")
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    [port] = [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"]
    # served where the probes and the scrape look, from every address of the pod
    assert config.metrics_address == f"0.0.0.0:{port}"
    # the views on a port of their own (HTTPS), declared on the container
    [views] = [p["containerPort"] for p in container["ports"] if p["name"] == "views"]
    assert config.explain.address == f"0.0.0.0:{views}" != config.metrics_address
    # the Lease in the scheduler's own namespace (where the Role granting it is made)
    assert config.leader_election.namespace == deploy["metadata"]["namespace"]
    assert "batchsched" in config.scheduler_names


def test_with_kueue_claims_the_appwrapper_scheduler_name_and_leaves_kueue_its_pods() -> None:
    [path] = [p for p in configuration_files() if p.parts[-3] == "with-kueue"]
    data = yaml.safe_load(path.read_text())
    config = parse_config(data)
    assert "scheduler-plugins-scheduler" in config.scheduler_names
    assert data["kueue"] == {"preemptible": False}
    assert config.kueue.preemptible is False


def test_the_sandbox_configuration_beside_kueue_is_the_overlays_on_loopback() -> None:
    """config/with-kueue-sandbox.yaml, for trying batchsched beside Kueue on the sandbox,
    is the with-kueue overlay's configuration but for its addresses (loopback)."""
    [path] = [p for p in configuration_files() if p.parts[-3] == "with-kueue"]
    overlay = yaml.safe_load(path.read_text())
    sandbox = yaml.safe_load((ROOT / "config" / "with-kueue-sandbox.yaml").read_text())
    assert sandbox.pop("metricsAddress") == "127.0.0.1:10351"
    assert sandbox.pop("explain") == {"address": "127.0.0.1:10352"}
    overlay.pop("metricsAddress")
    overlay.pop("explain")
    assert sandbox == overlay
    assert parse_config(sandbox).scheduler_names == parse_config(overlay).scheduler_names


def test_the_charts_leader_election_defaults_are_the_schedulers() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    defaults = LeaderElectionSection()
    le = values["leaderElection"]
    assert (le["enabled"], le["leaseDurationSeconds"], le["renewDeadlineSeconds"], le["retryPeriodSeconds"]) == (
        defaults.enabled, defaults.lease_duration_seconds, defaults.renew_deadline_seconds,
        defaults.retry_period_seconds,
    )
    assert values["schedulerNames"] == list(Config().scheduler_names)
    assert values["config"] == {}


def test_the_cli_looks_for_the_lease_where_every_shipped_configuration_puts_it() -> None:
    """`batchsched explain` with no --lease-namespace must find the Lease of a scheduler
    installed as shipped: by the file's defaults, config/batchsched.yaml, the kustomize base
    and overlays (in the Deployment's namespace) and the chart (the release's namespace, as
    its README installs it)."""
    from batchsched.cli import build_parser

    cli = build_parser().parse_args(["explain", "podgroup", "x"])
    shipped = {"defaults": LeaderElectionSection().namespace,
               "config/batchsched.yaml": parse_config(yaml.safe_load((ROOT / "config" / "batchsched.yaml").read_text()))
               .leader_election.namespace}
    for path in configuration_files():
        shipped[str(path.relative_to(ROOT))] = parse_config(yaml.safe_load(path.read_text())).leader_election.namespace
    deploy = next(d for d in yaml.safe_load_all((BASE / "deployment.yaml").read_text()) if d and d["kind"] == "Deployment")
    shipped["manifests/base/deployment.yaml"] = deploy["metadata"]["namespace"]
    assert yaml.safe_load((CHART / "values.yaml").read_text())["leaderElection"]["namespace"] == ""
    installs = [line for readme in (ROOT / "README.md", CHART / "README.md")
                for line in readme.read_text().splitlines() if line.startswith("helm install")]
    assert installs
    for line in installs:
        words = line.split()
        flag = "-n" if "-n" in words else "--namespace"
        shipped[f"README: {line}"] = words[words.index(flag) + 1]
    assert shipped == dict.fromkeys(shipped, cli.lease_namespace)
    assert cli.lease_name == LeaderElectionSection().lease_name
