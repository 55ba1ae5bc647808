"""Bindings, many in flight at once under their own budget, each checked against the pod's UID.

The Binding carries the pod's UID, so it cannot land on a pod that was deleted and created
again under the same name. Outcomes go to ``on_result`` (called in the event loop):

* ``bound``: the apiserver accepted it (the watch will confirm ``spec.nodeName``);
* ``conflict``: 409, already bound, being deleted, gated or a different UID: forget and resync;
* ``gone``: 404, the pod no longer exists: forget;
* ``failed``: still failing after the retries (5xx, timeouts) or refused: forget, retry later.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from batchsched.core.plan import Binding
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError
from batchsched.kube.tasks import TaskSet

log = logging.getLogger("batchsched.binder")

Outcome = str


class Binder:
    def __init__(
        self,
        client: KubeClient,
        *,
        concurrency: int = 128,
        retries: int = 5,
        on_result: Callable[[Binding, Outcome, KubeError | None], None],
    ) -> None:
        self.client = client
        self.retries = retries
        self.on_result = on_result
        self._sem = asyncio.Semaphore(concurrency)
        self._tasks = TaskSet()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def submit(self, binding: Binding) -> None:
        self._tasks.spawn(self._bind(binding))

    async def drain(self, timeout: float) -> bool:
        """Wait for every binding in flight; False if some were still running at the timeout."""
        return await self._tasks.drain(timeout)

    async def _bind(self, b: Binding) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": b.name, "namespace": b.namespace, "uid": b.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": b.node},
        }
        path = f"/api/v1/namespaces/{b.namespace}/pods/{b.name}/binding"
        delay = 0.2
        attempt = 0
        while True:
            try:
                async with self._sem:
                    await self.client.request("POST", path, body=body, timeout=30)
            except ConflictError as exc:
                self.on_result(b, "conflict", exc)
                return
            except NotFoundError as exc:
                self.on_result(b, "gone", exc)
                return
            except TemporaryError as exc:
                attempt += 1
                if attempt > self.retries:
                    log.warning("binding %s/%s to %s failed: %s", b.namespace, b.name, b.node, exc)
                    self.on_result(b, "failed", exc)
                    return
                await asyncio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 5.0)
                continue
            except KubeError as exc:
                log.warning("binding %s/%s to %s refused: %s", b.namespace, b.name, b.node, exc)
                self.on_result(b, "failed", exc)
                return
            except asyncio.CancelledError:
                raise
            self.on_result(b, "bound", None)
            return
