"""The scheduler's ClusterRole, as the kustomize base has it and the Helm chart renders it
(the chart takes its rules from ``files/rbac.yaml``, a link to the base's file; the real
render is compared with the base in tests/integration/test_packaging.py), grants what the
watch of every PodGroup API needs, Kubernetes' own included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from batchsched.core.gangs import K8S
from batchsched.kube.intake import PODGROUP_PATHS

ROOT = Path(__file__).resolve().parents[2]
CHART_RBAC = ROOT / "charts" / "batchsched" / "files" / "rbac.yaml"


def verbs(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {v for r in rules if group in r.get("apiGroups", []) and resource in r.get("resources", [])
            for v in r["verbs"]}


@pytest.mark.parametrize("api", sorted(PODGROUP_PATHS))
def test_the_scheduler_role_the_chart_renders_lists_watches_and_patches_the_status_of_each_podgroup_api(api: str) -> None:
    assert CHART_RBAC.resolve() == (ROOT / "manifests" / "base" / "rbac.yaml").resolve()
    [role] = [d for d in yaml.safe_load_all(CHART_RBAC.read_text())
              if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "batchsched"]
    assert verbs(role["rules"], api, "podgroups") >= {"list", "watch"}
    assert "patch" in verbs(role["rules"], api, "podgroups/status")


def test_kubernetes_own_podgroups_are_among_the_watched_apis() -> None:
    assert PODGROUP_PATHS[K8S] == "/apis/scheduling.k8s.io/v1beta1/podgroups"
