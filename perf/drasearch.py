"""How much work the DRA device search does on drawn worlds: device checks per node search.

Each world (:mod:`tests.dra_worlds`, the drawing the sandbox's differential test uses
against kube-scheduler) is one or two GPU nodes published as NVIDIA's driver publishes
them and one pod of one or two claims; every node is searched, with the real CEL
evaluator and no bound on the checks. Printed: how many searches allocated, the most
checks any search took (and any that allocated), how many would have passed the default
bound, and the total; ``--plain`` searches without pruning too, to compare, and says
whether both found the same devices wherever the plain one ended (it gives up at 2,000,000
checks). Figures, not times.

    python -m perf.drasearch --seeds 100 [--first 0] [--worlds 20] [--plain]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any
from unittest import mock

from batchsched.core.dra import allocator
from batchsched.core.dra.objects import (
    Pools,
    parse_device_class,
    parse_resource_claim,
    parse_resource_slice,
)
from batchsched.sandbox import gpudra
from tests.dra_worlds import draw

UNBOUNDED = 10**8
#: the plain search's own bound: without pruning, a few worlds would run for hours
PLAIN_BOUND = 2_000_000


def _search(claims: list[Any], devices: Any, classes: dict[str, Any], plain: bool) -> tuple[int, Any]:
    """The outcome of one node search and the device checks it made."""
    made: list[int] = []
    real = allocator._Search.claim

    def first(search: Any, ci: int, ri: int) -> bool:
        out = real(search, ci, ri)
        if (ci, ri) == (0, 0):
            made.append(search.steps)
        return out

    with mock.patch.object(allocator._Search, "claim", first), \
            mock.patch.object(allocator, "PLAIN_STEPS", UNBOUNDED if plain else allocator.PLAIN_STEPS):
        out = allocator.allocate(claims, devices=devices, classes=classes, in_use=allocator.InUse(),
                                 max_steps=PLAIN_BOUND if plain else UNBOUNDED, new_share_id=lambda: "share")
    if made:
        return made[-1], out
    # no search: the claims failed before it (a class missing, too many devices), or it
    # stopped at its bound
    gave_up = isinstance(out, allocator.Unallocatable) and out.reason.startswith("gave up after")
    return (PLAIN_BOUND if plain else UNBOUNDED) if gave_up else 0, out


def _devices(out: Any) -> Any:
    if isinstance(out, allocator.Allocated):
        return [[(r["request"], r["device"]) for r in c.allocation["devices"]["results"]] for c in out.claims]
    return None


def measure(first: int, seeds: int, worlds: int, plain: bool) -> dict[str, Any]:
    classes = {c.name: c for c in (parse_device_class(o) for o in gpudra.device_classes())}
    checks: list[tuple[int, bool]] = []
    plain_checks: list[int] = []
    differ = 0
    for seed in range(first, first + seeds):
        rng = random.Random(seed)
        for i in range(worlds):
            world = draw(rng, i)
            pools = Pools(parse_resource_slice(s) for s in world.slices("b"))
            claims = [parse_resource_claim({"metadata": {"name": c.key, "namespace": "ns", "uid": c.key},
                                            "spec": c.spec()}) for c in world.claims]
            for node in world.node_names("b"):
                devices = pools.for_node(node, {})
                n, out = _search(claims, devices, classes, plain=False)
                checks.append((n, isinstance(out, allocator.Allocated)))
                if plain:
                    m, was = _search(claims, devices, classes, plain=True)
                    plain_checks.append(m)
                    # a plain search that gave up found nothing to compare
                    differ += m < PLAIN_BOUND and _devices(out) != _devices(was)
    allocated = [n for n, ok in checks if ok]
    result: dict[str, Any] = {
        "seeds": [first, first + seeds], "worlds": seeds * worlds, "node_searches": len(checks),
        "allocated": len(allocated), "most_checks": max(n for n, _ in checks),
        "most_checks_allocated": max(allocated, default=0), "total_checks": sum(n for n, _ in checks),
        "over_default_bound": sum(n > allocator.DEFAULT_MAX_STEPS for n, _ in checks),
        "default_bound": allocator.DEFAULT_MAX_STEPS, "prunes_after": allocator.PLAIN_STEPS,
    }
    if plain:
        result.update(plain_most_checks=max(plain_checks), plain_total_checks=sum(plain_checks),
                      plain_over_default_bound=sum(m > allocator.DEFAULT_MAX_STEPS for m in plain_checks),
                      plain_gave_up_at=PLAIN_BOUND, plain_gave_up=sum(m >= PLAIN_BOUND for m in plain_checks),
                      searches_finding_other_devices=differ)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.drasearch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--first", type=int, default=0, help="the first seed")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--worlds", type=int, default=20, help="worlds drawn per seed")
    ap.add_argument("--plain", action="store_true", help="search without pruning too, to compare")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.first, args.seeds, args.worlds, args.plain), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
