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
* ``blocked``: (preemption only) a PodDisruptionBudget refused it
  (:class:`~batchsched.kube.errors.DisruptionBudgetError`): the preemption did not happen;
  it is reported at once, not retried here;
* ``failed``: refused (403...), or still failing after the retries (5xx, timeouts, and 429,
  which is also how a PodDisruptionBudget says "not now" to a gang's eviction);
* ``fenced``: not sent, because this replica's lease deadline had passed before an attempt
  (:class:`~batchsched.kube.leader.Fence`, checked before the condition, the eviction and
  each retry of either).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from batchsched.core.plan import Eviction
from batchsched.kube.api import KubeAPI
from batchsched.kube.errors import (
    ConflictError,
    DisruptionBudgetError,
    KubeError,
    NotFoundError,
    TemporaryError,
)
from batchsched.kube.leader import Fence, Fenced
from batchsched.kube.retry import evictions
from batchsched.kube.status import MESSAGE_LIMIT, rfc3339
from batchsched.kube.tasks import TaskSet

__all__ = ["Evictor"]

log = logging.getLogger("batchsched.evictor")

Outcome = str


def _budget_refusal(exc: KubeError) -> bool:
    return isinstance(exc, DisruptionBudgetError)


class Evictor:
    """Evict pods under ``concurrency`` requests at a time; ``retry`` is the policy each
    request is retried under (:func:`~batchsched.kube.retry.evictions`); ``fence`` is
    checked before every attempt (always open when not given)."""

    def __init__(
        self,
        client: KubeAPI,
        *,
        concurrency: int = 8,
        retries: int = 5,
        on_result: Callable[[Eviction, Outcome, KubeError | None], None],
        clock: Callable[[], float] = time.time,
        fence: Fence | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.fence = fence if fence is not None else Fence.always_open()
        #: evictions not sent (or left half done) because the fence had passed
        self.fenced = 0
        self.retry = evictions(retries)
        self.on_result = on_result
        self._clock = clock
        self._sem = asyncio.Semaphore(concurrency)
        self._tasks = TaskSet()

    @property
    def retries(self) -> int:
        return self.retry.retries

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def submit(self, eviction: Eviction) -> None:
        self._tasks.spawn(self._evict(eviction))

    async def drain(self, timeout: float) -> bool:
        """Wait for every eviction in flight; False if some were still running at the timeout."""
        return await self._tasks.drain(timeout)

    async def cancel(self) -> None:
        """End every eviction still in flight (after :meth:`drain`, before the client closes)."""
        await self._tasks.cancel()

    async def _mark(self, e: Eviction) -> bool:
        """Set the victim's ``DisruptionTarget`` condition; False when the pod is gone.
        Raises :class:`~batchsched.kube.leader.Fenced`."""
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
        what = f"marking {e.namespace}/{e.name}"

        async def send() -> None:
            async with self._sem:
                await self.fence.send(lambda: self.client.patch(path, patch, kind="strategic"), what=what)

        try:
            await self.retry.call(send, what=what)
        except (NotFoundError, ConflictError) as exc:
            self.on_result(e, "gone", exc)
            return False
        except KubeError as exc:
            # evict all the same: the preemption matters more than the note
            log.warning("could not mark %s/%s as a disruption target: %s", e.namespace, e.name, exc)
        return True

    async def _evict(self, e: Eviction) -> None:
        try:
            await self._send(e)
        except Fenced as exc:
            log.debug("%s", exc)
            self.fenced += 1
            self.on_result(e, "fenced", None)

    async def _send(self, e: Eviction) -> None:
        if e.preemptor and not await self._mark(e):
            return
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": e.name, "namespace": e.namespace},
            "deleteOptions": {"preconditions": {"uid": e.uid}},
        }
        path = f"/api/v1/namespaces/{e.namespace}/pods/{e.name}/eviction"
        what = f"eviction of {e.namespace}/{e.name}"

        async def send() -> None:
            async with self._sem:
                await self.fence.send(
                    lambda: self.client.request("POST", path, body=body, timeout=30), what=what
                )

        # a gang's eviction waits for the budget like any 429; a preemption does not
        stop = _budget_refusal if e.preemptor else None
        try:
            await self.retry.call(send, what=what, stop=stop)
        except (NotFoundError, ConflictError) as exc:
            self.on_result(e, "gone", exc)
        except TemporaryError as exc:
            if e.preemptor and isinstance(exc, DisruptionBudgetError):
                self.on_result(e, "blocked", exc)
                return
            log.warning("eviction of %s/%s failed: %s", e.namespace, e.name, exc)
            self.on_result(e, "failed", exc)
        except KubeError as exc:
            log.warning("eviction of %s/%s refused: %s", e.namespace, e.name, exc)
            self.on_result(e, "failed", exc)
        else:
            self.on_result(e, "evicted", None)
