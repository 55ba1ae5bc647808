"""Evictions through the Eviction API, under their own small budget, each pinned to a pod UID.

A gang that timed out below its quorum gives its bound members back this way, and so do
the victims of a preemption. The Eviction API, unlike a plain DELETE, honours
PodDisruptionBudgets and runs the pod's graceful termination;
``deleteOptions.preconditions.uid`` makes sure it cannot remove a pod recreated under the
same name. A preemption victim (:attr:`Eviction.preemptor` set) first gets the
``DisruptionTarget`` condition (reason ``PreemptionByScheduler``, the eviction's reason as
its message), as kube-scheduler does, so its owner can tell a preemption from a failure.
Outcomes go to ``on_result`` (called in the event loop), in the binder's style:

* ``evicted``: the apiserver accepted it (the watch will show the pod terminating, then gone);
* ``gone``: 404, or 409 because the UID no longer matches: the pod is not there to evict;
* ``blocked``: (preemption only) a PodDisruptionBudget refused it (429): the preemption did
  not happen; it is reported at once, not retried here;
* ``failed``: refused (403...), or still failing after the retries (5xx, timeouts, and 429,
  which is also how a PodDisruptionBudget says "not now" to a gang's eviction).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from batchsched.core.plan import Eviction
from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError
from batchsched.kube.status import MESSAGE_LIMIT, rfc3339
from batchsched.kube.tasks import TaskSet

__all__ = ["Evictor"]

log = logging.getLogger("batchsched.evictor")

Outcome = str


class Evictor:
    def __init__(
        self,
        client: KubeClient,
        *,
        concurrency: int = 8,
        retries: int = 5,
        on_result: Callable[[Eviction, Outcome, KubeError | None], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.retries = retries
        self.on_result = on_result
        self._clock = clock
        self._sem = asyncio.Semaphore(concurrency)
        self._tasks = TaskSet()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def submit(self, eviction: Eviction) -> None:
        self._tasks.spawn(self._evict(eviction))

    async def drain(self, timeout: float) -> bool:
        """Wait for every eviction in flight; False if some were still running at the timeout."""
        return await self._tasks.drain(timeout)

    async def _mark(self, e: Eviction) -> bool:
        """Set the victim's ``DisruptionTarget`` condition; False when the pod is gone."""
        patch = {
            "metadata": {"uid": e.uid},
            "status": {"conditions": [{
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": e.reason[:MESSAGE_LIMIT],
                "lastTransitionTime": rfc3339(self._clock()),
            }]},
        }
        path = f"/api/v1/namespaces/{e.namespace}/pods/{e.name}/status"
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                async with self._sem:
                    await self.client.patch(path, patch, kind="strategic")
                return True
            except (NotFoundError, ConflictError) as exc:
                self.on_result(e, "gone", exc)
                return False
            except TemporaryError as exc:
                if attempt == self.retries:
                    log.warning("could not mark %s/%s as a disruption target: %s", e.namespace, e.name, exc)
                    return True  # evict all the same: the preemption matters more than the note
                await asyncio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 10.0)
            except KubeError as exc:
                log.warning("could not mark %s/%s as a disruption target: %s", e.namespace, e.name, exc)
                return True
        return True

    async def _evict(self, e: Eviction) -> None:
        if e.preemptor and not await self._mark(e):
            return
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": e.name, "namespace": e.namespace},
            "deleteOptions": {"preconditions": {"uid": e.uid}},
        }
        path = f"/api/v1/namespaces/{e.namespace}/pods/{e.name}/eviction"
        delay = 0.5
        attempt = 0
        while True:
            try:
                async with self._sem:
                    await self.client.request("POST", path, body=body, timeout=30)
            except (NotFoundError, ConflictError) as exc:
                self.on_result(e, "gone", exc)
                return
            except TemporaryError as exc:
                if e.preemptor and exc.status == 429 and "disruption budget" in exc.message.lower():
                    self.on_result(e, "blocked", exc)
                    return
                attempt += 1
                if attempt > self.retries:
                    log.warning("eviction of %s/%s failed: %s", e.namespace, e.name, exc)
                    self.on_result(e, "failed", exc)
                    return
                await asyncio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 10.0)
                continue
            except KubeError as exc:
                log.warning("eviction of %s/%s refused: %s", e.namespace, e.name, exc)
                self.on_result(e, "failed", exc)
                return
            except asyncio.CancelledError:
                raise
            self.on_result(e, "evicted", None)
            return
