"""``python -m perf world``: the scenario worlds of ``tests/world.py``, longer and wider than CI.

Runs ``--seeds`` worlds of ``--steps`` steps each through the scheduling session, prints per
world what it checked and did, then every broken invariant with the line that replays it
(``seed=S step=N [check] ...``). ``--known`` turns on the checks of defects being fixed
(never, held, restart, placed-evicted); ``--features`` turns on the world features that
exercise them (min_resources, never, holds, whole_job_restart). Exit status 1 when anything
broke.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import fields

from tests.world import ALL_KNOWN, Checks, Features, World

FEATURE_FLAGS = tuple(f.name for f in fields(Features) if f.type in (bool, "bool"))


def run(*, steps: int, seeds: int, first: int, known: list[str], features: list[str], starvation: int,
        log: Callable[[str], None] = print) -> int:
    unknown = (set(known) - ALL_KNOWN) | (set(features) - set(FEATURE_FLAGS))
    if unknown:
        log(f"unknown checks or features: {sorted(unknown)}; checks: {sorted(ALL_KNOWN)}; "
            f"features: {', '.join(FEATURE_FLAGS)}")
        return 2
    feats = Features(**{name: True for name in features})
    checks = Checks(known=frozenset(known), starvation_steps=starvation)
    found: list[str] = []
    by_check: Counter[str] = Counter()
    for seed in range(first, first + seeds):
        w = World(seed, feats, checks)
        violations = w.run(steps)
        log(w.summary())
        for v in violations:
            by_check[v.check] += 1
            found.append(str(v))
    log(f"{seeds} worlds of up to {steps} steps; features {features or 'default'}; known checks "
        f"{known or 'off'}")
    if not found:
        log("nothing broke")
        return 0
    log(f"broken: {dict(by_check)}")
    for line in found:
        log(f"  {line}")
    return 1
