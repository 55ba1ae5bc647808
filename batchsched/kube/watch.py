"""List, then watch from the list's resourceVersion; relist on 410 Gone; back off on errors.

A :class:`Reflector` keeps one collection mirrored: ``on_list`` receives every object of a
(re)list, ``on_event`` each watch event after it. Bookmarks only move the resourceVersion.
The first successful list sets :attr:`Reflector.synced`. Events are applied in the order
the server sends them, by the caller's synchronous callbacks (one writer, no locks).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ExpiredError, ForbiddenError, KubeError, NotFoundError

log = logging.getLogger("batchsched.watch")

JSON = dict[str, Any]


class Reflector:
    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        on_list: Callable[[list[JSON]], None],
        on_event: Callable[[str, JSON], None],
        params: dict[str, str] | None = None,
        page: int = 500,
        watch_timeout: int = 300,
        name: str = "",
    ) -> None:
        self.client = client
        self.path = path
        self.on_list = on_list
        self.on_event = on_event
        self.params = dict(params or {})
        self.page = page
        self.watch_timeout = watch_timeout
        self.name = name or path
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.events = 0
        self._missing_logged = False

    async def _list(self) -> None:
        items, rv = await self.client.list(self.path, page=self.page, **self.params)
        self.on_list(items)
        self.resource_version = rv
        self.relists += 1
        self.synced.set()

    async def run(self) -> None:
        backoff = 0.5
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
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
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except ExpiredError:
                log.info("%s: resourceVersion %s expired, relisting", self.name, self.resource_version)
                need_list = True
            except NotFoundError:
                # the resource type is not served (an optional CRD is not installed):
                # nothing to mirror until it is; look again now and then
                if not self._missing_logged:
                    log.info("%s: not served by this cluster; checking again every 30 s", self.name)
                    self._missing_logged = True
                self.synced.set()
                await asyncio.sleep(30)
            except ForbiddenError as exc:
                log.warning("%s: %s; retrying in 10 s", self.name, exc)
                await asyncio.sleep(10)
            except KubeError as exc:
                log.warning("%s: %s; retrying in %.1f s", self.name, exc, backoff)
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(backoff * 2, 30.0)
