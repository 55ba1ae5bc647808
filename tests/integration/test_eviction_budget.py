"""The Eviction API's refusal by a PodDisruptionBudget, as the real apiserver words it.

The scheduler keeps protected pods out of its victim search, but a budget can be created
(or its status change) after a victim was chosen: then the Eviction API answers 429 with
the cause ``DisruptionBudget``, and a preemption must be reported blocked at once, not
retried as if the apiserver were only busy.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from batchsched.core.plan import Eviction
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import KubeError
from batchsched.kube.evictor import Evictor
from tests.integration.helpers import pod_body, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_an_eviction_a_budget_refuses_is_reported_blocked_at_once(
    sandbox, kube: KubeClient, scheduler_kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    [node] = await make_nodes(count=1, gpus=8)
    await kube.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "keep"}}},
    })
    body = pod_body("kept", metadata={"labels": {"app": "keep"}}, spec={"nodeName": node})
    pod = await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)

    async def budget_observed() -> bool:
        pdb = await kube.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/keep")
        status = pdb.get("status") or {}
        return status.get("observedGeneration", 0) >= 1 and status.get("currentHealthy", 0) >= 1

    await wait_for(budget_observed, timeout=60)
    results: list[tuple[str, KubeError | None]] = []
    evictor = Evictor(scheduler_kube, retries=5, on_result=lambda e, outcome, exc: results.append((outcome, exc)))
    started = time.monotonic()
    evictor.submit(Eviction(pod["metadata"]["uid"], namespace, "kept", node, f"{namespace}/kept",
                            "Preempted by urgent", preemptor=f"{namespace}/urgent"))
    await wait_for(lambda: asyncio.sleep(0, result=results or None), timeout=60)
    [(outcome, exc)] = results
    assert outcome == "blocked", exc
    assert time.monotonic() - started < 5  # not retried as a busy apiserver would be
    kept = await kube.get(f"/api/v1/namespaces/{namespace}/pods/kept")
    assert not kept["metadata"].get("deletionTimestamp")
