"""Shared fixtures: one real control plane per test session, a namespace per test.

The control plane is the project's own sandbox (etcd, kube-apiserver,
kube-controller-manager and kwok on 127.0.0.1). Where it cannot start, integration tests
are skipped on a developer's machine and fail when ``CI=true``: CI must never pass
without having run them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sandbox() -> Iterator[object]:
    from batchsched.sandbox.cluster import Sandbox

    box = Sandbox(f"pytest-{os.getpid()}")
    try:
        state = box.up([])
    except Exception as exc:  # any failure to start is reported the same way
        message = f"the local control plane could not start: {exc}"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield state
    finally:
        box.down()


@pytest.fixture
async def kube(sandbox: object) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(sandbox.kubeconfig)  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    await kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(NotFoundError):
            await kube.delete(f"/api/v1/namespaces/{name}", gracePeriodSeconds=0)


@pytest.fixture
async def make_nodes(kube: KubeClient) -> AsyncIterator[Callable[..., Awaitable[list[str]]]]:
    """``await make_nodes(count=4, gpus=8, ...)`` creates Ready nodes, deleted after the test."""
    from batchsched.sandbox.nodes import NodeShape, create_nodes, delete_nodes, wait_nodes_ready

    created: list[str] = []

    async def make(count: int, **shape: object) -> list[str]:
        prefix = str(shape.pop("prefix", f"n{uuid.uuid4().hex[:6]}"))
        names = await create_nodes(kube, [NodeShape(count=count, prefix=prefix, **shape)])  # type: ignore[arg-type]
        created.extend(names)
        await wait_nodes_ready(kube, names, timeout=60)
        return names

    try:
        yield make
    finally:
        await delete_nodes(kube, created)
