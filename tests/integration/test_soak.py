"""The soak run at CI size: batchsched as a process for a few minutes of steady arrivals.

The same code as ``python -m perf soak`` (``perf/soak.py``), on 50 nodes of the session's
sandbox for 90 s of arrivals (run times of 5-20 s, so thousands of binds and deletions
pass), then a drain. It asserts the soak's verdict, which reads the apiserver's state and
``/proc``: after the warm-up the scheduler's RSS, fds and TCP sockets stay within their
bounds, no unit that fits the free capacity waits longer than the bound, no node is ever
over-committed, the scheduler never exits, and every job that arrived completed, was
preempted (with its ``DisruptionTarget`` condition) or still waits with the scheduler's
reason; none is lost or left partly bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batchsched.kube.client import KubeClient

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

NODES = 50


async def test_a_steady_stream_of_mixed_jobs_leaves_no_growth_and_no_stuck_unit(
    sandbox, kube: KubeClient, namespace: str, make_nodes, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from perf.soak import SoakSize, markdown, soak_on
    from perf.suite import write_json
    from perf.workload import NodeSpec

    node = NodeSpec()
    names = await make_nodes(count=NODES, prefix=namespace, gpus=node.gpus, cpu=node.cpu, memory=node.memory,
                             max_pods=node.max_pods)
    size = SoakSize(nodes=NODES, minutes=1.5, min_duration=5, max_duration=20, sample=2.0)
    apiserver = next((p.pid for p in sandbox.processes if p.name == "kube-apiserver"), None)
    data = await soak_on(size=size, kubeconfig=sandbox.kubeconfig, nodes=names, pool=namespace, node=node,
                         namespace=namespace, tag=namespace, workdir=tmp_path, apiserver_pid=apiserver,
                         log=print)
    write_json(tmp_path / "soak.json", data)
    report = markdown(data)
    print(report)

    failed = [c for c in data["checks"] if not c["ok"]]
    assert not failed, report
    acc = data["accounting"]
    # the stream was real: hundreds of jobs of every kind came, ran and were deleted
    assert acc["jobs"] >= 200, report
    assert set(acc["by_kind"]) == {"single", "multi", "gang", "share", "cpu", "urgent"}, report
    assert acc["outcomes"].get("completed", 0) >= 0.8 * acc["jobs"], report
    assert data["summary"]["series"]["gpus_allocated_percent"]["median"] >= 50, report
    # sampled throughout, every series readable
    assert len(data["samples"]) >= size.minutes * 60 / size.sample * 0.8, report
    assert all(s["rss_mib"] and s["fds"] and s["tcp"] is not None for s in data["samples"]), report
