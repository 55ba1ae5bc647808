"""``batchsched explain`` and ``jobs`` on Kubernetes' own pod groups (``scheduling.k8s.io``):
found by name and by a member, with their members, quorum, priority and why they wait, the
API shown as Kubernetes' own; a name held by two APIs in one namespace is said, and the
user may choose."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from batchsched.insight.explain import Insight, NotFound
from batchsched.insight.tables import jobs_table
from tests.unit.test_upstream_groups import Upstream


def waiting_gang() -> Upstream:
    """A gang of three whole nodes on two, its group at priority 500 (its pods at 0), and an
    elastic gang (quorum 1 of 2) that runs."""
    w = Upstream()
    w.node("n0", 8)
    w.node("n1", 8)
    w.upstream("elastic", 1)
    for i in range(2):
        w.member(f"elastic-{i}", 4, "elastic")
    w.step()
    w.upstream("train", 3, priority=500)
    for i in range(3):
        w.member(f"train-{i}", 8, "train")
    w.step(after=1)
    return w


def test_an_upstream_podgroup_is_explained_by_name_and_by_a_member() -> None:
    w = waiting_gang()
    insight = Insight(w.session, use_jit=False)
    out = insight.explain(w.now, kind="podgroup", namespace="default", name="train")
    job = out["job"]
    assert (job["kind"], job["api"], job["name"]) == ("PodGroup", "scheduling.k8s.io", "train")
    assert job["members"] == {"bound": 0, "required": 3, "total": 3}
    assert job["priority"] == 500  # the group's, not its members'
    assert job["state"] == "queued" and "3" in job["message"] and job["message"], job
    assert out["summary"][0].startswith("PodGroup default/train: ") and out["summary"][1] == "  api: scheduling.k8s.io"
    assert {p["name"] for p in out["pods"]} == {"train-0", "train-1", "train-2"}
    by_member = insight.explain(w.now, kind="pod", namespace="default", name="train-2")["job"]
    assert by_member["key"] == job["key"] == "k8s:default/train"
    elastic = insight.explain(w.now, kind="podgroup", namespace="default", name="elastic")["job"]
    assert elastic["state"] == "running" and elastic["members"] == {"bound": 2, "required": 1, "total": 2}


def test_a_member_of_an_upstream_group_not_created_yet_waits_for_it() -> None:
    w = Upstream()
    w.node("n0", 8)
    w.member("early-0", 1, "later")
    w.step()
    job = Insight(w.session, use_jit=False).explain(w.now, kind="pod", namespace="default", name="early-0")["job"]
    assert (job["state"], job["reason"]) == ("incomplete", "PodGroupNotFound")


def test_the_jobs_view_and_table_show_the_api_of_each_group() -> None:
    w = waiting_gang()
    w.pod("loner", 1)
    rows = {r["name"]: r for r in Insight(w.session, use_jit=False).jobs(w.now)["jobs"]}
    assert rows["train"]["api"] == "scheduling.k8s.io" and rows["loner"]["api"] is None
    table = jobs_table(list(rows.values())).splitlines()
    assert table[0].split()[:4] == ["NAMESPACE", "NAME", "KIND", "API"]
    assert next(line for line in table if " train " in line).split()[2:4] == ["PodGroup", "scheduling.k8s.io"]
    assert next(line for line in table if " loner " in line).split()[2:4] == ["Pod", "-"]


def test_a_name_in_two_apis_is_said_and_the_user_may_choose_the_api() -> None:
    w = Upstream()
    w.node("n0", 8)
    w.group("dup", 2)  # scheduler-plugins'
    w.pod("dup-plugins-0", 1, group="dup")
    w.upstream("dup", 1)
    w.member("dup-k8s-0", 1, "dup")
    insight = Insight(w.session, use_jit=False)
    picked = insight.explain(w.now, kind="podgroup", namespace="default", name="dup")
    assert picked["job"]["api"] == "scheduling.k8s.io"
    assert picked["alsoIn"] == ["scheduling.x-k8s.io"]
    assert any("also a PodGroup default/dup in scheduling.x-k8s.io" in line and "--api scheduling.x-k8s.io" in line
               for line in picked["summary"]), picked["summary"]
    chosen = insight.explain(w.now, kind="podgroup", namespace="default", name="dup", api="scheduling.x-k8s.io")
    assert chosen["job"]["api"] == "scheduling.x-k8s.io" and chosen["job"]["members"]["required"] == 2
    assert [p["name"] for p in chosen["pods"]] == ["dup-plugins-0"]
    with pytest.raises(NotFound) as missing:
        insight.explain(w.now, kind="podgroup", namespace="default", name="dup", api="scheduling.volcano.sh")
    assert "no PodGroup default/dup in scheduling.volcano.sh" in str(missing.value)
    assert "there is one in scheduling.k8s.io, scheduling.x-k8s.io" in str(missing.value)


@pytest.mark.parametrize(("words", "params"), [
    (["podgroup", "train"], {"kind": "podgroup", "name": "train", "namespace": "ns"}),
    (["pg", "train", "--api", "scheduling.k8s.io"],
     {"kind": "podgroup", "name": "train", "namespace": "ns", "api": "scheduling.k8s.io"}),
    (["podgroups.scheduling.k8s.io", "train"],
     {"kind": "podgroup", "name": "train", "namespace": "ns", "api": "scheduling.k8s.io"}),
    (["podgroup.scheduling.x-k8s.io", "train"],
     {"kind": "podgroup", "name": "train", "namespace": "ns", "api": "scheduling.x-k8s.io"}),
])
def test_the_explain_command_sends_the_api_the_user_names(monkeypatch, words: list[str], params: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    from batchsched import viewcli
    from batchsched.kube import viewclient

    asked: list[dict[str, str]] = []

    async def credentials(_: Any) -> str:
        return "creds"

    async def read_view(_creds: Any, _server: str, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        asked.append(dict(query or {}))
        return {"summary": []}

    async def find_server(_creds: Any, **given: Any) -> str:  # the address and CA, from the Lease
        return str(given["server"])

    monkeypatch.setattr(viewclient, "credentials", credentials)
    monkeypatch.setattr(viewclient, "find_server", find_server)
    monkeypatch.setattr(viewclient, "read_view", read_view)
    parser = argparse.ArgumentParser()
    viewcli.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["explain", *words, "-n", "ns", "--server", "https://s"])
    assert viewcli.main(args) == 0
    assert asked == [params]


def test_the_command_knows_the_apis_the_views_pick_from_and_the_web_view_shows_a_jobs_api() -> None:
    from batchsched import viewcli
    from batchsched.insight.views import API_ORDER
    from tests.unit.test_web_assets import SCRIPT

    assert viewcli._APIS == API_ORDER
    assert "j.api" in SCRIPT  # the job's name cell says its API in its title
