"""The gang I/O edge without a server: PodGroup status coalescing and the evictor."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchsched.core.gangs import GroupStatus
from batchsched.core.plan import Eviction
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError
from batchsched.kube.evictor import Evictor
from batchsched.kube.groupstatus import GroupStatusWriter
from tests.builders import make_group

pytestmark = pytest.mark.anyio


class FakeClient:
    """Records requests; ``fail`` maps a path to the errors its next calls raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail: dict[str, list[KubeError]] = {}
        self.gate: asyncio.Event | None = None

    async def _call(self, method: str, path: str, body: Any) -> dict[str, Any]:
        self.calls.append((method, path, body))
        if self.gate is not None:
            await self.gate.wait()
        errors = self.fail.get(path)
        if errors:
            raise errors.pop(0)
        return {}

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> dict[str, Any]:
        assert kind == "merge"
        return await self._call("PATCH", path, body)

    async def request(self, method: str, path: str, *, body: Any = None, timeout: float = 60) -> Any:
        return await self._call(method, path, body)


async def _settle(writer: GroupStatusWriter) -> None:
    for _ in range(50):
        await asyncio.sleep(0)
    await writer.drain(1.0)


def _status(**kw: Any) -> GroupStatus:
    base: dict[str, Any] = {"phase": "Pending", "reason": "Unschedulable", "message": "m"}
    base.update(kw)
    return GroupStatus(**base)


async def test_status_is_written_once_per_change_and_not_when_already_there() -> None:
    client = FakeClient()
    writer = GroupStatusWriter(client, clock=lambda: 0.0)  # type: ignore[arg-type]
    task = asyncio.get_running_loop().create_task(writer.run())
    try:
        group = make_group("g", "ns").min_member(2).build()
        writer.update(group, _status())
        writer.update(group, _status())
        await _settle(writer)
        assert [c[1] for c in client.calls] == [
            "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/g/status"
        ]
        body = client.calls[0][2]
        assert body["metadata"] == {"uid": "uid-pg-ns-g"}
        assert body["status"] == {
            "phase": "Pending", "running": 0, "succeeded": 0, "failed": 0,
            "conditions": [{"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "m", "lastTransitionTime": "1970-01-01T00:00:00Z"}],
        }
        # a group that already shows the status is not written at all (after a restart)
        shown = make_group("h", "ns").min_member(2).status(
            phase="Running", running=2,
            conditions=[{"type": "PodGroupScheduled", "status": "True", "reason": "Scheduled", "message": "ok"}],
        ).build()
        writer.update(shown, GroupStatus(phase="Running", running=2, scheduled=True, reason="Scheduled", message="ok"))
        await _settle(writer)
        assert len(client.calls) == 1
    finally:
        task.cancel()


async def test_one_write_in_flight_per_group_and_the_latest_wins() -> None:
    client = FakeClient()
    client.gate = asyncio.Event()
    writer = GroupStatusWriter(client, concurrency=4)  # type: ignore[arg-type]
    task = asyncio.get_running_loop().create_task(writer.run())
    try:
        group = make_group("g").min_member(2).build()
        writer.update(group, _status(message="first"))
        for _ in range(20):
            await asyncio.sleep(0)
        for i in range(10):
            writer.update(group, _status(message=f"burst {i}"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(client.calls) == 1  # the second waits for the first
        client.gate.set()
        await _settle(writer)
        messages = [c[2]["status"]["conditions"][0]["message"] for c in client.calls]
        assert messages == ["first", "burst 9"]
    finally:
        task.cancel()


async def test_volcano_status_goes_on_the_object_when_there_is_no_status_subresource() -> None:
    client = FakeClient()
    base = "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups"
    client.fail[f"{base}/a/status"] = [NotFoundError(404, "NotFound", "page not found")]
    writer = GroupStatusWriter(client)  # type: ignore[arg-type]
    task = asyncio.get_running_loop().create_task(writer.run())
    try:
        writer.update(make_group("a").volcano().min_member(1).build(), _status(phase="Inqueue", scheduled=False))
        await _settle(writer)
        writer.update(make_group("b").volcano().min_member(1).build(), _status(phase="Inqueue"))
        await _settle(writer)
        assert [c[1] for c in client.calls] == [f"{base}/a/status", f"{base}/a", f"{base}/b"]
        cond = client.calls[1][2]["status"]["conditions"][0]
        assert (cond["type"], cond["status"]) == ("Unschedulable", "True")
    finally:
        task.cancel()


async def test_a_condition_keeps_its_transition_time_while_it_holds() -> None:
    now = [100.0]
    writer = GroupStatusWriter(FakeClient(), clock=lambda: now[0])  # type: ignore[arg-type]
    group = make_group("g").min_member(2).build()
    first = writer.body(group, _status(message="only 1 fit"))
    now[0] = 200.0
    same = writer.body(group, _status(message="only 0 fit"))
    other = writer.body(group, _status(reason="WaitingForMembers"))
    t = [b["status"]["conditions"][0]["lastTransitionTime"] for b in (first, same, other)]
    assert t == ["1970-01-01T00:01:40Z", "1970-01-01T00:01:40Z", "1970-01-01T00:03:20Z"]


async def test_a_group_that_is_gone_drops_its_write() -> None:
    client = FakeClient()
    path = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups/g"
    client.fail[f"{path}/status"] = [ConflictError(409, "Conflict", "uid")]
    writer = GroupStatusWriter(client)  # type: ignore[arg-type]
    task = asyncio.get_running_loop().create_task(writer.run())
    try:
        writer.update(make_group("g").build(), _status())
        await _settle(writer)
        assert (writer.written, writer.dropped) == (0, 1)
    finally:
        task.cancel()


def _eviction() -> Eviction:
    return Eviction(uid="u1", namespace="ns", name="w-0", node="n1", unit="x-k8s:ns/g", reason="timed out")


@pytest.mark.parametrize(
    ("errors", "outcome"),
    [
        ([], "evicted"),
        ([NotFoundError(404, "NotFound", "")], "gone"),
        ([ConflictError(409, "Conflict", "uid mismatch")], "gone"),
        ([TemporaryError(429, "TooManyRequests", "pdb")], "evicted"),
        ([TemporaryError(500, "", "")] * 3, "failed"),
        ([KubeError(403, "Forbidden", "")], "failed"),
    ],
)
async def test_evictor_outcomes(errors: list[KubeError], outcome: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_sleep(_: float) -> None:
        return None

    monkeypatch.setattr("batchsched.kube.evictor.asyncio.sleep", no_sleep)
    client = FakeClient()
    path = "/api/v1/namespaces/ns/pods/w-0/eviction"
    client.fail[path] = list(errors)
    results: list[tuple[str, str]] = []
    evictor = Evictor(client, retries=2, on_result=lambda e, o, err: results.append((e.name, o)))  # type: ignore[arg-type]
    evictor.submit(_eviction())
    assert await evictor.drain(5.0)
    assert results == [("w-0", outcome)]
    method, called, body = client.calls[0]
    assert (method, called) == ("POST", path)
    assert body == {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "w-0", "namespace": "ns"},
        "deleteOptions": {"preconditions": {"uid": "u1"}},
    }
