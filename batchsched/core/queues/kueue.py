"""Pods whose quota Kueue owns.

Kueue admits work against its own ClusterQueues and lets pods start by taking away their
scheduling gate; batchsched then places them (gangs, packing, topology) like any pod of
ours. What it must not do is count them twice: they are charged to no batchsched Queue
(whatever label or namespace default would name one), and, unless the config says
otherwise (``kueue.preemptible``), batchsched's preemption neither evicts them (Kueue
decides when its workloads stop) nor lets them evict others (Kueue decides what they may
take).

A pod is Kueue's when it carries one of the marks Kueue puts on the pods it manages: the
label ``kueue.x-k8s.io/managed: "true"`` (its pod integration; such a pod also waits behind
the scheduling gate ``kueue.x-k8s.io/admission`` until admitted, which batchsched honours as
any gate), or the label ``kueue.x-k8s.io/podset`` that Kueue writes into an admitted job's
pod template.
"""

from __future__ import annotations

from collections.abc import Iterable

from batchsched.core.model import Pod

__all__ = ["KUEUE_MANAGED_LABEL", "KUEUE_PODSET_LABEL", "kueue_managed"]

KUEUE_MANAGED_LABEL = "kueue.x-k8s.io/managed"
KUEUE_PODSET_LABEL = "kueue.x-k8s.io/podset"


def kueue_managed(pods: Iterable[Pod]) -> bool:
    """Whether Kueue manages these pods (any of them carries its mark)."""
    for p in pods:  # a loop, not any(): called for every unit of every cycle
        labels = p.labels
        if labels and (labels.get(KUEUE_MANAGED_LABEL) == "true" or KUEUE_PODSET_LABEL in labels):
            return True
    return False
