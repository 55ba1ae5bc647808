"""dra-gpu through the Session alone (no apiserver), its first steps under cProfile.

The nodes, slices, claims and pods of the workload at one size are fed to the session the
way ``tests/unit/test_dra_scheduling.py``'s ``DraWorld`` does (each claim write and Binding
applied at once and seen again as an event, placement by the plain-Python twins); prints
each step's time and binds, then the functions by own and by cumulative time. Run from a
work tree: ``PYTHONPATH=. python perf/reports/2026-11-26-dra/inprocess.py 800x4000``.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from batchsched.core.dra.objects import parse_resource_slice
from batchsched.core.model import parse_node
from batchsched.sandbox import gpudra
from perf import dra
from perf.workload import GPU_PRODUCT, MIG_PRODUCT, expand, load_workload, mig_node
from tests.builders import make_node
from tests.unit.test_dra_scheduling import DraWorld


def main(size: str, steps: int = 6) -> None:
    ex = expand(load_workload("dra-gpu"), size)
    w = DraWorld()
    nodes, slices = [], []
    for i in range(ex.size.nodes):
        name = f"gpu-node-{i:05d}"
        nodes.append(parse_node(make_node(name).cap(cpu="96", memory="1024Gi").obj()))
        mig = mig_node(i, ex.workload.node.mig_share)
        for s in gpudra.gpu_node_slices(name, mig="partitionable" if mig else "none",
                                        product=MIG_PRODUCT if mig else GPU_PRODUCT):
            slices.append(parse_resource_slice(s))
    w.session.on_nodes_listed(nodes)
    w.session.on_resource_slices_listed(slices)
    for p in ex.pods:
        selector = dra.mig_selector(p.mig_profile) if p.mig_profile else dra.product_selector(GPU_PRODUCT)
        w.claim(f"{p.name}-gpu", 1 if p.mig_profile else p.gpus, device_class=p.device_class,
                selectors=[{"cel": {"expression": selector}}])
        w.pod(p.name, f"{p.name}-gpu")
    prof = cProfile.Profile()
    prof.enable()
    timed, bound = [], 0
    for _ in range(steps):
        t0 = time.perf_counter()
        d = w.step()
        bound += len(d.binds)
        timed.append((round(time.perf_counter() - t0, 2), len(d.binds)))
        if bound >= len(ex.pods):
            break
    prof.disable()
    print("steps (seconds, binds):", timed, "bound", bound, "of", len(ex.pods))
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumtime").print_stats(30)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "800x4000")
