"""Parsing: quantities, pod requests by kube-scheduler's rules, and the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchsched.config import ConfigError, load_config, parse_config
from batchsched.core.model import parse_node, parse_pod
from batchsched.core.quantity import QuantityError, format_units, to_units
from tests.builders import make_node, make_pod


@pytest.mark.parametrize(
    ("resource", "text", "units"),
    [
        ("cpu", "500m", 500),
        ("cpu", "2", 2000),
        ("cpu", "0.1", 100),
        ("cpu", "1e3", 1_000_000),
        ("cpu", "1n", 1),  # rounds up, like MilliValue()
        ("memory", "1Gi", 2**30),
        ("memory", "1G", 10**9),
        ("memory", "128974848", 128974848),
        ("memory", "129e6", 129_000_000),
        ("memory", "123Mi", 123 * 2**20),
        ("nvidia.com/gpu", "8", 8),
        ("memory", "1.5Ki", 1536),
    ],
)
def test_quantities(resource: str, text: str, units: int) -> None:
    assert to_units(resource, text) == units


@pytest.mark.parametrize("text", ["", "lots", "1.2.3", "5Xi", "1e3Mi", "--1"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(QuantityError):
        to_units("memory", text)


def test_format_units() -> None:
    assert format_units("cpu", 2500) == "2.5"
    assert format_units("memory", 3 * 2**30) == "3Gi"
    assert format_units("nvidia.com/gpu", 4) == "4"


def test_pod_requests_sum_containers_and_take_init_max() -> None:
    pod = (
        make_pod("p")
        .container(cpu="1", memory="1Gi")
        .container(cpu="500m", memory="1Gi", gpu=1)
        .init_container(cpu="2", memory="512Mi")
        .build()
    )
    # and the card columns of its one whole nvidia.com/gpu card (batchsched.core.devices)
    assert pod.requests == {"cpu": 2000, "memory": 2 * 2**30, "nvidia.com/gpu": 1, "pods": 1,
                            "batchsched.io/gpu": 1000, "batchsched.io/ask-any-cards": 1,
                            "batchsched.io/card-any": 1}


def test_sidecars_add_to_the_sum_and_to_later_init_containers() -> None:
    pod = (
        make_pod("p")
        .container(cpu="1")
        .init_container(cpu="500m", sidecar=True)
        .init_container(cpu="3")
        .build()
    )
    # steady state 1 + 0.5; the second init container needs 3 + the sidecar's 0.5
    assert pod.requests["cpu"] == 3500


def test_overhead_and_pod_level_resources() -> None:
    pod = make_pod("p").container(cpu="1", memory="1Gi").overhead(cpu="250m").build()
    assert pod.requests["cpu"] == 1250
    pod = make_pod("p").container(cpu="1").pod_requests(cpu="4").build()
    assert pod.requests["cpu"] == 4000


def test_unreadable_quantity_marks_the_pod_invalid_instead_of_raising() -> None:
    obj = make_pod("p").obj()
    obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "a lot"}}
    pod = parse_pod(obj)
    assert pod.invalid and "a lot" in pod.invalid


def test_node_parsing() -> None:
    node = parse_node(make_node("n").cap(cpu="8", memory="32Gi", gpu=8).taint("a", "b", "NoExecute").unschedulable().obj())
    assert node.allocatable["cpu"] == 8000 and node.allocatable["nvidia.com/gpu"] == 8
    assert node.unschedulable and node.ready and node.taints[0].key == "a"


def test_default_config_is_the_shipped_file() -> None:
    shipped = load_config(Path(__file__).parents[2] / "config" / "batchsched.yaml")
    assert shipped == parse_config(None)
    assert shipped.scoring_config().resources == (("nvidia.com/gpu", 1), ("batchsched.io/gpu", 1))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"binder": {"concurency": 3}}, "unknown key 'binder.concurency'"),
        ({"binder": {"concurrency": 0}}, "binder.concurrency: must be greater than 0"),
        ({"binder": {"concurrency": "many"}}, "binder.concurrency: expected a whole number"),
        ({"scoring": {"type": "Random"}}, "scoring strategy 'Random'"),
        ({"scoring": {"shape": [{"utilization": 50, "score": 1}, {"utilization": 10, "score": 2}]}}, "increase strictly"),
        ({"scoring": {"resources": [{"name": "nvidia.com/gpu", "weight": 0}]}}, "weight"),
        ({"schedulerNames": []}, "schedulerNames"),
        ({"leaderElection": {"renewDeadlineSeconds": 30}}, "retryPeriodSeconds < renewDeadlineSeconds"),
        ({"metricsAddress": "nowhere"}, "metricsAddress"),
        ({"status": {"scheduledEvents": "yes"}}, "expected true or false"),
        ({"topology": {"levels": "batchsched.io/rack"}}, "topology.levels: expected a list"),
        ({"topology": {"levels": []}}, "topology.levels: topology needs at least one level"),
        ({"topology": {"levels": ["a.io/rack", "b.io/rack"]}}, "topology.levels: topology levels need distinct names"),
        ({"topology": {"levels": ["a.io/"]}}, "topology.levels: topology level keys must not be empty"),
        ({"topology": {"levels": [3]}}, "topology.levels[0]: expected a string"),
        ({"gpuSharing": {"band": -1}}, "gpuSharing.band -1 is not between 0 and 100000"),
        ({"gpuSharing": {"cpuShort": 150}}, "gpuSharing.cpuShort 150 is not between 0 and 100"),
        ({"gpuSharing": {"band": "wide"}}, "gpuSharing.band: expected a whole number"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(data: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    message = str(err.value)
    assert fragment in message and "\n" not in message


def test_topology_levels_come_from_the_config() -> None:
    assert parse_config(None).topology_levels().names == ("rack", "block")
    levels = parse_config({"topology": {"levels": ["example.com/switch", "example.com/pod"]}}).topology_levels()
    assert levels.keys == ("example.com/switch", "example.com/pod")
    assert levels.names == ("switch", "pod")


def test_unreadable_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("scoring: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_run_with_a_bad_config_is_a_one_line_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "c.yaml"
    cfg.write_text("cycle:\n  retryUnschedulableSeconds: -5\n")
    result = subprocess.run(
        [sys.executable, "-m", "batchsched", "run", "--kubeconfig", "/nonexistent", "--config", str(cfg)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "batchsched: error: config: cycle.retryUnschedulableSeconds: must be greater than 0, got -5.0"
    ]
