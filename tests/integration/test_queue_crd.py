"""The Queue CRD on a real apiserver: good specs are defaulted and parse; bad ones are
rejected by the schema; the status subresource takes what :meth:`QueueTree.status` writes;
the printer columns read."""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import pytest

from batchsched.core.queues import QueueTree, parse_queue
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import InvalidError
from batchsched.sandbox import build

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

QUEUES = "/apis/batchsched.io/v1alpha1/queues"
GPU = "nvidia.com/gpu"


def queue(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


async def test_a_good_queue_is_defaulted_and_parses(kube: KubeClient, sandbox: Any) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}"
    spec = {"parent": "org", "resources": [{"name": GPU, "nominal": 8, "borrowingLimit": "4", "lendingLimit": 2},
                                           {"name": "memory", "nominal": "64Gi"}]}
    created = await kube.create(QUEUES, queue(name, spec))
    try:
        assert created["spec"]["weight"] == 1
        assert created["spec"]["preemption"] == {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
        q = parse_queue(created)
        assert (q.quotas[GPU].nominal, q.quotas[GPU].borrowing_limit, q.quotas[GPU].lending_limit) == (8, 4, 2)
        # the status our tree writes is accepted by the status subresource
        tree = QueueTree([parse_queue(queue("org", {})), q], ("cpu", "memory", "pods", GPU))
        status = tree.status(name, pending=1, admitted=0)
        for c in status["conditions"]:
            c["lastTransitionTime"] = "2024-01-01T00:00:00Z"
        await kube.patch(f"{QUEUES}/{name}/status", {"status": status})
        got = await kube.get(f"{QUEUES}/{name}")
        assert got["status"]["nominal"] == {GPU: "8", "memory": "64Gi"}
        printed = subprocess.run(
            [str(build.ensure_binaries().kubectl), "--kubeconfig", sandbox.kubeconfig, "get", "queues", name],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.split("\n")
        assert printed[0].split() == ["NAME", "PARENT", "STOP", "NOMINAL", "GPUS", "USED", "GPUS", "BORROWED", "GPUS",
                                      "PENDING", "ADMITTED", "AGE"]
        assert printed[1].split() == [name, "org", "None", "8", "0", "0", "1", "0", printed[1].split()[-1]]
    finally:
        await kube.delete(f"{QUEUES}/{name}")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"resources": [{"name": GPU, "nominal": -1}]}, "nominal"),
        ({"resources": [{"name": GPU, "nominal": "-2"}]}, "nominal"),
        ({"resources": [{"name": GPU, "nominal": "lots"}]}, "nominal"),
        ({"resources": [{"name": GPU, "borrowingLimit": 2}]}, "borrowingLimit needs a nominal"),
        ({"resources": [{"name": GPU, "nominal": 1, "lendingLimit": "1.5x"}]}, "lendingLimit"),
        ({"resources": [{"name": GPU, "nominal": 1}, {"name": GPU, "nominal": 2}]}, "Duplicate value"),
        ({"weight": 0}, "weight"),
        ({"weight": -2}, "weight"),
        ({"preemption": {"withinQueue": "Sometimes"}}, "withinQueue"),
        ({"preemption": {"reclaimWithinCohort": "All"}}, "reclaimWithinCohort"),
        ({"parent": "Not_A_Name"}, "parent"),
        ({"parent": "SELF"}, "a queue cannot be its own parent"),
    ],
)
async def test_bad_specs_are_rejected(kube: KubeClient, spec: dict[str, Any], fragment: str) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}"
    if spec.get("parent") == "SELF":
        spec = {**spec, "parent": name}
    with pytest.raises(InvalidError) as info:
        await kube.create(QUEUES, queue(name, spec))
    assert fragment in str(info.value)
