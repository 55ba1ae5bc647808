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
from collections.abc import Callable

from batchsched.core.plan import Binding
from batchsched.kube.api import KubeAPI
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError
from batchsched.kube.retry import bindings
from batchsched.kube.tasks import TaskSet

log = logging.getLogger("batchsched.binder")

Outcome = str


class Binder:
    """Bind pods under ``concurrency`` requests at a time; ``retry`` is the policy each
    Binding is retried under (:func:`~batchsched.kube.retry.bindings`)."""

    def __init__(
        self,
        client: KubeAPI,
        *,
        concurrency: int = 128,
        retries: int = 5,
        on_result: Callable[[Binding, Outcome, KubeError | None], None],
    ) -> None:
        self.client = client
        self.retry = bindings(retries)
        self.on_result = on_result
        self._sem = asyncio.Semaphore(concurrency)
        self._tasks = TaskSet()

    @property
    def retries(self) -> int:
        return self.retry.retries

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

        async def send() -> None:
            async with self._sem:
                await self.client.request("POST", path, body=body, timeout=30)

        what = f"binding {b.namespace}/{b.name} to {b.node}"
        try:
            await self.retry.call(send, what=what)
        except ConflictError as exc:
            self.on_result(b, "conflict", exc)
        except NotFoundError as exc:
            self.on_result(b, "gone", exc)
        except TemporaryError as exc:
            log.warning("%s failed: %s", what, exc)
            self.on_result(b, "failed", exc)
        except KubeError as exc:
            log.warning("%s refused: %s", what, exc)
            self.on_result(b, "failed", exc)
        else:
            self.on_result(b, "bound", None)
