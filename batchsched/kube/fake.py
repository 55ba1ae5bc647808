"""An in-memory Kubernetes API and a sleep that does not wait, for tests of the kube edge.

:class:`FakeKube` implements :class:`~batchsched.kube.api.KubeAPI`, so the binder, the
evictor, the writers, the elector and the reflector accept it as their client without a
``# type: ignore``. It records every call, keeps objects by path, raises scripted errors,
can hold every call until released (to see what is in flight), and counts the most calls
in flight per path. A merge patch of an object it keeps is applied to it (RFC 7386: null
deletes a key), and one whose ``metadata.uid`` is not the object's (when it has one) is
refused as the apiserver refuses it (422, the field is immutable). :class:`FakeSleep`
records the pauses a retry policy asks for and returns at once, so a test of back-off runs
in milliseconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from batchsched.kube.api import JSON
from batchsched.kube.errors import InvalidError, KubeError, NotFoundError

__all__ = ["Call", "FakeKube", "FakeSleep", "merge_patch"]


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str
    body: Any = None
    kind: str = ""


def merge_patch(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` as a JSON merge patch (RFC 7386); neither is changed."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeKube:
    """Requests answered from memory.

    ``fail`` maps ``"METHOD path"`` or just ``path`` to the errors its next calls raise, in
    order. While ``gate`` is an unset event, every call waits for it. ``watch_events`` are
    what a watch yields before it stays open (until cancelled).
    """

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.objects: dict[str, JSON] = {}
        self.fail: dict[str, list[KubeError]] = {}
        self.gate: asyncio.Event | None = None
        self.watch_events: list[tuple[str, JSON]] = []
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.peak_total = 0

    def paths(self, method: str | None = None) -> list[str]:
        """The paths called, in order (of one method only, when given)."""
        return [c.path for c in self.calls if method is None or c.method == method]

    async def _call(self, method: str, path: str, body: Any = None, kind: str = "") -> None:
        self.calls.append(Call(method, path, body, kind))
        self.in_flight[path] += 1
        self.peak[path] = max(self.peak[path], self.in_flight[path])
        self.peak_total = max(self.peak_total, self.in_flight.total())
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
            for key in (f"{method} {path}", path):
                errors = self.fail.get(key)
                if errors:
                    raise errors.pop(0)
        finally:
            self.in_flight[path] -= 1

    async def request(
        self, method: str, path: str, *, body: Any = None, timeout: float = 60.0
    ) -> Any:
        await self._call(method, path, body)
        return {}

    async def get(self, path: str) -> JSON:
        await self._call("GET", path)
        if path not in self.objects:
            raise NotFoundError(404, "NotFound", f"{path} not found")
        return dict(self.objects[path])

    async def create(self, path: str, body: JSON) -> JSON:
        await self._call("POST", path, body)
        meta = dict(body.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):
            # named, and given a UID and version, as the apiserver does
            made = sum(1 for c in self.calls if c.method == "POST")
            meta.update(name=f"{meta['generateName']}{made:05d}", uid=f"uid-{made}", resourceVersion=str(made))
            body = {**body, "metadata": meta}
        name = meta.get("name", "")
        self.objects[f"{path}/{name}"] = dict(body)
        return dict(body)

    async def replace(self, path: str, body: JSON) -> JSON:
        await self._call("PUT", path, body)
        self.objects[path] = dict(body)
        return dict(body)

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> JSON:
        await self._call("PATCH", path, body, kind)
        stored = self.objects.get(path)
        if stored is None or kind != "merge" or not isinstance(body, dict):
            return dict(body) if isinstance(body, dict) else {}
        uid = (body.get("metadata") or {}).get("uid")
        have = (stored.get("metadata") or {}).get("uid")
        if uid is not None and have is not None and uid != have:
            name = path.rsplit("/", 1)[-1]
            raise InvalidError(
                422, "Invalid",
                f'"{name}" is invalid: metadata.uid: Invalid value: "{uid}": field is immutable',
                causes=["FieldValueInvalid"],
            )
        merged: JSON = merge_patch(stored, body)
        self.objects[path] = merged
        return dict(merged)

    async def pages(
        self, path: str, *, page: int = 500, **params: str | int
    ) -> AsyncGenerator[tuple[list[JSON], str], None]:
        yield await self.list(path, page=page, **params)

    async def list(
        self, path: str, *, page: int = 500, **params: str | int
    ) -> tuple[list[JSON], str]:
        await self._call("LIST", path)
        prefix = path.rstrip("/") + "/"
        items = [
            dict(o) for p, o in self.objects.items()
            if p.startswith(prefix) and "/" not in p[len(prefix):]
        ]
        return items, "1"

    async def watch(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300, **params: str | int
    ) -> AsyncIterator[tuple[str, JSON]]:
        await self._call("WATCH", path)
        for event in self.watch_events:
            yield event
        await asyncio.Event().wait()  # the watch stays open


class FakeSleep:
    """Records each pause in ``delays`` and returns at once (after one turn of the loop)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)
