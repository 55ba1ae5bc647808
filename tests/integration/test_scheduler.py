"""batchsched placing single pods on the real control plane."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
import yaml

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    assert_no_overcommit,
    config,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    running_scheduler,
    scheduler_kubeconfig,
    served,
    start_process,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_500_pods_on_50_nodes_all_bound_without_overcommit(sandbox, kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    names = await make_nodes(count=50, gpus=8, cpu="32", memory="256Gi")
    bodies = []
    for i in range(500):
        gpu = (0, 1, 1, 1)[i % 4]
        bodies.append(pod_body(f"p{i}", gpu=gpu, cpu="500m"))
    await create_pods(kube, namespace, bodies)
    # pods for another scheduler stay where they are
    await create_pods(kube, namespace, [pod_body(f"other{i}", gpu=1, scheduler="default-scheduler") for i in range(3)])
    async with running_scheduler(sandbox, namespace) as sched:
        async def all_bound() -> bool:
            pods = await list_pods(kube, namespace)
            return all(p["spec"].get("nodeName") for p in pods if p["metadata"]["name"].startswith("p"))

        await wait_for(all_bound, timeout=120, interval=0.5)
        pods = await list_pods(kube, namespace)
        ours = [p for p in pods if p["metadata"]["name"].startswith("p")]
        assert len(ours) == 500
        assert all(p["spec"]["nodeName"] in names for p in ours)
        others = [p for p in pods if p["metadata"]["name"].startswith("other")]
        assert len(others) == 3 and not any(p["spec"].get("nodeName") for p in others)
        usage = await assert_no_overcommit(kube)
        gpus = sorted((u.get("nvidia.com/gpu", 0) for n, u in usage.items() if n in names), reverse=True)
        # 375 single-GPU pods packed: 46 full nodes and one with 7, the rest empty
        assert gpus[:46] == [8] * 46 and sum(gpus) == 375
        # what a user reads: each pod's one Scheduled Event names the node it went to, and a
        # pod that fits was never reported as failing; the other scheduler's pods get nothing
        where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in ours}
        for name in ("p0", "p1", "p499"):
            [ev] = await wait_for(lambda name=name: events_for(kube, namespace, name, "Scheduled"), timeout=20)
            assert (ev["type"], ev["reason"]) == ("Normal", "Scheduled")
            assert (ev["involvedObject"]["kind"], ev["involvedObject"]["name"]) == ("Pod", name)
            assert ev["message"] == f"Successfully assigned {namespace}/{name} to {where[name]}"
            assert ev["reportingComponent"] == "batchsched"
            assert await events_for(kube, namespace, name, "FailedScheduling") == []
        for i in range(3):
            assert await events_for(kube, namespace, f"other{i}") == []
        assert sched.metrics.binds.labels("bound")._value.get() >= 500
        assert sched.metrics.binds.labels("conflict")._value.get() == 0


async def test_bindings_waiting_in_the_binders_queue_are_not_read_again(sandbox, kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    # at 5,000 nodes x 40,000 pods every Binding still queued when the assumed timeout ran out
    # (timed from the step that placed it) was read again: 14,119 GETs of pods over the bind
    # window, loading the apiserver the Bindings waited for. Here one Binding at a time keeps
    # 300 of them queued for seconds, past a 1 s timeout
    await make_nodes(count=40, gpus=8)
    await create_pods(kube, namespace, [pod_body(f"p{i}", gpu=1) for i in range(300)])
    gets_before = await served(kube, "GET", "pods")
    async with running_scheduler(sandbox, namespace, binder={"concurrency": 1, "assumedTimeoutSeconds": 1}) as sched:
        async def all_bound() -> bool:
            return all(p["spec"].get("nodeName") for p in await list_pods(kube, namespace))

        await wait_for(all_bound, timeout=120, interval=0.5)
        assert sched.metrics.binds.labels("bound")._value.get() == 300
        await asyncio.sleep(2.0)  # past the timeout once more: nothing left unconfirmed
        gets = await served(kube, "GET", "pods") - gets_before
    await assert_no_overcommit(kube)
    # a watch lagging more than a second behind an accepted Binding may still have one read
    assert gets <= 5, f"{gets} pods read again"


async def test_pod_that_never_fits_gets_one_event_then_binds_when_a_node_arrives(sandbox, kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    await make_nodes(count=3, gpus=8)
    await make_nodes(count=1, gpus=8, taints=({"key": "gpu", "value": "broken", "effect": "NoSchedule"},))
    await create_pods(kube, namespace, [pod_body("big", gpu=16)])
    async with running_scheduler(sandbox, namespace) as sched:
        [failed] = await wait_for(lambda: events_for(kube, namespace, "big", "FailedScheduling"), timeout=30)
        assert (failed["type"], failed["reason"]) == ("Warning", "FailedScheduling")
        assert (failed["involvedObject"]["kind"], failed["involvedObject"]["name"]) == ("Pod", "big")
        assert failed["reportingComponent"] == "batchsched"
        # the message names both causes, counted over the nodes
        message = failed["message"]
        assert message.startswith("0/"), message
        assert "insufficient nvidia.com/gpu" in message and "1 untolerated taint gpu=broken" in message
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/big")
        cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert cond["status"] == "False" and cond["reason"] == "Unschedulable" and cond["message"] == message
        # more cycles, more unrelated events: still one event, one condition write
        await create_pods(kube, namespace, [pod_body(f"small{i}", gpu=1) for i in range(4)])
        await wait_for(lambda: _bound(kube, namespace, [f"small{i}" for i in range(4)]), timeout=30)
        await asyncio.sleep(2)
        # the reason was written once; the new node's not-ready moment may have added one
        # more, with its own message, never a repeat
        messages = [e["message"] for e in await events_for(kube, namespace, "big", "FailedScheduling")]
        assert messages.count(message) == 1, messages
        assert len(set(messages)) == len(messages), messages
        cycles_before = sched.cycles
        [big_node] = await make_nodes(count=1, gpus=16)
        bound = await wait_for(lambda: _bound(kube, namespace, ["big"]), timeout=15)
        assert bound["big"] == big_node
        assert sched.cycles > cycles_before
        [scheduled] = await wait_for(lambda: events_for(kube, namespace, "big", "Scheduled"), timeout=10)
        assert scheduled["message"] == f"Successfully assigned {namespace}/big to {big_node}"
        # the reason was written once; the new node's not-ready moment may have added one
        # more, with its own message, never a repeat
        messages = [e["message"] for e in await events_for(kube, namespace, "big", "FailedScheduling")]
        assert messages.count(message) == 1, messages
        assert len(set(messages)) == len(messages), messages


async def _bound(kube: KubeClient, namespace: str, names: list[str]) -> dict[str, str] | None:
    out = {}
    for name in names:
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        node = pod["spec"].get("nodeName")
        if not node:
            return None
        out[name] = node
    return out


async def test_constraints_a_user_pod_carries_are_honoured(sandbox, kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    a100 = await make_nodes(count=2, gpus=8, gpu_model="A100", labels={"pool": "a100"})
    h100 = await make_nodes(count=2, gpus=8, gpu_model="H100", labels={"pool": "h100"})
    tainted = await make_nodes(count=1, gpus=8, labels={"pool": "h100"},
                               taints=({"key": "dedicated", "value": "infer", "effect": "NoSchedule"},))
    await kube.patch(f"/api/v1/nodes/{h100[1]}", {"spec": {"unschedulable": True}})
    bodies = [
        pod_body("sel", gpu=1, spec={"nodeSelector": {"pool": "h100"}}),
        pod_body("aff", gpu=1, spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}]}]}}}}),
        pod_body("tol", gpu=1, spec={"nodeSelector": {"pool": "h100"}, "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [tainted[0]]}]}]}}}}),
        pod_body("gated", gpu=1, spec={"schedulingGates": [{"name": "example.com/wait"}]}),
    ]
    await create_pods(kube, namespace, bodies)
    async with running_scheduler(sandbox, namespace):
        bound = await wait_for(lambda: _bound(kube, namespace, ["sel", "aff", "tol"]), timeout=30)
        assert bound["sel"] == h100[0]  # the other h100 node is cordoned
        assert bound["aff"] in a100
        assert bound["tol"] == tainted[0]
        await asyncio.sleep(1)
        gated = await kube.get(f"/api/v1/namespaces/{namespace}/pods/gated")
        assert not gated["spec"].get("nodeName")
        # lifting the gate makes it schedulable
        await kube.patch(f"/api/v1/namespaces/{namespace}/pods/gated", {"spec": {"schedulingGates": None}})
        lifted = await wait_for(lambda: _bound(kube, namespace, ["gated"]), timeout=30)
        # any node it may use: neither the cordoned nor the tainted one
        assert lifted["gated"] in [*a100, h100[0]]


async def test_metrics_and_health_endpoints(sandbox, kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    await make_nodes(count=1, gpus=8)
    await create_pods(kube, namespace, [pod_body("m", gpu=1)])
    async with running_scheduler(sandbox, namespace) as sched:
        await wait_for(lambda: _bound(kube, namespace, ["m"]), timeout=30)
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{sched.http_port}"
            async with http.get(base + "/healthz") as r:
                assert r.status == 200
            async with http.get(base + "/readyz") as r:
                assert r.status == 200
            async with http.get(base + "/metrics") as r:
                text = await r.text()
        for name in ("batchsched_pending_pods", "batchsched_cycle_duration_seconds_bucket",
                     'batchsched_binds_total{result="bound"}', "batchsched_schedule_attempts_total",
                     "batchsched_leader 1.0"):
            assert name in text, name


# -- restarts and replicas -----------------------------------------------------------------


async def _metric(port: int, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_killed_mid_run_and_restarted_binds_nothing_twice(sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from batchsched.sandbox.cluster import free_port

    await make_nodes(count=40, gpus=8)
    await create_pods(kube, namespace, [pod_body(f"p{i}", gpu=1) for i in range(300)])
    port = free_port()
    cfg = tmp_path / "batchsched.yaml"
    cfg.write_text(yaml.safe_dump({
        "leaderElection": {"namespace": namespace, "leaseDurationSeconds": 3, "renewDeadlineSeconds": 2, "retryPeriodSeconds": 0.5},
        "metricsAddress": f"127.0.0.1:{port}",
        "binder": {"concurrency": 4},
    }))
    log = tmp_path / "batchsched.log"
    first = start_process(sandbox, cfg, log)
    try:
        async def some_bound() -> bool:
            pods = await list_pods(kube, namespace)
            return sum(1 for p in pods if p["spec"].get("nodeName")) >= 20

        await wait_for(some_bound, timeout=60, interval=0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    pods = await list_pods(kube, namespace)
    bound_at_kill = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
    assert 0 < len(bound_at_kill) < 300, "the kill should land mid-run"
    second = start_process(sandbox, cfg, log)
    try:
        async def all_bound() -> bool:
            pods = await list_pods(kube, namespace)
            return all(p["spec"].get("nodeName") for p in pods)

        await wait_for(all_bound, timeout=120, interval=0.5)
        pods = await list_pods(kube, namespace)
        for p in pods:
            name = p["metadata"]["name"]
            if name in bound_at_kill:
                assert p["spec"]["nodeName"] == bound_at_kill[name]
        await assert_no_overcommit(kube)
        # the second process never tried to bind a pod that was already bound
        assert await _metric(port, 'batchsched_binds_total{result="conflict"}') == 0
        assert await _metric(port, 'batchsched_binds_total{result="bound"}') == 300 - len(bound_at_kill)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, log.read_text()[-2000:]


async def test_second_replica_waits_for_the_lease_and_takes_over(sandbox, kube: KubeClient, namespace: str, make_nodes) -> None:  # type: ignore[no-untyped-def]
    await make_nodes(count=2, gpus=8)
    async with running_scheduler(sandbox, namespace) as first:
        from batchsched.app import Scheduler

        client = await KubeClient.connect(scheduler_kubeconfig(sandbox))
        second = Scheduler(client, config(namespace))
        task = asyncio.get_running_loop().create_task(second.run())
        try:
            await wait_for(lambda: _is(second.ready), timeout=30)
            await asyncio.sleep(2)
            assert first.leading.is_set() and not second.leading.is_set()
            await create_pods(kube, namespace, [pod_body("a", gpu=1)])
            await wait_for(lambda: _bound(kube, namespace, ["a"]), timeout=30)
            assert second.cycles == 0
            first.stop()
            await wait_for(lambda: _is(second.leading.is_set()), timeout=20)
            await create_pods(kube, namespace, [pod_body("b", gpu=1)])
            await wait_for(lambda: _bound(kube, namespace, ["b"]), timeout=30)
            assert second.cycles >= 1
            lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
            assert lease["spec"]["holderIdentity"] == second.identity
        finally:
            second.stop()
            await asyncio.wait_for(task, 30)
            await client.close()
    counts = Counter(e["reason"] for e in await events_for(kube, namespace, "a"))
    assert counts["Scheduled"] == 1


async def _is(value: bool) -> bool:
    return value
