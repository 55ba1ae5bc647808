"""The dashboard and alert rules of ``manifests/overlays/with-monitoring/`` against a running scheduler's
``/metrics``: every metric they read is exported, and the per-queue series carry the
queue's values once work has run in it.

The unit test holds the expressions to the metric definitions; this one holds the
definitions to what the scheduler fills in, on the sandbox, after it bound a pod of a
queue, kept another waiting over its quota, and saw a second queue stopped (then deleted).
"""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    QUEUES,
    create_pods,
    list_pods,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)
from tests.unit.test_monitoring_manifests import ALERTS, dashboard_expressions, metric_names

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"
#: read by the dashboard but only written when something happens that this test does not do
ONLY_ONCE_IT_HAPPENS = {"batchsched_evictions_total"}  # nothing is evicted here


def read_by_the_manifests() -> set[str]:
    rules = [r["expr"] for g in yaml.safe_load(ALERTS.read_text())["spec"]["groups"] for r in g["rules"]]
    return set().union(*(metric_names(e) for e in [*dashboard_expressions(), *rules]))


async def scrape(port: int) -> tuple[str, list[Any]]:
    """``/metrics`` as text and as its samples."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return text, [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: list[Any], name: str, **labels: str) -> float | None:
    """The sample of ``name`` with exactly these labels (None when there is none)."""
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    return found[0] if found else None


async def test_the_scheduler_exports_every_metric_the_dashboard_and_alerts_read(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    team, held = f"team-{tag}", f"held-{tag}"
    await make_nodes(count=1, gpus=8, labels={"pool": tag})

    def job(name: str, gpu: int, **spec: Any) -> dict[str, Any]:
        return pod_body(name, gpu=gpu, metadata={"labels": {"batchsched.io/queue": team}},
                        spec={"nodeSelector": {"pool": tag}, **spec})

    quota = {"resources": [{"name": GPU, "nominal": 4}]}
    async with queues(kube, (team, quota), (held, {**quota, "stopPolicy": "Hold"})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}) as app:
        assert app.http_port
        # 2 GPUs run at priority 10; 4 more would take the queue past its nominal 4: that pod waits
        await create_pods(kube, namespace, [job("run", 2, priorityClassName="high-priority")])

        async def bound() -> bool:
            return any(p["spec"].get("nodeName") for p in await list_pods(kube, namespace))

        await wait_for(bound, timeout=60)
        await create_pods(kube, namespace, [job("wait", 4)])

        want = {"batchsched_queue_pending_units": 1, "batchsched_queue_admitted_units": 1}
        last: list[tuple[str, list[Any]]] = []

        async def counted() -> bool:
            last[:] = [await scrape(app.http_port)]
            return all(value(last[0][1], n, queue=team) == v for n, v in want.items())

        try:
            await wait_for(counted, timeout=60)
        except AssertionError:
            seen = {n: value(last[0][1], n, queue=team) for n in want}
            raise AssertionError(f"queue {team}: wanted {want} in /metrics, read {seen}") from None
        [(text, samples)] = last

        # a deleted queue leaves the dashboard: its series go with it
        await kube.delete(f"{QUEUES}/{held}")

        async def forgotten() -> bool:
            _, now = await scrape(app.http_port)
            return not any(s.labels.get("queue") == held for s in now)

        await wait_for(forgotten, timeout=30)

    names = read_by_the_manifests()
    assert len(names) >= 20
    missing = sorted(n for n in names if f"# TYPE {n} " not in text)
    assert missing == [], f"read by the dashboard or alerts, not exported: {missing}"
    exported = {s.name for s in samples}
    silent = sorted(n for n in names - ONLY_ONCE_IT_HAPPENS
                    if not exported & {n, f"{n}_bucket", f"{n}_count"})
    assert silent == [], f"exported without a sample: {silent}"

    # what the Queues and Waits rows show for this queue
    assert value(samples, "batchsched_queue_nominal", queue=team, resource=GPU) == 4
    assert value(samples, "batchsched_queue_used", queue=team, resource=GPU) == 2
    assert value(samples, "batchsched_queue_borrowed", queue=team, resource=GPU) == 0
    assert value(samples, "batchsched_queue_stopped", queue=team) == 0
    assert value(samples, "batchsched_queue_stopped", queue=held) == 1
    for name in sorted(n for n in names if n.startswith("batchsched_queue_")):
        assert any(s.name == name and s.labels.get("queue") == team for s in samples), name
    assert value(samples, "batchsched_pod_wait_seconds_count", queue=team, priority="10") == 1
    # the Cluster and Scheduler rows
    assert value(samples, "batchsched_leader") == 1
    assert (value(samples, "batchsched_binds_total", result="bound") or 0) >= 1
    assert (value(samples, "batchsched_gpu_allocation_ratio", kind="whole") or 0) > 0
    assert (value(samples, "batchsched_pending_pods") or 0) >= 1
