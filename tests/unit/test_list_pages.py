"""A list's pages: the next page is asked for before the one in hand is read, and a list
given up part way (an object it cannot read, a stop) leaves no request for the next page
in flight."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from batchsched.kube.client import Credentials, KubeClient
from batchsched.kube.watch import Reflector
from tests.unit.fake_http import serving


def test_a_list_given_up_part_way_cancels_its_request_for_the_next_page() -> None:
    async def main() -> None:
        asked_next, finished = asyncio.Event(), asyncio.Event()

        async def handler(request: web.Request) -> web.Response:
            if request.query.get("continue"):
                asked_next.set()
                await finished.wait()  # the next page: not answered while the test runs
            return web.json_response({"metadata": {"continue": "more", "resourceVersion": "7"},
                                      "items": [{"n": i} for i in range(3)]})

        def unreadable(obj: Any) -> Any:
            raise ValueError("cannot read this object")

        async with serving(handler) as url:
            client = KubeClient.from_credentials(Credentials(host=url))
            try:
                before = asyncio.all_tasks()
                reflector = Reflector(client, "/api/v1/pods", on_list=lambda values: None,
                                      on_event=lambda kind, obj: None, read=unreadable, page=3)
                with pytest.raises(ValueError) as caught:  # held: its frames keep what they saw alive
                    await reflector._list()
                await asyncio.wait_for(asked_next.wait(), 5)
                for _ in range(3):
                    await asyncio.sleep(0)  # a cancelled request ends at its next turn
                in_flight = [t for t in asyncio.all_tasks() - before
                             if not t.done() and t.get_coro().__qualname__.startswith("KubeClient.")]
                assert not in_flight, f"still asking for the next page after {caught.value!r}"
            finally:
                finished.set()
                await client.close()

    asyncio.run(main())
