"""``batchsched explain``'s search for the leader: what the user is told when the Lease is
not where the CLI looked."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from batchsched.kube.client import Credentials
from batchsched.kube.viewclient import ViewError, find_server
from tests.unit.fake_http import serving


def test_a_missing_lease_names_where_it_was_looked_for_and_the_flags_that_look_elsewhere() -> None:
    async def main() -> str:
        asked: list[str] = []

        async def handler(request: web.Request) -> web.Response:
            asked.append(request.path)
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)

        async with serving(handler) as url:
            with pytest.raises(ViewError) as err:
                await find_server(Credentials(host=url), namespace="team-x", lease="sched")
        assert asked == ["/apis/coordination.k8s.io/v1/namespaces/team-x/leases/sched"]
        return str(err.value)

    message = asyncio.run(main())
    assert message == (
        "no Lease team-x/sched: is batchsched running there with leader election? "
        "--lease-namespace and --lease-name look elsewhere (leaderElection.namespace and leaseName "
        "of its configuration); --server names its views address"
    )
