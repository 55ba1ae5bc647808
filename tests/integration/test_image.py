"""The image the Deployment and the chart run, built from the Containerfile as a user would
(with buildah, daemonless; the base made from Debian's packages, no registry being reached
here: batchsched/sandbox/image.py), and checked for what a platform engineer relies on: its
name is the one the chart and the Deployment give, it runs ``batchsched`` as a user that is
not root, and a new container loads the placement kernels from the cache made when the
image was built instead of compiling them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.debian import debian_tool
from tests.integration.helpers import built

# debootstrap and the image's dependencies the first time: several minutes
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
#: counts the kernels' compilations and cache loads in a fresh container of the image
CACHE_CHECK = """
import json
from numba.core.registry import CPUDispatcher
from batchsched.core.placement import kernels
kernels.warm_up()
found = [v for v in vars(kernels).values() if isinstance(v, CPUDispatcher)]
print(json.dumps({"kernels": len(found),
                  "hits": sum(sum(d.stats.cache_hits.values()) for d in found),
                  "misses": sum(sum(d.stats.cache_misses.values()) for d in found)}))
"""


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The image, built from the repository's Containerfile."""
    from batchsched.sandbox import image as images

    debian_tool("/usr/bin/buildah", "buildah")
    debian_tool("/usr/sbin/debootstrap", "debootstrap")
    version = yaml.safe_load((ROOT / "charts" / "batchsched" / "Chart.yaml").read_text())["appVersion"]
    yield built(lambda: images.build(ROOT, version), "the image")


def test_the_image_is_the_one_the_chart_and_the_deployment_run(image: str) -> None:
    chart = yaml.safe_load((ROOT / "charts" / "batchsched" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "batchsched" / "values.yaml").read_text())
    assert image == f"localhost/{values['image']['repository']}:{chart['appVersion']}"
    deployment = next(d for d in yaml.safe_load_all((ROOT / "manifests" / "base" / "deployment.yaml").read_text())
                      if d and d["kind"] == "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image.removeprefix("localhost/")


def test_it_runs_batchsched_as_a_user_that_is_not_root(image: str) -> None:
    from batchsched.sandbox import image as images

    config = images.inspect(image)["OCIv1"]["config"]
    assert config["Entrypoint"] == ["batchsched"]
    assert config["User"] and config["User"].split(":")[0] not in ("0", "root")
    who = images.run_in(image, "id", "-u")
    assert who.returncode == 0 and who.stdout.strip() not in ("", "0"), who
    help_text = images.run_in(image, "batchsched", "run", "--help")
    assert help_text.returncode == 0 and "--config" in help_text.stdout, help_text.stderr


def test_a_new_container_loads_the_kernels_from_the_cache_made_at_build(image: str) -> None:
    from batchsched.sandbox import image as images

    done = images.run_in(image, "python3", "-c", CACHE_CHECK)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["kernels"] > 0 and counts["hits"] > 0
    assert counts["misses"] == 0, counts
