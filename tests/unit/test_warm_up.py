"""The kernels are compiled (or loaded from numba's cache) by :func:`kernels.warm_up`, which
the scheduler runs before it reports ready and the integration suite before its first
timed wait: after it, no cycle compiles anything.

Checked in a fresh process, where nothing else has compiled a kernel yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: warm up, then schedule what the scheduler's cycles meet (single pods, a gang that does not
#: fit and is told why, a preemption, GPU card shares): how many compiled specialisations each
#: kernel has after the warm-up, and after the cycles
SCRIPT = """
import json
from numba.core.registry import CPUDispatcher
from batchsched.core.placement import kernels

def compiled():
    return {name: len(d.signatures) for name, d in vars(kernels).items()
            if isinstance(d, CPUDispatcher) and d.targetoptions.get("inline") != "always"}

kernels.warm_up()
warm = compiled()

from batchsched.core import devices
from batchsched.core.placement.cards import CardPolicy
from batchsched.core.session import Session, SessionSettings
from tests.builders import make_group, make_pod
from tests.unit.test_session import Cluster, gpu_pod
from tests.unit.test_cards import elastic_node

s = Session(SessionSettings(gang_report_delay=0.0, cards=CardPolicy(policy="binpack")))
c = Cluster(s)
c.node("n0", 8)
s.on_node("ADDED", elastic_node("c0"))
low = c.pod(gpu_pod("low", 8, priority=0))
card = c.pod(make_pod("s0").req({"cpu": "1", devices.ELASTIC_CORE: "50"}).obj())
assert {b.uid for b in c.step().binds} == {low, card}
s.on_groups_listed("scheduling.x-k8s.io", [make_group("g").min_member(2).build()])
for i in range(2):
    c.pod(gpu_pod(f"g-{i}", 8, priority=0, group="g"))
c.pod(gpu_pod("urgent", 8, priority=100))
d = c.step(after=1.0)
assert [e.uid for e in d.evictions] == [low], d.evictions
assert any("g-" in u.ref.name for u in d.unschedulable)
print(json.dumps({"warm": warm, "after": compiled()}))
"""


def test_after_the_warm_up_every_kernel_is_compiled_and_no_cycle_compiles_another() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # what the cycle, the victim search and the explanations call (the kernels these call
    # are compiled into them, or loaded with them from the cache)
    assert {"place_members", "place_members_cached", "insufficient_counts"} <= {
        name for name, n in found["warm"].items() if n > 0}
    assert found["after"] == found["warm"]
