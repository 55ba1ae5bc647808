"""What ``kubectl get queues`` and ``kubectl get podgroups`` show, read with the sandbox's
own kubectl against the CRDs of ``manifests/base/`` (the sandbox applies them at start).

A user's first look at a queue or a gang is that table, so the test reads it as a user
does: by column title, after batchsched has placed a gang in a queue that borrows and
holds one more unit waiting. The Queue's ``stopPolicy`` is checked here as well: the
schema takes only the policies batchsched knows.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import InvalidError
from batchsched.sandbox import build
from tests.integration.helpers import (
    QUEUES,
    XK8S,
    create_group,
    create_pods,
    get_group,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"
QUEUE_COLUMNS = ["NAME", "PARENT", "STOP", "NOMINAL GPUS", "USED GPUS", "BORROWED GPUS", "PENDING", "ADMITTED", "AGE"]
PODGROUP_COLUMNS = ["NAME", "PHASE", "MINMEMBER", "RUNNING", "SCHEDULED", "AGE"]


async def kubectl(sandbox: Any, *args: str) -> str:
    """``kubectl --kubeconfig <admin> args...``'s output (run beside the event loop, which
    keeps the in-process scheduler going)."""
    proc = await asyncio.create_subprocess_exec(
        str(build.ensure_binaries().kubectl), "--kubeconfig", sandbox.kubeconfig, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed: {err.decode()}"
    return out.decode()


def table(text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """kubectl's table as (column titles, {row name: {title: value}}). Titles may hold one
    space ("USED GPUS"); columns are at least three spaces apart and left-aligned."""
    header, *rows = [line for line in text.split("\n") if line.strip()]
    spans = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", header)]
    titles = [title for title, _ in spans]
    out: dict[str, dict[str, str]] = {}
    for row in rows:
        cells = {
            title: row[start:spans[i + 1][1] if i + 1 < len(spans) else None].strip()
            for i, (title, start) in enumerate(spans)
        }
        out[cells["NAME"]] = cells
    return titles, out


def test_table_reads_columns_by_title() -> None:
    text = ("NAME   USED GPUS   PENDING\n"
            "a      6           1\n"
            "bb                 12\n")
    titles, rows = table(text)
    assert titles == ["NAME", "USED GPUS", "PENDING"]
    assert rows["a"] == {"NAME": "a", "USED GPUS": "6", "PENDING": "1"}
    assert rows["bb"]["USED GPUS"] == "" and rows["bb"]["PENDING"] == "12"


def member(name: str, pool: str, queue: str, group: str | None, gpu: int) -> dict[str, Any]:
    labels = {"batchsched.io/queue": queue}
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    return pod_body(name, gpu=gpu, metadata={"labels": labels}, spec={"nodeSelector": {"pool": pool}})


async def test_kubectl_get_shows_a_queues_use_and_a_gangs_phase(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    org, team, other = f"org-{tag}", f"team-{tag}", f"other-{tag}"
    await make_nodes(count=2, gpus=8, labels={"pool": tag})
    await create_group(kube, XK8S, namespace, "train", {"minMember": 3})
    async with queues(kube, (org, {}),
                      (team, {"parent": org, "resources": [{"name": GPU, "nominal": 4}]}),
                      (other, {"parent": org, "resources": [{"name": GPU, "nominal": 12}]})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}):
        # a gang of 3 x 2 GPUs runs in team (2 borrowed from other); 12 more GPUs would
        # take the cohort past its 16, so that pod waits
        await create_pods(kube, namespace, [member(f"train-{i}", tag, team, "train", 2) for i in range(3)])

        async def running() -> dict[str, Any] | None:
            g = await get_group(kube, XK8S, namespace, "train")
            st = g.get("status") or {}
            return g if st.get("phase") == "Running" and st.get("running") == 3 else None

        await wait_for(running, timeout=60)
        await create_pods(kube, namespace, [member("wait", tag, team, None, 12)])

        async def written() -> dict[str, Any] | None:
            st = (await kube.get(f"{QUEUES}/{team}")).get("status") or {}
            return st if st.get("pending") == 1 and st.get("used") == {GPU: "6"} else None

        await wait_for(written, timeout=30)
        titles, rows = table(await kubectl(sandbox, "get", "queues", org, team, other))
        assert titles == QUEUE_COLUMNS
        assert rows[team] == {**rows[team], "PARENT": org, "STOP": "None", "NOMINAL GPUS": "4", "USED GPUS": "6",
                              "BORROWED GPUS": "2", "PENDING": "1", "ADMITTED": "1"}
        assert rows[other] == {**rows[other], "PARENT": org, "NOMINAL GPUS": "12", "USED GPUS": "0",
                               "BORROWED GPUS": "0", "PENDING": "0", "ADMITTED": "0"}
        assert rows[org]["PARENT"] == "" and rows[org]["USED GPUS"] == "6"
        # the weight is there for who asks for more
        wide, rows = table(await kubectl(sandbox, "get", "queues", team, "-o", "wide"))
        assert wide == [*QUEUE_COLUMNS, "WEIGHT"] and rows[team]["WEIGHT"] == "1"

        titles, rows = table(await kubectl(sandbox, "get", "podgroups.scheduling.x-k8s.io", "-n", namespace))
        assert titles == PODGROUP_COLUMNS
        assert rows["train"] == {**rows["train"], "PHASE": "Running", "MINMEMBER": "3", "RUNNING": "3",
                                 "SCHEDULED": "True"}
        wide, _ = table(await kubectl(sandbox, "get", "podgroups.scheduling.x-k8s.io", "-n", namespace, "-o", "wide"))
        assert wide == ["NAME", "PHASE", "MINMEMBER", "RUNNING", "SCHEDULED", "SUCCEEDED", "FAILED", "AGE"]


async def test_stop_policy_takes_only_known_policies(sandbox: Any, kube: KubeClient) -> None:
    tag = uuid.uuid4().hex[:6]
    with pytest.raises(InvalidError) as info:
        await kube.create(QUEUES, {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue",
                                   "metadata": {"name": f"paused-{tag}"}, "spec": {"stopPolicy": "Paused"}})
    assert "spec.stopPolicy" in str(info.value) and "Unsupported value" in str(info.value)
    held, plain = f"held-{tag}", f"plain-{tag}"
    async with queues(kube, (held, {"stopPolicy": "Hold"}), (plain, {})):
        assert (await kube.get(f"{QUEUES}/{held}"))["spec"]["stopPolicy"] == "Hold"
        assert (await kube.get(f"{QUEUES}/{plain}"))["spec"]["stopPolicy"] == "None"
        _, rows = table(await kubectl(sandbox, "get", "queues", held, plain))
        assert (rows[held]["STOP"], rows[plain]["STOP"]) == ("Hold", "None")
