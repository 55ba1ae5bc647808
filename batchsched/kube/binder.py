"""Bindings, many in flight at once under their own budget, each checked against the pod's UID.

The Binding carries the pod's UID, so it cannot land on a pod that was deleted and created
again under the same name. Outcomes go to ``on_result`` (called in the event loop):

* ``bound``: the apiserver accepted it (the watch will confirm ``spec.nodeName``);
* ``conflict``: 409, already bound, being deleted, gated or a different UID: forget and resync;
* ``gone``: 404, the pod no longer exists: forget;
* ``unknown``: no answer after the retries (5xx, timeouts, connections cut): the Binding may
  have landed, so the pod is read again before its room is given to another;
* ``failed``: refused: forget, retry later;
* ``fenced``: not sent, because this replica's lease deadline had passed before an attempt
  (:class:`~batchsched.kube.leader.Fence`, checked before the patch, the Binding and each
  retry of either): forget; the next leader reads the truth from its watches.

Every Binding names the replica that sent it in the annotation :data:`BOUND_BY`, which
the apiserver copies onto the pod with ``spec.nodeName``: who bound a pod can be read
from the pod itself (and a pod bound by a replica past its deadline would show it).

A Binding with annotations or labels (the GPU cards a pod was given, for the node agent)
first writes them on the pod with one merge patch carrying the pod's UID
(:func:`~batchsched.kube.cleanup.metadata_patch`), under the same retry policy and budget;
the patch and the Binding are one step for the scheduler. If the patch fails, no Binding
is sent and the outcome is the patch's, named as a Binding's would be (a pod replaced
under the same name, which the apiserver refuses with a 422 on ``metadata.uid``, is a
``conflict``). If the patch lands and the Binding fails, the outcome is the Binding's; the
pod is left unbound with a stale assignment, which the core sees and has cleaned up
(:class:`~batchsched.kube.cleanup.CleanupWriter`, waited for here before the pod's next
patch). A Binding without annotations or labels costs one request, as ever.

A Binding with ResourceClaims first writes each claim's allocation and reservation
(:mod:`batchsched.kube.claims`), under the same policy and budget; a claim that cannot be
written fails the Binding the same way, and the claims written before it, or before a
Binding that was refused, are put back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import replace

from batchsched.core.plan import Binding, ClaimWrite
from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.claims import (
    claim_delete_body,
    claim_path,
    claim_status_path,
    claims_path,
    extended_status_patch,
    release_patch,
    reserve_patch,
)
from batchsched.kube.cleanup import CleanupWriter, metadata_patch, pod_path, uid_refused
from batchsched.kube.errors import ConflictError, KubeError, NotFoundError, TemporaryError
from batchsched.kube.leader import Fence, Fenced
from batchsched.kube.retry import bindings
from batchsched.kube.tasks import TaskSet

__all__ = ["BOUND_BY", "Binder"]

log = logging.getLogger("batchsched.binder")

#: whether the running task holds a request slot of the binder (:meth:`Binder._slot`)
_HOLDING: ContextVar[bool] = ContextVar("batchsched_binder_slot", default=False)

Outcome = str

#: the annotation each Binding carries (the apiserver copies it onto the pod): the
#: identity of the replica that sent it
BOUND_BY = "batchsched.io/bound-by"


def _outcome(exc: BaseException) -> Outcome:
    """The outcome of a write that failed with ``exc`` (as :meth:`Binder._bind` names them)."""
    if isinstance(exc, Fenced):
        return "fenced"
    if isinstance(exc, ConflictError) or (isinstance(exc, KubeError) and uid_refused(exc)):
        return "conflict"
    if isinstance(exc, NotFoundError):
        return "gone"
    if isinstance(exc, TemporaryError):
        return "unknown"
    return "failed"


def _not_bound(b: Binding, exc: KubeError) -> KubeError:
    """What the other members of a gang are told when ``b``'s claims could not be written."""
    return KubeError(exc.status, exc.reason,
                     f"not bound: the ResourceClaims of {b.namespace}/{b.name}, of the same gang, "
                     f"could not be written ({exc.message})")


class Binder:
    """Bind pods under ``concurrency`` requests at a time; ``retry`` is the policy each
    Binding (and the patch before it) is retried under (:func:`~batchsched.kube.retry.bindings`).
    ``cleanups``, when given, is the writer whose cleanups of a pod are waited for before
    that pod's annotations are written. ``identity`` is written in :data:`BOUND_BY`;
    ``fence`` is checked before every attempt (always open when not given)."""

    def __init__(
        self,
        client: KubeAPI,
        *,
        concurrency: int = 128,
        retries: int = 5,
        on_result: Callable[[Binding, Outcome, KubeError | None], None],
        cleanups: CleanupWriter | None = None,
        identity: str = "",
        fence: Fence | None = None,
    ) -> None:
        self.client = client
        self.cleanups = cleanups
        self.identity = identity
        self.fence = fence if fence is not None else Fence.always_open()
        #: Bindings (or their patches) not sent because the fence had passed
        self.fenced = 0
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

    def submit_all(self, bindings: Sequence[Binding]) -> None:
        """A cycle's Bindings. The members of a gang whose pods have ResourceClaims go
        together: every member's claims are written first, and only then are the members
        bound; if one claim cannot be written, the claims written are put back and no
        member is bound (the gang is placed again whole)."""
        gangs: dict[str, list[Binding]] = {}
        for b in bindings:
            gangs.setdefault(b.unit, []).append(b)
        for members in gangs.values():
            if len(members) > 1 and any(b.claims for b in members):
                self._tasks.spawn(self._bind_gang(members))
            else:
                for b in members:
                    self.submit(b)

    async def _bind_gang(self, members: list[Binding]) -> None:
        async with self._slot():
            own = await self._gang_claims(members)
        if own is None:
            return
        # spawned outside the slot: each member's Binding takes one of its own
        for b in members:
            self._tasks.spawn(self._bind(b, claims_written=own.get(b.uid, ())))

    async def _gang_claims(self, members: list[Binding]) -> dict[str, tuple[ClaimWrite, ...]] | None:
        """Every member's claims written, each member's as it landed; None (each member
        told, what was written put back) when one could not be."""
        written: list[ClaimWrite] = []
        own: dict[str, tuple[ClaimWrite, ...]] = {}
        for b in members:
            try:
                before = len(written)
                for w in b.claims:
                    await self._write_claim(b, w, written)
                own[b.uid] = tuple(written[before:])
            except (KubeError, Fenced) as exc:
                outcome = _outcome(exc)
                if outcome == "fenced":
                    self.fenced += 1
                else:
                    await self._release(b, written)
                err = exc if isinstance(exc, KubeError) else None
                for m in members:
                    if m is b:
                        self.on_result(m, outcome, err)
                    else:
                        self.on_result(m, "fenced" if err is None else "failed", None if err is None else _not_bound(b, err))
                return None
        return own

    async def drain(self, timeout: float) -> bool:
        """Wait for every binding in flight; False if some were still running at the timeout."""
        return await self._tasks.drain(timeout)

    async def cancel(self) -> None:
        """End every binding still in flight (after :meth:`drain`, before the client closes)."""
        await self._tasks.cancel()

    def body(self, b: Binding) -> dict[str, object]:
        """The Binding sent for ``b``."""
        meta: dict[str, object] = {"name": b.name, "namespace": b.namespace, "uid": b.uid}
        if self.identity:
            meta["annotations"] = {BOUND_BY: self.identity}
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": b.node},
        }

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """One of the ``concurrency`` request slots, held by a pod's whole chain of writes
        (claims, its status, annotations, the Binding): a chain taken up goes to its end
        before another starts, so the first Bindings leave after a few requests, not after
        every pod's first write (a task holding one takes no second)."""
        if _HOLDING.get():
            yield
            return
        async with self._sem:
            token = _HOLDING.set(True)
            try:
                yield
            finally:
                _HOLDING.reset(token)

    async def _bind(self, b: Binding, *, claims_written: tuple[ClaimWrite, ...] | None = None) -> None:
        async with self._slot():
            await self._chain(b, claims_written)

    async def _chain(self, b: Binding, claims_written: tuple[ClaimWrite, ...] | None) -> None:
        """Bind ``b``: its claims first (unless ``claims_written``: its gang's were, these
        its own), its annotations, then the Binding."""
        body = self.body(b)
        pod = pod_path(b.namespace, b.name)
        path = f"{pod}/binding"
        what = f"binding {b.namespace}/{b.name} to {b.node}"

        # the fence is checked once the budget lets the request go (a request may wait
        # there, or in a retry's pause, past the deadline), and again as it is written
        async def label() -> None:
            patch = metadata_patch(b.uid, b.annotations, b.labels)
            async with self._slot():
                await self.fence.send(lambda: self.client.patch(pod, patch, kind="merge"), what=what)

        async def send() -> None:
            async with self._slot():
                await self.fence.send(
                    lambda: self.client.request("POST", path, body=body, timeout=30), what=what
                )

        written: list[ClaimWrite] = list(claims_written or ())
        try:
            for w in () if claims_written is not None else b.claims:
                await self._write_claim(b, w, written)
            if b.annotations or b.labels:
                what = f"annotating {b.namespace}/{b.name} before binding it to {b.node}"
                if self.cleanups is not None:
                    await self.cleanups.settled(b.uid)
                await self.retry.call(label, what=what)
                what = f"binding {b.namespace}/{b.name} to {b.node}"
            await self.retry.call(send, what=what)
        except Fenced as exc:
            log.debug("%s", exc)
            self.fenced += 1
            self.on_result(b, "fenced", None)
        except ConflictError as exc:
            await self._release(b, written)
            self.on_result(b, "conflict", exc)
        except NotFoundError as exc:
            await self._release(b, written)
            self.on_result(b, "gone", exc)
        except TemporaryError as exc:
            log.warning("%s failed, outcome unknown: %s", what, exc)
            self.on_result(b, "unknown", exc)
        except KubeError as exc:
            await self._release(b, written)
            if uid_refused(exc):
                self.on_result(b, "conflict", exc)
                return
            log.warning("%s refused: %s", what, exc)
            self.on_result(b, "failed", exc)
        else:
            self.on_result(b, "bound", None)

    async def _write_claim(self, b: Binding, w: ClaimWrite, written: list[ClaimWrite]) -> None:
        """One claim of ``b`` written (made first, when it is the claim of the pod's
        extended resources, and then named in the pod's status); each write that landed is
        in ``written``, to be put back if the pod is not bound."""
        if w.create is not None:
            what = f"making the extended-resource ResourceClaim of {b.namespace}/{b.name}"
            # once: a retry after an answer that was lost could make a second claim (a
            # claim made and not used is deleted when the pod is read pending again)
            made = await self._send(lambda: self.client.create(claims_path(w.namespace), dict(w.create or {})), what)
            meta = made.get("metadata") or {}
            w = replace(w, name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""),
                        resource_version=str(meta.get("resourceVersion") or ""), create=None)
            written.append(w)
        what = f"allocating ResourceClaim {w.namespace}/{w.name} for {b.namespace}/{b.name} on {b.node}"
        await self.retry.call(self._claim_write(w, what), what=what)
        if w not in written:
            written.append(w)
        if w.mappings:
            what = f"naming ResourceClaim {w.namespace}/{w.name} in the status of {b.namespace}/{b.name}"
            path, patch = f"{pod_path(b.namespace, b.name)}/status", extended_status_patch(b.uid, w)
            await self.retry.call(lambda: self._send(lambda: self.client.patch(path, patch, kind="merge"), what),
                                  what=what)

    async def _send(self, request: Callable[[], Awaitable[JSON]], what: str) -> JSON:
        async with self._slot():
            got = await self.fence.send(request, what=what)
        return got if isinstance(got, dict) else {}

    def _claim_write(self, w: ClaimWrite, what: str) -> Callable[[], Awaitable[object]]:
        path, patch = claim_status_path(w.namespace, w.name), reserve_patch(w, time.time())

        async def write() -> object:
            async with self._slot():
                return await self.fence.send(lambda: self.client.patch(path, patch, kind="merge"), what=what)

        return write

    async def _release(self, b: Binding, written: list[ClaimWrite]) -> None:
        """The claims written for ``b`` put back as they were read (its Binding did not
        happen); a claim that cannot be put back is logged (kube-controller-manager drops
        a reservation for a pod that is gone)."""
        for w in written:
            what = f"releasing ResourceClaim {w.namespace}/{w.name} of {b.namespace}/{b.name}"
            if w.mappings:  # the claim made for the pod's extended resources: deleted
                method, path, body = "DELETE", claim_path(w.namespace, w.name), claim_delete_body(w.uid)
            else:
                method, path, body = "PATCH", claim_status_path(w.namespace, w.name), release_patch(w)

            async def put_back(method: str = method, path: str = path, body: JSON = body, what: str = what) -> object:
                async with self._slot():
                    if method == "DELETE":
                        return await self.fence.send(
                            lambda: self.client.request("DELETE", path, body=body), what=what)
                    return await self.fence.send(lambda: self.client.patch(path, body, kind="merge"), what=what)

            try:
                await self.retry.call(put_back, what=what)
            except (KubeError, Fenced) as exc:
                log.warning("%s failed: %s", what, exc)
