"""After a long outage of its apiserver, batchsched schedules again within seconds of its
return.

Its watches retry with a growing back-off while the apiserver cannot be reached; the
back-off is capped low enough that, once the apiserver answers, the mirror is listed again
and a new pod bound within a few seconds, not after a half-minute pause that was only meant
to spare an apiserver that is away (the chaos suite's expired-watch fault found pods created
just after such a return waiting, unseen and untold, for over 30 s).

The outage is batchsched's alone: it reaches the apiserver through a forwarder of this test
that stops listening (connections refused) for the outage, so the control plane's other
clients (the controller manager, the node agent) are not disturbed."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from batchsched.kube.client import KubeClient
from tests.integration.helpers import (
    XK8S,
    create_pods,
    list_pods,
    pod_body,
    running_scheduler,
    scheduler_kubeconfig,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(300)]

#: long enough for every watch's back-off to have grown past its cap
OUTAGE_SECONDS = 40.0
#: from the apiserver's return to the new pod's Binding
BACK_WITHIN_SECONDS = 12.0


class Forwarder:
    """Bytes from a local port to the apiserver's (TLS passes through untouched); :meth:`down`
    refuses connections and cuts the open ones, :meth:`up` listens again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.local = host, port, 0
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.Task[None]] = set()

    async def up(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.local, reuse_address=True)
        self.local = self.server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.pipes):
            task.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.pipes.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.pipes.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()


async def test_a_pod_created_after_a_long_outage_is_bound_within_seconds_of_the_apiservers_return(
    sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    pool = uuid.uuid4().hex[:6]
    await make_nodes(count=1, gpus=8, labels={"pool": pool})
    kc = yaml.safe_load(Path(scheduler_kubeconfig(sandbox)).read_text())
    server = urlsplit(kc["clusters"][0]["cluster"]["server"])
    forwarder = Forwarder(server.hostname or "127.0.0.1", server.port or 443)
    await forwarder.up()
    for cluster in kc["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{forwarder.local}"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    # one replica without leader election: a leader that cannot renew its lease stops (its
    # restart is the chaos suite's fault); here only its watches wait
    async with running_scheduler(sandbox, namespace, kubeconfig=str(path), leaderElection={"enabled": False}):
        await create_pods(kube, namespace, [pod_body("before", gpu=1, spec={"nodeSelector": {"pool": pool}})])
        await wait_for(lambda: _bound(kube, namespace, "before"), timeout=30)
        await forwarder.down()
        # meanwhile a node joins, and a gang arrives that only it can hold: the scheduler
        # sees them once its node, PodGroup and pod watches have all come back
        started = time.monotonic()
        late = f"late-{pool}"
        await make_nodes(count=1, gpus=8, labels={"pool": late})
        await kube.create(f"{XK8S}/namespaces/{namespace}/podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "after"},
            "spec": {"minMember": 1},
        })
        await create_pods(kube, namespace, [pod_body("after", gpu=8, spec={"nodeSelector": {"pool": late}},
                                                     metadata={"labels": {"scheduling.x-k8s.io/pod-group": "after"}})])
        await asyncio.sleep(OUTAGE_SECONDS - (time.monotonic() - started))
        await forwarder.up()
        back = time.monotonic()
        await wait_for(lambda: _bound(kube, namespace, "after"), timeout=60, interval=0.5)
        took = time.monotonic() - back
        print(f"bound {took:.1f} s after the apiserver could be reached again ({OUTAGE_SECONDS:g} s outage)")
        assert took < BACK_WITHIN_SECONDS
    await forwarder.down()


async def _bound(kube: KubeClient, namespace: str, name: str) -> bool:
    return any(p["metadata"]["name"] == name and p["spec"].get("nodeName") for p in await list_pods(kube, namespace))
