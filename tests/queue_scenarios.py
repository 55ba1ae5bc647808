"""Declarative queue scenarios (``tests/scenarios/queue-*.yaml``): nodes, queues, running
and pending work -> expected admissions, placements, evictions and reasons.

They run through the real :meth:`batchsched.core.cycle.Cycle.run`, with the pods, groups,
queues, namespaces and PodDisruptionBudgets as objects in the mirror
(``tests/unit/test_queue_cycle.py``). This module holds what the tests share: the list of
files and the translation of a scenario's flattened specs into API objects.

A scenario file::

    now: 10000                       # seconds; the clock the policy sees
    nodes: [{name: n1, gpu: 8}]      # cpu 64 and memory 256Gi unless given
    queues:                          # the Queue spec, flattened: resources by name
      - {name: org}
      - {name: a, parent: org, resources: {nvidia.com/gpu: {nominal: 8}}}
    namespaces: {ml: {batchsched.io/default-queue: a}}   # namespace labels (optional)
    defaultQueue: a                  # the configured default (optional)
    maxWait: 3600                    # the aging bound (optional)
    running:                         # each pod: node, gpu, elastic (extra beyond quorum)
      - {name: r, queue: a, priority: 0, start: 0, pods: [{node: n1, gpu: 8}], labels: {app: r}}
    pdbs:                            # PodDisruptionBudgets (namespace default unless given)
      - {name: keep-r, selector: {app: r}, disruptionsAllowed: 0}
    pending:                         # pods: a count (with gpu: per pod) or a list
      - {name: p, queue: a, priority: 5, created: 10, pods: 2, gpu: 4, minMember: 2}
    expect:
      admitted: {p: [n1, n1]}        # placed now: member -> node
      nominated: {p: [n1]}           # placed by preemption: quorum -> held node
      evicted: {r: whole}            # or the evicted pod names: [r-1, r-2]
      pending: {p: "substring of the reason"}
      problems: {p: "substring of the queue problem"}
      order: [p, q]                  # the order units were tried (optional)

``queue:`` sets the ``batchsched.io/queue`` label; ``podGroupQueue:`` and ``namespace:`` are
the other sources of a queue. Every pending unit must appear in exactly one of admitted,
nominated, pending or problems.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("queue-*.yaml"))


def queue_object(spec: dict[str, Any]) -> dict[str, Any]:
    """A Queue object from its flattened spec (``resources`` keyed by resource name)."""
    body: dict[str, Any] = {k: v for k, v in spec.items() if k not in ("name", "resources")}
    if "resources" in spec:
        body["resources"] = [{"name": name, **values} for name, values in spec["resources"].items()]
    return {"apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": spec["name"]}, "spec": body}


def pod_specs(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs of a running or pending unit: ``pods`` is a count or a list."""
    pods = unit.get("pods", 1)
    if isinstance(pods, int):
        return [{k: v for k, v in unit.items() if k in ("gpu", "cpu", "memory")} for _ in range(pods)]
    return list(pods)


def pdb_object(spec: dict[str, Any]) -> dict[str, Any]:
    """A PodDisruptionBudget object (selector and ``status.disruptionsAllowed``)."""
    return {"metadata": {"name": spec["name"], "namespace": spec.get("namespace", "default")},
            "spec": {"selector": {"matchLabels": spec.get("selector", {})}},
            "status": {"disruptionsAllowed": spec.get("disruptionsAllowed", 0)}}
