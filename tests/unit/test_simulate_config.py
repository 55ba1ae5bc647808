"""``batchsched simulate --config``: a configuration file replayed as ``batchsched run
--config`` applies it (the FGD method's changes on top), and ``python -m perf sim``'s rows of
configuration files and its summary across variants."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

import pytest

from batchsched.cli import main
from batchsched.simulate import experiment
from batchsched.simulate.engine import Simulation
from batchsched.simulate.fragmentation import settings_for
from batchsched.simulate.openb import Task, TraceNode

SHIPPED = Path(__file__).parents[2] / "config" / "batchsched.yaml"
POD_FIELDS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
              "creation_time", "deletion_time", "scheduled_time")


def small_trace(folder: Path) -> Path:
    """An openb-shaped trace: 16 nodes of 4 or 8 cards, 100 tasks (shares, whole cards, CPU)."""
    rng = random.Random(7)
    with (folder / "openb_node_list_gpu_node.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for i in range(16):
            w.writerow([f"node-{i:02d}", 32000, 131072, 4 if i % 2 else 8, "T4"])
    with (folder / "openb_pod_list_default.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(POD_FIELDS)
        for i in range(100):
            kind = rng.choice(["share", "share", "one", "two", "cpu"])
            gpus = {"share": 1, "one": 1, "two": 2, "cpu": 0}[kind]
            milli = rng.choice([250, 500, 810]) if kind == "share" else 1000
            w.writerow([f"t-{i:03d}", rng.choice([1000, 4000, 8000]), 4096, gpus, milli, "", "LS", "Running",
                        i, i + 100, i])
    return folder


def simulate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["simulate", *argv, "--seeds", "2", "-o", "json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def curves(doc: dict[str, Any]) -> dict[str, list[Any]]:
    """Per run name, each seed's (seed, failed, points)."""
    out: dict[str, list[Any]] = {}
    for r in doc["runs"]:
        out.setdefault(r["run"], []).append((r["seed"], r["failed"], r["points"]))
    return out


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_config_file_runs_its_own_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(small_trace(tmp_path))
    binpack = write(tmp_path / "binpack.yaml", "gpuSharing: {policy: binpack, scope: sharing}\n")
    by_file = simulate(capsys, "--trace-dir", trace, "--config", binpack, "--workers", "2")
    by_flag = simulate(capsys, "--trace-dir", trace, "--policy", "binpack", "--scope", "sharing", "--workers", "1")
    shipped = simulate(capsys, "--trace-dir", trace, "--config", str(SHIPPED), "--workers", "1")
    assert list(curves(by_file)) == ["config:binpack.yaml (binpack/sharing)"]  # the file alone, named
    assert list(curves(by_file).values()) == list(curves(by_flag).values())
    assert list(curves(shipped)) == ["config:batchsched.yaml (fragmentation/all)"]
    assert list(curves(shipped).values()) != list(curves(by_file).values())  # the policy made a difference


def test_the_scoring_of_the_file_reaches_the_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(small_trace(tmp_path))
    spread = write(tmp_path / "spread.yaml", "scoring: {type: LeastAllocated}\ngpuSharing: {scope: sharing}\n")
    packed = write(tmp_path / "packed.yaml", "gpuSharing: {scope: sharing}\n")
    shipped = simulate(capsys, "--trace-dir", trace, "--config", packed, "--workers", "1")
    least = simulate(capsys, "--trace-dir", trace, "--config", spread, "--workers", "1")
    # same card policy: whole cards are placed by the scoring strategy, and it is the file's
    assert list(curves(least)) == ["config:spread.yaml (fragmentation/sharing)"]
    assert list(curves(least).values()) != list(curves(shipped).values())


def test_policy_and_scope_flags_replace_only_those_of_the_file(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(small_trace(tmp_path))
    cfg = write(tmp_path / "c.yaml", "gpuSharing: {scope: all}\nscoring: {type: LeastAllocated}\n")
    doc = simulate(capsys, "--trace-dir", trace, "--config", cfg, "--policy", "binpack", "--policy", "spread",
                   "--workers", "1")
    assert list(curves(doc)) == ["config:c.yaml (binpack/all)", "config:c.yaml (spread/all)"]
    runs = experiment.config_runs(cfg, ["binpack"])
    assert runs[0].settings.scoring.strategy == "LeastAllocated"  # the file's, kept
    assert runs[0].settings.cards.scope == "all"


def test_a_bad_config_file_is_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path / "bad.yaml", "gpuSharing: {polcy: binpack}\n")
    assert main(["simulate", "--trace-dir", str(small_trace(tmp_path)), "--config", bad]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("batchsched: error: config: unknown key 'gpuSharing.polcy' "
                            "(known: band, cpuShort, mix, policy, scope, seed)\n")
    assert main(["simulate", "--config", str(tmp_path / "missing.yaml")]) == 1
    assert capsys.readouterr().err.startswith(f"batchsched: error: config: cannot read {tmp_path / 'missing.yaml'}:")


def test_config_with_a_scenario_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--config", str(SHIPPED), "--scenario", "x.yaml"]) == 1
    assert capsys.readouterr().err == ("batchsched: error: --config does not apply to --snapshot or --scenario: "
                                       "they carry their own configuration\n")


def test_the_time_replay_honours_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(small_trace(tmp_path))
    binpack = write(tmp_path / "binpack.yaml", "gpuSharing: {policy: binpack, scope: sharing}\nscoring: {type: LeastAllocated}\n")
    by_file = simulate(capsys, "--trace-dir", trace, "--mode", "replay", "--config", binpack, "--arrival-speedup", "20")
    by_flag = simulate(capsys, "--trace-dir", trace, "--mode", "replay", "--policy", "binpack", "--scope", "sharing",
                       "--arrival-speedup", "20")
    [row] = by_file["runs"]
    assert row["run"] == "config:binpack.yaml (binpack/sharing)"
    # the same policy, but the file's scoring spreads whole cards: another time line
    assert row["peak_allocation"] > 0
    assert (row["mean_allocation"], row["wait_s"]) != (by_flag["runs"][0]["mean_allocation"],
                                                       by_flag["runs"][0]["wait_s"])


def test_the_shipped_config_is_what_the_default_does_on_openb(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        experiment.trace_dir(None)
    except FileNotFoundError:
        pytest.skip("the openb trace is not beside the project (../shared/traces/openb)")
    common = ("--variant", "default", "--load", "0.15", "--workers", "1")
    shipped = simulate(capsys, "--config", str(SHIPPED), *common)
    default = simulate(capsys, "--policy", "fragmentation", "--scope", "all", *common)
    assert list(curves(shipped)) == ["config:batchsched.yaml (fragmentation/all)"]
    assert list(curves(shipped).values()) == list(curves(default).values())
    assert 9.5 < shipped["summary"]["config:batchsched.yaml (fragmentation/all)"]["10"][0] <= 10.5


def test_a_pod_asking_for_a_gpu_model_goes_only_to_nodes_of_that_model() -> None:
    # gpuspec33's gpu_spec: "V100M16|V100M32" and the like, as a required node affinity
    nodes = [TraceNode("t4-a", 64000, 262144, 8, "T4"), TraceNode("t4-b", 64000, 262144, 8, "T4"),
             TraceNode("v100", 64000, 262144, 2, "V100M32")]
    sim = Simulation(settings_for("fragmentation"))
    sim.add_nodes(n.manifest() for n in nodes)
    asks = [Task(f"v-{i}", 1000, 1024, 1, 1000, ("V100M16", "V100M32"), 0.0, 0.0) for i in range(4)]
    asks.append(Task("any", 1000, 1024, 1, 1000, (), 0.0, 0.0))
    for i, t in enumerate(asks):
        sim.add_pod(t.manifest(t.name, created=float(i)))
    sim.step(0.0)
    # two of the four fit on the V100 node's two cards; the T4 cards take only the pod asking for none
    assert sorted(uid for uid, p in sim.placed.items() if p.node == "v100") == ["v-0", "v-1"]
    assert {uid: p.node for uid, p in sim.placed.items() if p.node != "v100"}.keys() == {"any"}


def test_perf_sim_summary_has_a_row_per_run_and_a_column_per_variant(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from perf import simbench

    trace = small_trace(tmp_path)
    (trace / "openb_pod_list_gpuspec33.csv").write_text((trace / "openb_pod_list_default.csv").read_text())
    cfg = write(tmp_path / "binpack.yaml", "gpuSharing: {policy: binpack, scope: sharing}\n")
    simbench.run(tmp_path / "out", ["default", "gpuspec33"], 1, 1.3, str(trace), log=lambda *_: None,
                 configs=[cfg])
    folder = tmp_path / "out" / "sim"
    for name in ("default.md", "default.png", "default.json", "gpuspec33.md", "summary.md", "summary.json"):
        assert (folder / name).exists(), name
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["arrived_pct"] == 130 and summary["variants"] == ["default", "gpuspec33"]
    names = [r["run"] for r in summary["rows"]]
    ours = [f"batchsched {a}/{b}" for a, b in simbench.POLICIES] + ["batchsched config:binpack.yaml (binpack/sharing)"]
    assert names[:len(ours)] == ours
    assert names[len(ours)] == "FGD paper: FGD"  # the paper's, FGD first
    binpack = {r["run"]: r["cells"] for r in summary["rows"]}
    # the file's binpack is the default configuration's binpack: the same figure
    assert binpack["batchsched config:binpack.yaml (binpack/sharing)"] == binpack["batchsched binpack/sharing"]
    assert binpack["FGD paper: FGD"]["gpuspec33"][0] == pytest.approx(94.547)
    md = (folder / "summary.md").read_text()
    assert "batchsched config:binpack.yaml (binpack/sharing)" in md and "gpuspec33" in md
