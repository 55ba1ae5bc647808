"""``batchsched explain`` and ``jobs`` on Kubernetes' own pod groups (``scheduling.k8s.io/v1beta1``)
on the 1.37 sandbox, through the CLI: a waiting gang found by its name and by a member, shown
as Kubernetes' own; a scheduler-plugins PodGroup of the same name in the namespace is said,
and chosen with ``podgroup.scheduling.x-k8s.io`` (the server reads the API the CLI sends)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    create_group,
    create_pods,
    pod_body,
    running_scheduler,
    wait_for,
)
from tests.integration.test_explain import cli, explained
from tests.integration.test_upstream_groups import member, podgroup

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def answer(sandbox: Any, namespace: str, *words: str) -> dict[str, Any] | None:
    """``explain ... -o json``, or None while the scheduler does not hold it yet."""
    out = await cli(sandbox, namespace, "explain", *words, "-n", namespace, "-o", "json")
    return dict(json.loads(out.stdout)) if out.returncode == 0 else None


async def test_an_upstream_gang_is_explained_as_kubernetes_own_and_a_same_named_group_is_said(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    pool = f"up-{uuid.uuid4().hex[:6]}"
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    async with running_scheduler(sandbox, namespace):
        await podgroup(kube, namespace, "train", 2)
        await create_pods(kube, namespace, [member(f"train-{i}", "train", gpu=8, pool=pool) for i in range(2)])
        await create_group(kube, XK8S, namespace, "train", {"minMember": 1})
        await create_pods(kube, namespace, [pod_body("plugins-0", gpu=1, metadata={
            "labels": {"scheduling.x-k8s.io/pod-group": "train"}}, spec={"nodeSelector": {"pool": pool}})])

        async def told() -> dict[str, Any] | None:
            out = await answer(sandbox, namespace, "podgroup", "train")
            return out if out and out["job"]["message"] and out["alsoIn"] else None

        out = await wait_for(told, timeout=60, interval=1.0)
        job = out["job"]
        assert job["api"] == "scheduling.k8s.io" and job["state"] in ("queued", "reserved"), job
        assert job["members"] == {"bound": 0, "required": 2, "total": 2}
        assert "16 nvidia.com/gpu" in job["message"], job["message"]
        assert out["alsoIn"] == ["scheduling.x-k8s.io"]

        text = await cli(sandbox, namespace, "explain", "pg", "train", "-n", namespace)
        assert text.returncode == 0, text.stderr
        assert f"PodGroup {namespace}/train: " in text.stdout and "\n  api: scheduling.k8s.io\n" in text.stdout
        assert f"also a PodGroup {namespace}/train in scheduling.x-k8s.io" in text.stdout

        by_member = await explained(sandbox, namespace, "pod", "train-1")
        assert by_member["job"]["key"] == f"k8s:{namespace}/train"

        async def plugins_running() -> dict[str, Any] | None:
            out = await answer(sandbox, namespace, "podgroup.scheduling.x-k8s.io", "train")
            return out if out and out["job"]["state"] == "running" else None

        chosen = await wait_for(plugins_running, timeout=60, interval=1.0)
        assert chosen["api"] == "scheduling.x-k8s.io" and chosen["alsoIn"] == ["scheduling.k8s.io"]

        rows = await cli(sandbox, namespace, "jobs", "-n", namespace)
        assert rows.returncode == 0, rows.stderr
        lines = rows.stdout.splitlines()
        assert lines[0].split()[:3] == ["NAME", "KIND", "API"], rows.stdout
        assert sorted(line.split()[2] for line in lines[1:] if line.split()[0] == "train") == [
            "scheduling.k8s.io", "scheduling.x-k8s.io"], rows.stdout
