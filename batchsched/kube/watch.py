"""List, then watch from the list's resourceVersion; relist on 410 Gone; back off on errors.

Errors are told apart by class (:mod:`batchsched.kube.errors`): 410 relists at once; a
resource type that is not served (404, an optional CRD not installed) or not allowed (403)
is looked at again now and then, as an operator may fix it; anything else backs off under
:func:`~batchsched.kube.retry.watches` until a watch runs to its end again, or has been
running for :data:`HEALTHY_WATCH_SECONDS` when it fails.

A :class:`Reflector` keeps one collection mirrored: ``on_list`` receives every object of a
(re)list, each as ``read`` makes it (objects it reads as None are left out), ``on_event``
each watch event after it. A list's pages are read while the next one is fetched, a few
hundred objects at a time with the loop let run between them (the next page arrives, a
Lease is renewed), so a list of tens of thousands of pods costs the time of its fetch and
not that plus the time of reading it. Bookmarks only move the resourceVersion.
The first successful list sets :attr:`Reflector.synced`. Events are applied in the order
the server sends them, by the caller's synchronous callbacks (one writer, no locks).

:meth:`Reflector.relist` lists again on request (the watch in progress is stopped and
started again from the new list) and returns once that list is applied; :attr:`listed_at`
is when the last list began, so a caller can tell whether the mirror was read after some
moment (a new leader's catch-up on writes its predecessor made).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from batchsched import procmem
from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.errors import ExpiredError, ForbiddenError, KubeError, NotFoundError
from batchsched.kube.retry import watches

__all__ = ["Reflector"]

log = logging.getLogger("batchsched.watch")

#: items per page of a list. At 500 a list of 9,000 pods took twice as long as at 5,000
#: (0.85-2.1 s against 0.46-0.7 s on the sandbox), most of it round trips, while a page
#: of 5,000 pods is still only some 15 MB to hold before it is decoded. A list without a
#: limit is served by the apiserver three times as fast (from its watch cache, objects
#: already encoded: 26,400 pods in 0.6-1.0 s against 1.8-2.7 s in pages), but it was
#: tried and lost: the pods' reading, not their fetch, takes the time of a start, it no
#: longer overlaps the fetch, and holding every pod at once took a restart's peak memory
#: from 410 to 690 MB
LIST_PAGE = 5000

#: objects read between two turns of the loop while a list's pages come in
READ_CHUNK = 500

# How long to wait before looking again at a resource type not served, or not allowed.
_NOT_SERVED_WAIT = 30.0
_FORBIDDEN_WAIT = 10.0
#: a watch that ran this long before it failed was healthy: its failure is retried at the
#: first back-off, not after those of failures long past (as client-go's reflector resets)
HEALTHY_WATCH_SECONDS = 10.0


class Reflector:
    def __init__(
        self,
        client: KubeAPI,
        path: str,
        *,
        on_list: Callable[[list[Any]], None],
        on_event: Callable[[str, JSON], None],
        read: Callable[[JSON], Any] = lambda obj: obj,
        params: dict[str, str] | None = None,
        page: int = LIST_PAGE,
        watch_timeout: int = 300,
        name: str = "",
    ) -> None:
        self.client = client
        self.path = path
        self.on_list = on_list
        self.on_event = on_event
        self.read = read
        self.params = dict(params or {})
        self.page = page
        self.watch_timeout = watch_timeout
        self.name = name or path
        self.retry = watches()
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.events = 0
        self._missing_logged = False
        #: when the last successful list began (its view is at least that recent)
        self.listed_at = 0.0
        self._relist_asked = asyncio.Event()
        self._clock: Callable[[], float] = time.monotonic
        self._fresh = asyncio.Event()
        self._unavailable = False  # its last list was refused as not served or not allowed

    async def relist(self) -> None:
        """List again now, and return once the new list has been applied (at once for a
        collection the cluster does not serve or allow: there is nothing to read)."""
        if self._unavailable:
            return
        self._fresh.clear()
        self._relist_asked.set()
        await self._fresh.wait()

    async def _list(self) -> None:
        began, t0 = time.time(), time.monotonic()
        self._relist_asked.clear()
        values: list[Any] = []
        rv, listed = "", 0
        # closed on the way out, whatever ends the list: its request for the next page too
        async with contextlib.aclosing(self.client.pages(self.path, page=self.page, **self.params)) as pages:
            async for items, version in pages:
                rv = version
                listed += len(items)
                for i in range(0, len(items), READ_CHUNK):
                    # the objects read live on as the mirror: kept out of the collector's walks
                    with procmem.collector_paused(kept=True):
                        values.extend(v for v in map(self.read, items[i:i + READ_CHUNK]) if v is not None)
                    await asyncio.sleep(0)
                del items
        t1 = time.monotonic()
        self.on_list(values)
        log.info("%s: listed and read %d in %.2f s, taken in in %.2f s", self.name, listed, t1 - t0,
                 time.monotonic() - t1)
        self.resource_version = rv
        self.relists += 1
        self.listed_at = began
        self._unavailable = False
        self.synced.set()
        self._fresh.set()

    def _nothing_to_list(self) -> None:
        """A collection not served (or not allowed) holds nothing we can mirror: as fresh
        as a list, for whoever waits on :meth:`relist`."""
        self.listed_at = time.time()
        self._unavailable = True
        self._relist_asked.clear()
        self._fresh.set()

    async def _watch(self) -> None:
        async for etype, obj in self.client.watch(
            self.path, self.resource_version, timeout_seconds=self.watch_timeout, **self.params
        ):
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            if etype == "BOOKMARK":
                continue
            self.events += 1
            self.on_event(etype, obj)

    async def _watch_until_asked(self) -> bool:
        """Watch until the watch ends (False; its error raised) or a relist is asked for (True)."""
        watch = asyncio.ensure_future(self._watch())
        asked = asyncio.ensure_future(self._relist_asked.wait())
        try:
            await asyncio.wait({watch, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.cancel()
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        if watch.cancelled():
            return True
        watch.result()  # the watch's own error, if it ended on one
        return False

    async def run(self) -> None:
        failures = 0  # in a row, since the last watch that ran to its end or for a while
        need_list = True
        while True:
            watching_since: float | None = None
            try:
                if need_list or self._relist_asked.is_set():
                    await self._list()
                    need_list = False
                watching_since = self._clock()
                if await self._watch_until_asked():
                    continue  # a relist was asked for
                failures = 0
            except asyncio.CancelledError:
                raise
            except ExpiredError:
                log.info("%s: resourceVersion %s expired, relisting", self.name, self.resource_version)
                need_list = True
            except NotFoundError:
                # the resource type is not served (an optional CRD is not installed):
                # nothing to mirror until it is; look again now and then
                if not self._missing_logged:
                    log.info("%s: not served by this cluster; checking again every %.0f s",
                             self.name, _NOT_SERVED_WAIT)
                    self._missing_logged = True
                self.synced.set()
                self._nothing_to_list()
                await self.retry.sleep(_NOT_SERVED_WAIT)
            except ForbiddenError as exc:
                log.warning("%s: %s; retrying in %.0f s", self.name, exc, _FORBIDDEN_WAIT)
                self._nothing_to_list()
                await self.retry.sleep(_FORBIDDEN_WAIT)
            except KubeError as exc:
                if watching_since is not None and self._clock() - watching_since >= HEALTHY_WATCH_SECONDS:
                    failures = 0  # it had been watching fine: a cut is a first failure, not the next
                delay = self.retry.delay(failures)
                failures += 1
                log.warning("%s: %s; retrying in %.1f s", self.name, exc, delay)
                await self.retry.sleep(delay)
