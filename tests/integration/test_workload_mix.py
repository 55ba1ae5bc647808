"""The workload mix survives a restart: the leader keeps the kinds of the pods that are gone
in its ConfigMap, and a restarted scheduler measures against them again, with the pods it
lists (of every scheduler), as its ``batchsched_workload_mix`` gauge shows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from batchsched.kube.mixstore import DATA_KEY
from tests.integration.helpers import create_pods, list_pods, pod_body, start_process, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

#: (cpu, gpus) of each kind, with CPU values no other test's pods ask for
GONE, STAYS, THEIRS = ("1.25", 1), ("2.5", 2), ("3.5", 1)


def labels(kind: tuple[str, int]) -> tuple[str, str, str]:
    """The gauge's labels (cpu, gpus, gpu_share) of a whole-card kind."""
    return kind[0], str(kind[1]), "0"


def scrape(url: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.labels["cpu"], s.labels["gpus"], s.labels["gpu_share"]): s.value
        for family in text_string_to_metric_families(text) if family.name == "batchsched_workload_mix"
        for s in family.samples
    }


async def test_the_mix_of_pods_gone_is_kept_across_a_restart(
    sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from batchsched.sandbox.cluster import free_port

    # the mix counts every pod of the cluster: pods of the tests before, still going, are let go
    async def alone() -> bool:
        return all(p["metadata"]["namespace"] == namespace for p in (await kube.list("/api/v1/pods"))[0])

    with contextlib.suppress(AssertionError):
        await wait_for(alone, timeout=30)
    pool = uuid.uuid4().hex[:6]
    nodes = await make_nodes(count=2, gpus=8, labels={"pool": pool})
    port = free_port()
    cfg = tmp_path / "batchsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "leaderElection": {"namespace": namespace, "leaseDurationSeconds": 3, "renewDeadlineSeconds": 2,
                           "retryPeriodSeconds": 0.5},
        "metricsAddress": f"127.0.0.1:{port}",
    }))
    log = tmp_path / "batchsched.log"
    metrics = f"http://127.0.0.1:{port}/metrics"
    in_pool = {"nodeSelector": {"pool": pool}}
    await create_pods(kube, namespace, [
        *(pod_body(f"gone-{i}", cpu=GONE[0], gpu=GONE[1], spec=in_pool) for i in range(8)),
        *(pod_body(f"stays-{i}", cpu=STAYS[0], gpu=STAYS[1], spec=in_pool) for i in range(2)),
        # placed by someone else before batchsched ever ran: work the cluster runs all the same
        *(pod_body(f"theirs-{i}", cpu=THEIRS[0], gpu=THEIRS[1], scheduler="someone-else",
                   spec={"nodeName": nodes[1]}) for i in range(2)),
    ])

    async def all_bound() -> bool:
        return all(p["spec"].get("nodeName") for p in await list_pods(kube, namespace))

    first = start_process(sandbox, cfg, log)
    try:
        await wait_for(all_bound, timeout=60)
        # the pods of GONE finish and are deleted: no listing will show them again
        for i in range(8):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/gone-{i}", gracePeriodSeconds=0)

        async def gone() -> bool:
            return not any(p["metadata"]["name"].startswith("gone-") for p in await list_pods(kube, namespace))

        await wait_for(gone, timeout=30)
        await asyncio.sleep(1.5)  # the scheduler's watch sees them go
    finally:
        first.send_signal(signal.SIGTERM)  # a graceful stop writes the latest mix
        first.wait(30)

    # where the mix lives: a ConfigMap next to the Lease, holding what no pod shows any more
    try:
        stored = await kube.get(f"/api/v1/namespaces/{namespace}/configmaps/batchsched-workload-mix")
    except NotFoundError:
        raise AssertionError("no ConfigMap batchsched-workload-mix:\n" + log.read_text()[-3000:]) from None
    kinds = json.loads(stored["data"][DATA_KEY])["kinds"]
    assert {"cpuMilli": 1250, "wholeCards": 1, "shareMilli": 1000, "count": 8} in kinds
    assert not [k for k in kinds if k["cpuMilli"] in (2500, 3500)]  # still listed: rebuilt from the pods

    second = start_process(sandbox, cfg, log)
    try:
        async def mix() -> dict[tuple[str, str, str], float] | None:
            try:
                got = await asyncio.to_thread(scrape, metrics)
            except OSError:
                return None
            return got if labels(GONE) in got else None

        shown = await wait_for(mix, timeout=60)
        # the gone pods' kind from the ConfigMap, the running ones from the listing, whoever placed them
        assert {labels(GONE), labels(STAYS), labels(THEIRS)} <= set(shown)
        assert shown[labels(GONE)] == pytest.approx(4 * shown[labels(STAYS)], abs=0.005)
        assert shown[labels(STAYS)] == pytest.approx(shown[labels(THEIRS)])
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
