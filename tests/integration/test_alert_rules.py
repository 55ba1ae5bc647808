"""The alert rules of ``manifests/overlays/with-monitoring/alerts.yaml`` checked and unit-tested by
Prometheus's own ``promtool`` (Debian's ``prometheus`` package): the rules load, and each
alert fires on the made-up series of ``alerts.test.yaml`` it is meant for and stays quiet
where it must not. (The rules' metrics are held to a running scheduler by
``test_monitoring.py``.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.debian import debian_tool

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "overlays" / "with-monitoring"


def test_promtool_loads_the_rules_and_their_unit_tests_pass(tmp_path: Path) -> None:
    promtool = debian_tool("/usr/bin/promtool", "prometheus")
    rule = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    # promtool reads plain rule groups: the PrometheusRule's spec
    (tmp_path / "alerts.rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    shutil.copy(MONITORING / "alerts.test.yaml", tmp_path / "alerts.test.yaml")
    check = subprocess.run([promtool, "check", "rules", str(tmp_path / "alerts.rules.yaml")],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "alerts.test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout + test.stderr
