"""The queue and preemption I/O edge without a server: victims marked then evicted, a
PodDisruptionBudget refusal reported at once, Queue status coalesced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchsched.core.plan import Eviction
from batchsched.kube.errors import KubeError, NotFoundError, TemporaryError
from batchsched.kube.evictor import Evictor
from batchsched.kube.queuestatus import QueueStatusWriter

pytestmark = pytest.mark.anyio


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, str]] = []
        self.fail: dict[str, list[KubeError]] = {}

    async def _call(self, method: str, path: str, body: Any, kind: str = "") -> dict[str, Any]:
        self.calls.append((method, path, body, kind))
        errors = self.fail.get(path)
        if errors:
            raise errors.pop(0)
        return {}

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> dict[str, Any]:
        return await self._call("PATCH", path, body, kind)

    async def request(self, method: str, path: str, *, body: Any = None, timeout: float = 60) -> Any:
        return await self._call(method, path, body)


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_sleep(_: float) -> None:
        return None

    monkeypatch.setattr("batchsched.kube.evictor.asyncio.sleep", no_sleep)
    monkeypatch.setattr("batchsched.kube.retry.asyncio.sleep", no_sleep)


def victim() -> Eviction:
    return Eviction(uid="u1", namespace="ns", name="low-0", node="n1", unit="x-k8s:ns/low",
                    reason="Preempted by ns/urgent (priority 10) to make room on node(s) n1: its priority -1 is lower",
                    preemptor="ns/urgent")


async def test_a_victim_gets_its_disruption_target_condition_then_is_evicted() -> None:
    client = FakeClient()
    results: list[str] = []
    evictor = Evictor(client, on_result=lambda e, o, err: results.append(o), clock=lambda: 0.0)  # type: ignore[arg-type]
    evictor.submit(victim())
    assert await evictor.drain(5.0)
    assert results == ["evicted"]
    (m1, p1, b1, k1), (m2, p2, _, _) = client.calls
    assert (m1, p1, k1) == ("PATCH", "/api/v1/namespaces/ns/pods/low-0/status", "strategic")
    assert b1 == {"metadata": {"uid": "u1"}, "status": {"conditions": [{
        "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        "message": victim().reason, "lastTransitionTime": "1970-01-01T00:00:00Z",
    }]}}
    assert (m2, p2) == ("POST", "/api/v1/namespaces/ns/pods/low-0/eviction")


@pytest.mark.parametrize(
    ("path", "errors", "outcome", "calls"),
    [
        # a budget refuses (the apiserver names the cause): reported at once, not retried
        ("eviction", [TemporaryError(429, "TooManyRequests",
                                     "Cannot evict pod as it would violate the pod's disruption budget.",
                                     causes=["DisruptionBudget"])], "blocked", 2),
        # throttled for another reason: retried
        ("eviction", [TemporaryError(429, "TooManyRequests", "slow down")], "evicted", 3),
        # gone before it could be marked: nothing to evict
        ("status", [NotFoundError(404, "NotFound", "")], "gone", 1),
        # marking keeps failing: evicted all the same
        ("status", [TemporaryError(500, "", "")] * 3, "evicted", 4),
    ],
)
async def test_preemption_eviction_outcomes(path: str, errors: list[KubeError], outcome: str, calls: int) -> None:
    client = FakeClient()
    client.fail[f"/api/v1/namespaces/ns/pods/low-0/{path}"] = list(errors)
    results: list[str] = []
    evictor = Evictor(client, retries=2, on_result=lambda e, o, err: results.append(o))  # type: ignore[arg-type]
    evictor.submit(victim())
    assert await evictor.drain(5.0)
    assert results == [outcome]
    assert len(client.calls) == calls


async def _settle(writer: QueueStatusWriter) -> None:
    for _ in range(50):
        await asyncio.sleep(0)
    await writer.drain(1.0)


def status(used: dict[str, str], reason: str = "Ready") -> dict[str, Any]:
    return {"nominal": {"nvidia.com/gpu": "8"}, "used": used, "borrowed": {}, "lent": {},
            "pending": 0, "admitted": 1,
            "conditions": [{"type": "Active", "status": "True", "reason": reason, "message": "quota is enforced"}]}


async def test_queue_status_is_written_once_per_change_keeps_transition_times_and_removes_resources() -> None:
    client = FakeClient()
    now = [100.0]
    writer = QueueStatusWriter(client, clock=lambda: now[0])  # type: ignore[arg-type]
    task = asyncio.get_running_loop().create_task(writer.run())
    try:
        writer.update("q", status({"nvidia.com/gpu": "8", "cpu": "2"}))
        writer.update("q", status({"nvidia.com/gpu": "8", "cpu": "2"}))
        await _settle(writer)
        assert len(client.calls) == 1
        _, path, body, kind = client.calls[0]
        assert (path, kind) == ("/apis/batchsched.io/v1alpha1/queues/q/status", "merge")
        assert body["status"]["conditions"][0]["lastTransitionTime"] == "1970-01-01T00:01:40Z"
        now[0] = 200.0
        writer.update("q", status({"nvidia.com/gpu": "4"}))
        await _settle(writer)
        body = client.calls[1][2]["status"]
        assert body["used"] == {"nvidia.com/gpu": "4", "cpu": None}  # cpu is no longer listed
        assert body["conditions"][0]["lastTransitionTime"] == "1970-01-01T00:01:40Z"  # same condition
        writer.update("q", status({"nvidia.com/gpu": "4"}, reason="Other"))
        await _settle(writer)
        assert client.calls[2][2]["status"]["conditions"][0]["lastTransitionTime"] == "1970-01-01T00:03:20Z"
        # a queue that is gone drops its write
        client.fail["/apis/batchsched.io/v1alpha1/queues/gone/status"] = [NotFoundError(404, "NotFound", "")]
        writer.update("gone", status({}))
        await _settle(writer)
        assert (writer.written, writer.dropped) == (3, 1)
    finally:
        task.cancel()
