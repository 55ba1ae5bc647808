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


async def test_a_list_in_pages_reads_each_page_while_the_next_is_fetched(kube: KubeClient, namespace: str) -> None:
    """Every object is read once and handed over whole with the list's resourceVersion, and
    the server is asked for each next page before the objects of the one in hand are read
    (their reading overlaps its preparation: a list of every pod at scale)."""
    await create_pods(kube, namespace, [pod_body(f"p{i:02d}") for i in range(23)])
    steps: list[tuple[str, str]] = []
    listed: list[list[str]] = []
    seen: list[str] = []
    request = kube.request

    async def logged(method: str, path: str, **kwargs: Any) -> Any:
        if method == "GET" and "limit" in (kwargs.get("params") or {}):
            steps.append(("ask", str(kwargs["params"].get("continue", ""))))
        return await request(method, path, **kwargs)

    def read(obj: dict[str, Any]) -> str:
        steps.append(("read", obj["metadata"]["name"]))
        return str(obj["metadata"]["name"])

    kube.request = logged  # type: ignore[method-assign]
    reflector = Reflector(kube, f"/api/v1/namespaces/{namespace}/pods", page=7, read=read,
                          on_list=lambda names: listed.append(list(names)),
                          on_event=lambda kind, obj: seen.append(obj["metadata"]["name"]))
    task = asyncio.get_running_loop().create_task(reflector.run())
    try:
        await wait_for(lambda: _is(bool(listed)), timeout=20)
        assert sorted(listed[0]) == [f"p{i:02d}" for i in range(23)]
        asks = [i for i, (what, _) in enumerate(steps) if what == "ask"]
        reads = [i for i, (what, _) in enumerate(steps) if what == "read"]
        assert len(asks) == 4  # pages of 7, 7, 7 and 2
        for page in range(3):  # page k+1 asked for before the first object of page k is read
            assert asks[page + 1] < reads[7 * page]
        # the watch goes on from the list's resourceVersion: a pod made after it is an event
        await create_pods(kube, namespace, [pod_body("later")])
        await wait_for(lambda: _is("later" in seen), timeout=20)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
