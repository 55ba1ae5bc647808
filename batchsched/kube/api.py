"""The Kubernetes API as the kube edge uses it: a ``Protocol``, so a fake can stand in.

The binder, the evictor, the status writers, the leader elector and the reflector take
their client as a :class:`KubeAPI`, not as the concrete :class:`~batchsched.kube.client.KubeClient`:
an in-memory implementation (:class:`batchsched.kube.fake.FakeKube`) type-checks against
it, so tests need no ``# type: ignore`` to pass one in. Only the methods those classes
call are listed; every failure is one of :mod:`batchsched.kube.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

__all__ = ["JSON", "KubeAPI"]

JSON = dict[str, Any]


class KubeAPI(Protocol):
    """Requests to one API server; objects travel as plain ``dict``."""

    async def request(
        self, method: str, path: str, *, body: Any = None, timeout: float = 60.0
    ) -> Any:
        """One request; the parsed JSON body of the answer."""
        ...

    async def get(self, path: str) -> JSON: ...

    async def create(self, path: str, body: JSON) -> JSON: ...

    async def replace(self, path: str, body: JSON) -> JSON: ...

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> JSON:
        """``kind``: ``merge``, ``strategic``, ``json`` or ``apply``."""
        ...

    def pages(
        self, path: str, *, page: int = 500, **params: str | int
    ) -> AsyncGenerator[tuple[list[JSON], str], None]:
        """Each page of a list, with the resourceVersion to watch from (the last page's)."""
        ...

    async def list(
        self, path: str, *, page: int = 500, **params: str | int
    ) -> tuple[list[JSON], str]:
        """Every item of a collection, and the resourceVersion to watch from."""
        ...

    def watch(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300, **params: str | int
    ) -> AsyncIterator[tuple[str, JSON]]:
        """``(type, object)`` from a watch until the server closes it."""
        ...
