"""Start estimates held to the real starts on the control plane.

Two nodes of 8 GPUs: ``a`` (8 GPUs, 30 s) and the gang ``b`` (2 x 4 GPUs, 20 s) run; then
the gang ``c`` (2 x 8 GPUs, 20 s) waits for both nodes, ``d`` (4 GPUs, 20 s) waits behind
its reservation (it would delay it) and ``e`` (4 GPUs, 5 s) fits in before it (it ends by
c's start). kwok ends each pod after its ``batchsched.io/sim-duration``, which the pods
declare with ``batchsched.io/expected-runtime``. The estimates of both models (over
classes of work, and the stepped copy of the session) are taken from the running
scheduler's session once all three wait, then held to when each was really bound.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from batchsched.insight.estimate import estimate_starts
from batchsched.insight.views import jobs
from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    bound_at,
    create_group,
    create_pods,
    pod_body,
    queues,
    running_scheduler,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"


def body(name: str, pool: str, queue: str, seconds: int, gpu: int, group: str = "") -> dict[str, Any]:
    labels = {"batchsched.io/queue": queue}
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    return pod_body(name, gpu=gpu, metadata={
        "labels": labels,
        "annotations": {"batchsched.io/sim-duration": f"{seconds}s", "batchsched.io/expected-runtime": f"{seconds}s"},
    }, spec={"nodeSelector": {"pool": pool}})


async def test_estimates_of_both_models_hold_to_the_real_starts(
    sandbox, kube: KubeClient, namespace: str, make_nodes,  # type: ignore[no-untyped-def]
) -> None:
    tag = uuid.uuid4().hex[:6]
    team, pool = f"team-{tag}", f"est-{tag}"
    await make_nodes(count=2, gpus=8, labels={"pool": pool})
    async with queues(kube, (team, {"resources": [{"name": GPU, "nominal": 64}]})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}) as sched:
        await create_group(kube, XK8S, namespace, "b", {"minMember": 2})
        await create_pods(kube, namespace, [body("a-0", pool, team, 30, 8),
                                            *(body(f"b-{i}", pool, team, 20, 4, "b") for i in range(2))])
        await bound_at(kube, namespace, "a-", 1)
        await bound_at(kube, namespace, "b-", 2)
        await create_group(kube, XK8S, namespace, "c", {"minMember": 2})
        await create_pods(kube, namespace, [body(f"c-{i}", pool, team, 20, 8, "c") for i in range(2)])
        await asyncio.sleep(1.0)
        await create_pods(kube, namespace, [body("d-0", pool, team, 20, 4)])
        await asyncio.sleep(1.0)
        await create_pods(kube, namespace, [body("e-0", pool, team, 5, 4)])
        await asyncio.sleep(2.0)  # each tried once and told why it waits

        asked = time.time()
        view = jobs(sched.session, asked)
        keys = {"c": f"x-k8s:{namespace}/c", "d": f"{namespace}/d-0", "e": f"{namespace}/e-0"}
        waiting = {j.key for j in view if j.waiting}
        assert set(keys.values()) <= waiting, waiting
        t = time.perf_counter()
        classes = estimate_starts(sched.session, view, asked)
        t_classes = time.perf_counter() - t
        t = time.perf_counter()
        exact = estimate_starts(sched.session, view, asked, exact=True)
        t_exact = time.perf_counter() - t
        est = {name: (classes[key]["start"], exact[key]["start"]) for name, key in keys.items()}
        assert all(c is not None and x is not None for c, x in est.values()), est
        # the policy's order, in both: e fits in before c's start, d waits until c is done
        for model in (0, 1):
            assert est["e"][model] < est["c"][model] < est["d"][model], est

        started = {"e": await bound_at(kube, namespace, "e-", 1), "c": await bound_at(kube, namespace, "c-", 2),
                   "d": await bound_at(kube, namespace, "d-", 1)}
        print(f"estimates in {t_classes:.3f} s (classes), {t_exact:.3f} s (exact)")
        for name, real in started.items():
            c, x = est[name]
            print(f"{name}: started {real - asked:.1f} s after asked; estimated {c - asked:.1f} s (classes), "
                  f"{x - asked:.1f} s (exact); error {c - real:+.1f} s / {x - real:+.1f} s")
            allowed = max(5.0, 0.2 * (real - asked))
            assert abs(c - real) <= allowed, (name, c - real)
            assert abs(x - real) <= allowed, (name, x - real)
