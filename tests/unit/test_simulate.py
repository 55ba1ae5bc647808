"""The replay simulator: the FGD method's workload, and the production session driven on it."""

from __future__ import annotations

import random

from batchsched.simulate import fragmentation
from batchsched.simulate.engine import Simulation
from batchsched.simulate.openb import Task, TraceNode


def nodes(n: int) -> list[TraceNode]:
    return [TraceNode(f"node-{i:03d}", 32000, 131072, 4 if i % 2 else 8, "T4" if i % 3 else "V100")
            for i in range(n)]


def tasks(n: int, seed: int = 1) -> list[Task]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choice(["share", "share", "one", "two", "cpu"])
        milli = rng.choice([250, 500, 810]) if kind == "share" else 1000
        gpus = {"share": 1, "one": 1, "two": 2, "cpu": 0}[kind]
        spec = ("V100",) if rng.random() < 0.1 and gpus else ()
        out.append(Task(f"t-{i:04d}", rng.choice([1000, 4000, 8000]), 4096, gpus, milli, spec, 0.0, 0.0))
    return out


def test_the_workload_is_inflated_until_the_next_draw_would_pass_the_load() -> None:
    ts = tasks(100)
    capacity = sum(t.gpu_request for t in ts)  # they ask for 100%: copies make up the rest
    order = fragmentation.workload(ts, capacity, 1.3, seed=42)
    asked = sum(t.gpu_request for t in order)
    assert asked <= 1.3 * capacity < asked + max(t.gpu_request for t in ts)
    assert sorted(t.name for t in order[: len(ts)]) == sorted(t.name for t in ts)  # originals first
    assert order == fragmentation.workload(ts, capacity, 1.3, seed=42)  # one seed, one order
    thinned = fragmentation.workload(ts, 1000, 1.3, seed=42)
    assert sum(t.gpu_request for t in thinned) <= 1300


def test_a_fragmentation_run_allocates_what_fits_and_never_overfills_a_card() -> None:
    ns, ts = nodes(20), tasks(120)  # 120 cards; the tasks ask for less: copies are added
    for policy in ("fragmentation", "binpack"):
        curve = fragmentation.run(ns, ts, policy=policy, seed=42, load=1.3, batch=16)
        assert len(curve.arrived) == len(curve.allocated) > len(ts)
        assert all(a <= b + 1e-9 for a, b in zip(curve.allocated, curve.arrived, strict=True))
        assert curve.arrived[-1] > 100 and 60 < curve.allocated[-1] <= 100
        assert curve.failed > 0  # 130% of the cards cannot all fit
        at = curve.at(100)
        assert at is not None and 60 < at <= 100


def test_the_simulation_binds_as_the_session_decides_and_keeps_its_books() -> None:
    sim = Simulation(fragmentation.settings_for("binpack"))
    sim.add_nodes(n.manifest() for n in nodes(2))
    for i, t in enumerate(tasks(30, seed=3)):
        sim.add_pod(t.manifest(f"p{i}", created=float(i)))
    d = sim.step(0.0)
    assert {b.uid for b in d.binds} == set(sim.placed)
    state = sim.session.state
    state.check()
    for uid, placed in sim.placed.items():
        assert state.pods[uid].node_name == placed.node  # the watch's view: bound there
        if state.pods[uid].card_asks and not state.pods[uid].card_asks[0].anywhere:
            assert state.pods[uid].cards == placed.cards  # read back from the annotations


def test_a_time_replay_runs_tasks_for_their_duration_and_frees_their_cards() -> None:
    from batchsched.simulate import replay

    ns = nodes(2)  # 12 cards
    ts = [Task(f"t{i}", 1000, 1024, 4, 1000, (), created=float(i), deleted=float(i) + 100.0) for i in range(6)]
    r = replay.run(ns, ts, policy="binpack", retry=10.0)
    assert r.never_placed == 0 and len(r.waits["4gpu"]) == 6
    waits = sorted(r.waits["4gpu"])
    assert waits[:3] == [0.0, 0.0, 0.0] and all(w > 50 for w in waits[3:])  # 3 fit at once, 3 wait
    assert r.peak_allocation() == 100.0 and r.allocation[-1][1] == 0.0  # everything ended


def test_a_scenario_replays_gangs_and_queues_on_a_virtual_clock() -> None:
    from batchsched.simulate import scenario

    doc = {
        "config": {"gpuSharing": {"policy": "binpack"}},
        "nodes": [{"prefix": "gpu", "count": 2, "gpus": 8, "cpu": 64}],
        "queues": [{"name": "team-a", "resources": {"nvidia.com/gpu": {"nominal": 8}}}],
        "jobs": [
            {"name": "big", "at": 0, "duration": 100, "pods": 2, "gpus": 4, "minMember": 2, "queue": "team-a"},
            {"name": "second", "at": 10, "duration": 100, "pods": 2, "gpus": 4, "minMember": 2, "queue": "team-a"},
            {"name": "share", "at": 20, "duration": 50, "core": 50},
        ],
    }
    r = scenario.run(doc)
    big, second, share = r.jobs["big"], r.jobs["second"], r.jobs["share"]
    assert big.wait == 0 and share.wait == 0
    # team-a's quota is 8 cards: its second gang waits for the first to end at t=100
    assert second.started == 100 and second.wait == 90
    assert second.ended == 200 and share.ended == 70
    assert max(u.get("team-a", 0) for _, u in r.usage) == 8


def test_the_example_scenario_runs_through_the_command(capsys) -> None:  # type: ignore[no-untyped-def]
    import json
    from pathlib import Path

    from batchsched.cli import main

    example = Path(__file__).parents[2] / "config" / "scenario-example.yaml"
    assert main(["simulate", "--scenario", str(example), "-o", "json"]) == 0
    jobs = {j["job"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert set(jobs) == {"a-pretrain", "a-sweep", "b-finetune", "notebooks", "inference"}
    assert all(j["started"] is not None for j in jobs.values())
    # team-b reclaims the GPUs team-a borrowed: its gang does not wait for team-a's work to end
    assert jobs["b-finetune"]["started"] < jobs["a-pretrain"]["ended"]
    assert jobs["b-finetune"]["wait"] < 120
    assert jobs["a-sweep"]["evictions"] == 1  # the borrowed GPUs it held were reclaimed
    assert jobs["a-sweep"]["started"] >= jobs["b-finetune"]["started"]  # it restarted later
    # the DRA node's 4 GPUs, two 3g.20gb MIG partitions each, hold the inference gang of 8 whole
    assert jobs["inference"]["wait"] == 0


def test_every_openb_variant_loads() -> None:
    import pytest

    from batchsched.simulate import experiment, openb

    try:
        d = experiment.trace_dir(None)
    except FileNotFoundError:
        pytest.skip("the openb trace is not beside the project (../shared/traces/openb)")
    nodes = openb.read_nodes(d / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    for path in sorted(d.glob("openb_pod_list_*.csv")):
        tasks = openb.read_tasks(path)
        assert tasks and all(t.num_gpu >= 0 and 0 <= t.gpu_milli <= 1000 for t in tasks), path.name
        manifests = [t.manifest(f"u{i}") for i, t in enumerate(tasks[:50])]
        assert all(m["spec"]["containers"] for m in manifests)
