"""The web view in a real headless Chromium, through ``batchsched dashboard``, on the real
control plane.

Two teams share a cohort: team A runs a gang that borrows GPUs team B does not use; team B
runs a notebook and waits with a gang that does not fit (it may not reclaim). The page is
loaded the way a user opens it (the URL the dashboard prints, no token in the browser) and
read as they would: the queues with their counts and quota, the waiting gang with why it
waits, the running gang, a square for every GPU card. The numbers it shows are compared with
what the apiserver holds (Queue status, nodes' allocatable, the pods bound). A user allowed
the page but not the views it reads sees an error line that says so. The dashboard reaches
the scheduler over TLS, verified with the CA its Lease publishes (or ``--ca-file``), and a
browser opening the views directly accepts them only with that CA's key pinned.

``BATCHSCHED_SCREENSHOT=1`` also writes the screenshot to ``docs/images/web-view.png``
(the README's picture); otherwise it goes to the test's temporary folder only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import NotFoundError
from batchsched.kube.tls import client_context, make_self_signed
from batchsched.sandbox.cluster import free_port
from tests.conftest import ROOT, admin_token
from tests.integration import browser
from tests.integration.helpers import (
    QUEUES,
    XK8S,
    create_group,
    create_pods,
    events_for,
    list_pods,
    pod_body,
    queues,
    running_scheduler,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"
SCREENSHOT = ROOT / "docs" / "images" / "web-view.png"
DURATION = re.compile(r"^(\d+s|\d+m|\d+h( \d+m)?|\d+d( \d+h)?)$")


def member(name: str, pool: str, *, queue: str, gpu: int, group: str | None = None) -> dict[str, Any]:
    labels = {"batchsched.io/queue": queue}
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    return pod_body(name, gpu=gpu, metadata={"labels": labels}, spec={"nodeSelector": {"pool": pool}})


@contextlib.asynccontextmanager
async def dashboard(kubeconfig: str, server: str, log: Path, *flags: str) -> AsyncIterator[str]:
    """``batchsched dashboard`` as a process; yields the URL it prints first. ``flags``:
    where it reads the views' CA (``--lease-namespace``, or ``--ca-file``)."""
    with log.open("ab") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "batchsched", "dashboard", "--kubeconfig", kubeconfig,
             "--port", str(free_port()), "--server", server, *flags],
            stdout=subprocess.PIPE, stderr=errors,
        )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        url = line.decode().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/ui/"), (url, log.read_text())
        yield url
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 15)


@contextlib.asynccontextmanager
async def page_only_user(kube: KubeClient, sandbox: Any, namespace: str, folder: Path) -> AsyncIterator[str]:
    """A kubeconfig of a ServiceAccount allowed ``/ui/`` but none of the views."""
    from batchsched.sandbox.pki import write_kubeconfig

    name = f"ui-only-{namespace}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "ui-only"}})
    await kube.create(f"{rbac}/clusterroles", {
        "metadata": {"name": name},
        "rules": [{"nonResourceURLs": ["/ui", "/ui/*"], "verbs": ["get"]}],
    })
    try:
        await kube.create(f"{rbac}/clusterrolebindings", {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "ui-only", "namespace": namespace}],
        })
        issued = await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/ui-only/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600},
        })
        path = folder / "kubeconfig-ui-only"
        write_kubeconfig(path, sandbox.server, Path(sandbox.dir) / "pki" / "ca.crt", issued["status"]["token"],
                         f"system:serviceaccount:{namespace}:ui-only")
        yield str(path)
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(NotFoundError):
                await kube.delete(f"{rbac}/{kind}/{name}")


async def page(url: str) -> browser.Element:
    """The page's DOM once its first reads landed. Chromium runs off the event loop: the
    scheduler serving its reads runs on it."""
    return browser.parse(await asyncio.to_thread(browser.dump_dom, url, wait_ms=4000))


def cells(row: browser.Element) -> list[str]:
    return [td.text() for td in row.find_all("td")]


def job_rows(root: browser.Element) -> dict[str, browser.Element]:
    """The Jobs table's rows by the name shown (namespace/name)."""
    return {row.find("td").text(): row for row in root.find(id="jobs").find("tbody").find_all("tr")
            if "job" in row.classes}


async def test_the_web_view_shows_queues_jobs_and_cards_through_the_dashboard(
    sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    browser.chromium()  # before anything starts: skipped or failed here when it is missing
    tag = uuid.uuid4().hex[:4]
    org, team_a, team_b = f"research-{tag}", f"team-nlp-{tag}", f"team-vision-{tag}"
    train, notebook, evaluate = f"llm-train-{tag}", f"notebook-{tag}", f"eval-{tag}"
    await make_nodes(count=2, gpus=8, labels={"pool": tag})
    gpu_quota = [{"name": GPU, "nominal": 8}]
    async with queues(kube, (org, {}),
                      (team_a, {"parent": org, "resources": gpu_quota}),
                      (team_b, {"parent": org, "resources": gpu_quota, "weight": 2,
                                "preemption": {"reclaimWithinCohort": "Never"}})), \
            running_scheduler(sandbox, namespace, queues={"statusIntervalSeconds": 0.5}) as sched:
        # team A's gang borrows 4 of team B's GPUs; team B's notebook takes one more
        await create_group(kube, XK8S, namespace, train, {"minMember": 2})
        await create_pods(kube, namespace, [member(f"{train}-{i}", tag, queue=team_a, gpu=6, group=train)
                                            for i in range(2)])
        await create_pods(kube, namespace, [member(notebook, tag, queue=team_b, gpu=1)])
        await wait_for(lambda: _bound(kube, namespace, [f"{train}-0", f"{train}-1", notebook]), timeout=60)
        # team B's gang needs 6 cards: 3 are left of its nominal (4 are lent), and it may not reclaim
        await create_group(kube, XK8S, namespace, evaluate, {"minMember": 2})
        await create_pods(kube, namespace, [member(f"{evaluate}-{i}", tag, queue=team_b, gpu=3, group=evaluate)
                                            for i in range(2)])
        await wait_for(lambda: events_for(kube, namespace, f"{evaluate}-0", "FailedScheduling"), timeout=60)
        status_a = await wait_for(lambda: _queue_status(kube, team_a, used={GPU: "12"}, borrowed={GPU: "4"}), timeout=30)
        status_b = await wait_for(lambda: _queue_status(kube, team_b, used={GPU: "1"}, lent={GPU: "4"}), timeout=30)
        assert status_b["pending"] >= 1

        # without a token the scheduler answers 401, the page as well as its data, over
        # TLS verified with the CA its Lease publishes
        lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
        annotations = lease["metadata"]["annotations"]
        ca = annotations["batchsched.io/views-ca"]
        base = f"https://127.0.0.1:{sched.views_port}"
        assert annotations["batchsched.io/endpoint"] == base
        verified = aiohttp.TCPConnector(ssl=client_context(ca))
        async with aiohttp.ClientSession(connector=verified) as http:
            for path in ("/ui/", "/debug/jobs", "/debug/queues", "/debug/nodes"):
                async with http.get(base + path) as r:
                    assert r.status == 401, path

        async with dashboard(sandbox.kubeconfig, base, tmp_path / "dashboard.log",
                             "--lease-namespace", namespace) as url:
            async def shown() -> browser.Element | None:
                root = await page(url)
                row = job_rows(root).get(f"{namespace}/{evaluate}")
                return root if row is not None and GPU in cells(row)[7] else None

            root = await wait_for(shown, timeout=90, interval=1)
            error = root.find(id="error")
            assert "hidden" in error.attrs, error.text()
            assert root.find(id="updated").text().startswith("data of 20")

            # Queues: both teams with their counts (as their Queue status says) and GPU quota
            rows = {r.attrs.get("data-queue"): r for r in root.find(id="queues").find("tbody").find_all("tr")}
            assert {org, team_a, team_b} <= set(rows)
            name, state, pending, admitted, _, _, _ = cells(rows[team_a])
            assert (name, state) == (team_a, "Active")
            assert (int(pending), int(admitted)) == (status_a["pending"], status_a["admitted"])
            name, state, pending, admitted, _, oldest, _ = cells(rows[team_b])
            assert (name, state) == (team_b, "Active")
            assert (int(pending), int(admitted)) == (status_b["pending"], status_b["admitted"])
            assert DURATION.match(oldest), oldest
            [gpu_a] = [q for q in rows[team_a].find_all(cls="quota") if q.find(cls="res").text() == "GPU"]
            assert gpu_a.find(cls="amount").text() == "12 / 8, 4 borrowed"
            assert gpu_a.find_all(cls="nominal-mark") and gpu_a.find(cls="borrowed").attrs["style"] != "width: 0%;"
            [gpu_b] = [q for q in rows[team_b].find_all(cls="quota") if q.find(cls="res").text() == "GPU"]
            assert gpu_b.find(cls="amount").text() == "1 / 8, 4 lent"

            # Jobs: the waiting gang says why, the running gang and the notebook run
            jobs = job_rows(root)
            name, queue, state, members, gpus, wait, starts, why = cells(jobs[f"{namespace}/{evaluate}"])
            assert queue.startswith(team_b) and state in ("queued", "reserved"), (queue, state)
            assert (members, gpus) == ("0/2", "6")
            assert DURATION.match(wait), wait
            assert re.match(r"^(in \d.*|now|unknown)$", starts), starts
            assert GPU in why
            name, queue, state, members, gpus, wait, starts, why = cells(jobs[f"{namespace}/{train}"])
            assert (queue, state, members, gpus, why) == (team_a, "running", "2/2", "12", "")
            assert cells(jobs[f"{namespace}/{notebook}"])[1:5] == [team_b, "running", "1/1", "1"]

            # GPUs: one square per card of every node, filled as the bound pods take them
            nodes, _ = await kube.list("/api/v1/nodes")
            cards = {n["metadata"]["name"]: int(n["status"]["allocatable"].get(GPU, "0")) for n in nodes}
            shown_nodes = {n.attrs["data-node"]: n for n in root.find(id="nodes").find_all(cls="node")}
            assert {name: len(n.find_all(cls="card")) for name, n in shown_nodes.items()} == \
                {name: count for name, count in cards.items() if count}
            pods = await list_pods(kube, namespace)
            held: dict[str, int] = {}
            for p in pods:
                if p["spec"].get("nodeName"):
                    held[p["spec"]["nodeName"]] = held.get(p["spec"]["nodeName"], 0) + _gpus(p)
            for node, count in held.items():
                fills = [_height(c.find(cls="fill")) for c in shown_nodes[node].find_all(cls="card")]
                assert sum(fills) == pytest.approx(count), (node, fills)
                assert shown_nodes[node].find(cls="node-used").text() == f"{count}/8 used"

            # the queue filter, linked: only team B's work
            only_b = job_rows(await page(url + f"?queue={team_b}"))
            assert set(only_b) == {f"{namespace}/{evaluate}", f"{namespace}/{notebook}"}

            shot = await asyncio.to_thread(browser.screenshot, url, tmp_path / "web-view.png", wait_ms=4000)
            with Image.open(shot) as image:
                assert image.format == "PNG" and image.size == (1280, 900)
                colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
                assert len(colours) > 100  # text, badges, bars and cards, not a blank page
            if os.environ.get("BATCHSCHED_SCREENSHOT") == "1":
                await asyncio.to_thread(browser.screenshot, url, SCREENSHOT, wait_ms=4000)

        # a user who may open the page but not read the views is told why, not shown a blank page
        # (who may not read the Lease either: the CA is given as a file)
        ca_file = tmp_path / "views-ca.crt"
        ca_file.write_text(ca)
        async with page_only_user(kube, sandbox, namespace, tmp_path) as kubeconfig, \
                dashboard(kubeconfig, base, tmp_path / "dashboard-denied.log", "--ca-file", str(ca_file)) as url:
            async def refused() -> browser.Element | None:
                root = await page(url)
                return root if "hidden" not in root.find(id="error").attrs else None

            root = await wait_for(refused, timeout=60, interval=1)
            error = root.find(id="error").text()
            for path in ("../debug/queues", "../debug/jobs", "../debug/nodes"):
                assert f"{path} (HTTP 403" in error, error
            assert "ClusterRole" in error, error
            assert root.find(id="updated").text() == "no data"
            assert not root.find(id="queues").find("tbody").find_all("tr")


async def test_the_views_answer_only_over_tls_with_the_certificate_their_lease_vouches_for(
    sandbox, kube: KubeClient, namespace: str, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """A browser opening the scheduler's views directly: Chromium accepts their certificate
    only when told the CA the Lease publishes (its key pinned with
    ``--ignore-certificate-errors-spki-list``), and then gets the views' own answer (a token
    is required), not a page served without TLS. Plain HTTP to the views' port gets no
    answer at all, and the plain metrics port serves none of the views."""
    browser.chromium()
    async with running_scheduler(sandbox, namespace) as sched:
        lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/batchsched")
        ca = lease["metadata"]["annotations"]["batchsched.io/views-ca"]
        url = f"https://127.0.0.1:{sched.views_port}/ui/"
        # Chromium's own roots do not vouch for it: no page
        untrusted = await asyncio.to_thread(browser.dump_dom, url, wait_ms=2000)
        assert "bearer token" not in untrusted and "<pre>" not in untrusted, untrusted
        # another CA's key pinned: no page either
        other = make_self_signed(["127.0.0.1"]).ca_pem.decode()
        wrong = await asyncio.to_thread(browser.dump_dom, url, wait_ms=2000, trust_ca=other)
        assert "bearer token" not in wrong, wrong
        # the Lease's CA: the views answer, and without a token they give nothing away
        shown = browser.parse(await asyncio.to_thread(browser.dump_dom, url, wait_ms=2000, trust_ca=ca))
        assert "a bearer token is required" in shown.find("pre").text()

        token = {"Authorization": f"Bearer {admin_token(sandbox.kubeconfig)}"}
        async with aiohttp.ClientSession() as http:
            # plain HTTP to the views' port: the TLS handshake fails, nothing is answered
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{sched.views_port}/debug/jobs", headers=token) as r:
                    raise AssertionError(f"answered {r.status} over plain HTTP: {await r.text()}")
            # the metrics port is plain HTTP, and has no views
            metrics = f"http://127.0.0.1:{sched.http_port}"
            for path in ("/debug/jobs", "/ui/"):
                async with http.get(metrics + path, headers=token) as r:
                    assert r.status == 404, (path, r.status)
            async with http.get(metrics + "/metrics") as r:
                assert r.status == 200 and "batchsched_" in await r.text()


async def _bound(kube: KubeClient, namespace: str, names: list[str]) -> bool:
    pods = {p["metadata"]["name"]: p for p in await list_pods(kube, namespace)}
    return all(n in pods and pods[n]["spec"].get("nodeName") for n in names)


async def _queue_status(kube: KubeClient, name: str, **want: Any) -> dict[str, Any] | None:
    status = (await kube.get(f"{QUEUES}/{name}")).get("status") or {}
    return status if all(status.get(k) == v for k, v in want.items()) else None


def _gpus(pod: dict[str, Any]) -> int:
    return sum(int(((c.get("resources") or {}).get("requests") or {}).get(GPU, "0"))
               for c in pod["spec"]["containers"])


def _height(fill: browser.Element) -> float:
    """A card's fill (0..1) from its style, ``height: 50%;``."""
    found = re.search(r"height:\s*([\d.]+)%", fill.attrs.get("style", ""))
    return float(found.group(1)) / 100 if found else 0.0
