"""Annotations and labels the scheduler writes on pods, and their removal when stale.

A :class:`~batchsched.core.plan.Binding` may carry annotations and labels (the GPU cards a
pod was given, which a node agent reads); the binder writes them with one merge patch
before the Binding (:func:`metadata_patch`). When the Binding then fails, or the replica
restarts between the two, the pod stays unbound with an assignment that no longer holds;
the core sees that and asks for a cleanup (``Decisions.cleanups``), which
:class:`CleanupWriter` sends: a merge patch setting those keys to null.

Every patch carries the pod's UID (``metadata.uid``). The apiserver does not treat it as a
precondition as such: a pod recreated under the same name refuses it as an attempt to
change an immutable field, 422 ``metadata.uid: Invalid value: ...: field is immutable``
(:func:`uid_refused`), and a 409 may come too. Either way the patch never reaches the new
pod.

Cleanups are best effort, like the status writers: each is retried under
:func:`~batchsched.kube.retry.status_writes`, then logged and dropped; a pod that is gone
(404) or replaced needs none. Nothing here raises into the event loop. The core asks
again for a pod that still shows a stale assignment. A cleanup is written for the leader:
it checks the replica's :class:`~batchsched.kube.leader.Fence` before each attempt and is
dropped once the fence has passed.

Order per pod: a cleanup that is still in flight when the binder is about to write the same
pod's new assignment is waited for first (:meth:`CleanupWriter.settled`), so it cannot
land after the new assignment and erase it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from batchsched.core.plan import ObjectRef
from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.claims import claim_delete_body, claim_path
from batchsched.kube.errors import (
    ConflictError,
    InvalidError,
    KubeError,
    NotFoundError,
    TemporaryError,
)
from batchsched.kube.leader import Fence, Fenced
from batchsched.kube.retry import status_writes
from batchsched.kube.tasks import TaskSet

__all__ = ["CleanupWriter", "metadata_patch", "pod_path", "uid_refused"]

log = logging.getLogger("batchsched.cleanup")

#: the field an apiserver names when a patch's ``metadata.uid`` is not the object's
_UID_FIELD = "metadata.uid"


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def metadata_patch(
    uid: str,
    annotations: Iterable[tuple[str, str | None]] = (),
    labels: Iterable[tuple[str, str | None]] = (),
) -> JSON:
    """A merge patch of a pod's annotations and labels (None deletes a key), pinned to ``uid``."""
    meta: JSON = {"uid": uid}
    ann = dict(annotations)
    lab = dict(labels)
    if ann:
        meta["annotations"] = ann
    if lab:
        meta["labels"] = lab
    return {"metadata": meta}


def uid_refused(exc: KubeError) -> bool:
    """The apiserver refused a patch because its ``metadata.uid`` is not the object's: the
    object was deleted and created again under the same name.

    That answer is a 422 whose Status names the field only in its message (our errors keep
    the causes' types, not their fields), so the field's name is looked for there.
    """
    return isinstance(exc, InvalidError) and _UID_FIELD in exc.message


class CleanupWriter:
    """Delete stale annotation and label keys from pods, ``concurrency`` requests at a time.

    ``written`` counts cleanups that landed, ``dropped`` those given up (the pod is gone or
    was replaced, retries were exhausted, the server refused, or the fence had passed). ``retry`` is the policy
    each one is retried under.
    """

    def __init__(self, client: KubeAPI, *, concurrency: int = 4, fence: Fence | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client = client
        self.fence = fence if fence is not None else Fence.always_open()
        self.retry = status_writes()
        self.written = 0
        self.dropped = 0
        self._sem = asyncio.Semaphore(concurrency)
        self._tasks = TaskSet()
        self._by_pod: dict[str, set[asyncio.Future[None]]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def submit(self, ref: ObjectRef, annotations: tuple[str, ...], labels: tuple[str, ...]) -> None:
        """Queue the removal of ``annotations`` and ``labels`` (keys) from the pod ``ref``.
        Never blocks; nothing is sent when there are no keys."""
        if not annotations and not labels:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._by_pod.setdefault(ref.uid, set())
        waiting.add(done)
        self._tasks.spawn(self._clean(ref, annotations, labels, done))

    def delete_claim(self, namespace: str, name: str, uid: str) -> None:
        """Queue the deletion of the ResourceClaim made for a pod's extended resources by an
        attempt that bound nothing (``uid``: the claim's, a precondition). Never blocks."""
        self._tasks.spawn(self._delete_claim(namespace, name, uid))

    async def _delete_claim(self, namespace: str, name: str, uid: str) -> None:
        path, body = claim_path(namespace, name), claim_delete_body(uid)
        what = f"deleting the extended-resource ResourceClaim {namespace}/{name}"

        async def send() -> None:
            async with self._sem:
                await self.fence.send(lambda: self.client.request("DELETE", path, body=body), what=what)

        try:
            await self.retry.call(send, what=what)
            self.written += 1
        except Fenced as exc:
            log.debug("%s", exc)
            self.dropped += 1
        except (NotFoundError, ConflictError) as exc:
            log.debug("dropping %s: %s", what, exc)
            self.dropped += 1
        except KubeError as exc:
            log.warning("could not finish %s: %s", what, exc)
            self.dropped += 1
        except Exception:  # a bug in one cleanup must not stop the others
            log.exception("%s failed", what)
            self.dropped += 1

    async def settled(self, uid: str) -> None:
        """Wait until no cleanup of the pod ``uid`` is in flight (at once when none is)."""
        waiting = self._by_pod.get(uid)
        if waiting:
            await asyncio.wait(set(waiting))

    async def drain(self, timeout: float) -> bool:
        """Wait for every cleanup in flight; False if some were still running at the timeout."""
        return await self._tasks.drain(timeout)

    async def cancel(self) -> None:
        """End every cleanup still in flight (after :meth:`drain`, before the client closes)."""
        await self._tasks.cancel()

    async def _clean(
        self,
        ref: ObjectRef,
        annotations: tuple[str, ...],
        labels: tuple[str, ...],
        done: asyncio.Future[None],
    ) -> None:
        path = pod_path(ref.namespace, ref.name)
        body = metadata_patch(
            ref.uid, ((k, None) for k in annotations), ((k, None) for k in labels)
        )
        what = f"cleanup of pod {ref.namespace}/{ref.name}"

        async def send() -> None:
            async with self._sem:
                await self.fence.send(lambda: self.client.patch(path, body, kind="merge"), what=what)

        landed = False
        try:
            await self.retry.call(send, what=what)
            landed = True
        except Fenced as exc:
            log.debug("%s", exc)
        except (NotFoundError, ConflictError) as exc:
            log.debug("dropping %s: %s", what, exc)
        except TemporaryError as exc:
            log.warning("giving up %s after %d tries: %s", what, self.retry.retries + 1, exc)
        except KubeError as exc:
            if uid_refused(exc):
                log.debug("dropping %s: the pod was replaced: %s", what, exc)
            else:
                log.warning("could not write %s: %s", what, exc)
        except Exception:  # a bug in one cleanup must not stop the others
            log.exception("%s failed", what)
        finally:
            if landed:
                self.written += 1
            else:
                self.dropped += 1
            waiting = self._by_pod.get(ref.uid)
            if waiting is not None:
                waiting.discard(done)
                if not waiting:
                    del self._by_pod[ref.uid]
            done.set_result(None)
