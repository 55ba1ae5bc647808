"""The watch loop on the real apiserver: 410 Gone leads to a relist, and nothing is lost.

The apiserver here answers a stale resourceVersion from its watch cache instead of with
410 (the cache window is young), so the first watch's 410 is injected at the client and
everything else is the real server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ExpiredError
from batchsched.kube.watch import Reflector
from tests.integration.helpers import create_pods, pod_body, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_expired_resource_version_relists_without_losing_or_duplicating(kube: KubeClient, namespace: str) -> None:
    await create_pods(kube, namespace, [pod_body(f"before{i}") for i in range(5)])
    mirror: dict[str, dict[str, Any]] = {}
    events: list[tuple[str, str]] = []
    lists = 0

    def on_list(items: list[dict[str, Any]]) -> None:
        nonlocal lists
        lists += 1
        mirror.clear()
        mirror.update({o["metadata"]["name"]: o for o in items})

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        events.append((kind, obj["metadata"]["name"]))
        if kind == "DELETED":
            mirror.pop(obj["metadata"]["name"], None)
        else:
            mirror[obj["metadata"]["name"]] = obj

    class FirstWatchExpires:
        """The real client, except that its first watch fails with 410 Gone."""

        def __init__(self) -> None:
            self.expired = False

        def __getattr__(self, name: str) -> Any:
            return getattr(kube, name)

        def watch(self, *args: Any, **kwargs: Any) -> Any:
            if not self.expired:
                self.expired = True
                raise ExpiredError(410, "Expired", "too old resource version")
            return kube.watch(*args, **kwargs)

    reflector = Reflector(FirstWatchExpires(), f"/api/v1/namespaces/{namespace}/pods",  # type: ignore[arg-type]
                          on_list=on_list, on_event=on_event)
    task = asyncio.get_running_loop().create_task(reflector.run())
    try:
        await wait_for(lambda: _is(lists >= 2), timeout=20)
        await create_pods(kube, namespace, [pod_body(f"after{i}") for i in range(3)])
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/before0", gracePeriodSeconds=0)
        await wait_for(lambda: _is("after2" in mirror and "before0" not in mirror), timeout=20)
        assert sorted(mirror) == sorted([f"before{i}" for i in range(1, 5)] + [f"after{i}" for i in range(3)])
        added = [name for kind, name in events if kind == "ADDED"]
        assert sorted(added) == ["after0", "after1", "after2"]  # the relist did not replay old pods as events
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _is(value: bool) -> bool:
    return value
