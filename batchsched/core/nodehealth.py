"""GPU node health as IBM Autopilot reports it: a node label (``autopilot.ibm.com/gpuhealth``)
whose value says how the node's GPUs tested.

The rule, applied where nodes and pods come in (:class:`~batchsched.core.session.Session`):

- a node whose value is one of ``no_gpu_work`` (``ERR``, ``TESTING``, ``EVICT``) takes no new
  GPU work: it gets the taint ``<label>=<value>:NoSchedule``;
- a node whose value is one of ``lower_score`` (``WARN``) is less preferred for it: the
  taint ``<label>=<value>:PreferNoSchedule`` (the TaintToleration score);
- a pod that asks for no GPU tolerates those taints, so CPU work still goes there;
- running work with a pod on a node whose value is one of ``evict`` (``EVICT``) is evicted
  whole by the session, so a gang restarts elsewhere;
- the GPUs left free on nodes that take no new GPU work are capacity lost, in every GPU
  resource a quota may name: where the root queues' nominal add up to more than the rest,
  their nominal shrinks
  (:func:`sick_rows`, :func:`lost_gpus`, :meth:`~batchsched.core.queues.tree.QueueTree.withhold`), as a
  "slack" queue kept by hand would do.

So the filters, scores and messages that already handle taints handle health too: a GPU pod
told ``untolerated taint autopilot.ibm.com/gpuhealth=ERR`` knows why a node was left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from batchsched.core.devices import gpu_column
from batchsched.core.model import Node, Pod, Taint, Toleration

__all__ = ["HEALTH_LABEL", "NodeHealthSettings", "lost_gpus", "sick_rows", "tolerating_health", "with_health"]

HEALTH_LABEL = "autopilot.ibm.com/gpuhealth"


@dataclass(slots=True, frozen=True)
class NodeHealthSettings:
    """The ``nodeHealth`` section of the config (empty ``label``: off)."""

    label: str = HEALTH_LABEL
    no_gpu_work: tuple[str, ...] = ("ERR", "TESTING", "EVICT")
    lower_score: tuple[str, ...] = ("WARN",)
    evict: tuple[str, ...] = ("EVICT",)

    def value(self, node: Node) -> str:
        return node.labels.get(self.label, "") if self.label else ""

    def evicts(self, node: Node) -> bool:
        return bool(self.label) and self.value(node) in self.evict


def with_health(node: Node, settings: NodeHealthSettings) -> Node:
    """``node`` with the taint its health label calls for (none when healthy)."""
    value = settings.value(node)
    if not value:
        return node
    effect = "NoSchedule" if value in settings.no_gpu_work else "PreferNoSchedule" if value in settings.lower_score else ""
    if not effect:
        return node
    taint = Taint(key=settings.label, value=value, effect=effect)
    if taint in node.taints:
        return node
    return dataclasses.replace(node, taints=(*node.taints, taint))


def asks_gpu(pod: Pod) -> bool:
    return bool(pod.card_asks)


def tolerating_health(pod: Pod, settings: NodeHealthSettings) -> Pod:
    """A pod that asks for no GPU, with a toleration of the health taints (GPU pods as they are)."""
    if not settings.label or asks_gpu(pod):
        return pod
    toleration = Toleration(key=settings.label, operator="Exists")
    if toleration in pod.tolerations:
        return pod
    return dataclasses.replace(pod, tolerations=(*pod.tolerations, toleration))


def sick_rows(settings: NodeHealthSettings, nodes: Sequence[Node]) -> npt.NDArray[np.intp]:
    """The positions in ``nodes`` of those that take no new GPU work."""
    if not settings.label:
        return np.zeros(0, dtype=np.intp)
    sick = settings.no_gpu_work
    return np.fromiter((i for i, n in enumerate(nodes) if settings.value(n) in sick), dtype=np.intp)


def lost_gpus(
    *,
    columns: Sequence[str],
    sick: npt.NDArray[np.intp],
    alloc: npt.NDArray[np.int64],
    used: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(capacity, lost)`` over ``columns``, for nodes with their rows of ``alloc`` and
    ``used``: every node's allocatable, and what is left free on the ``sick`` rows
    (:func:`sick_rows`) of every GPU column (:func:`~batchsched.core.devices.gpu_column`):
    whichever of them a quota names (whole GPUs, exact card compute, elastic GPU cores or
    memory, single cards), it loses the same cards. What runs there stays charged to its
    queue; only the free part is lost."""
    capacity = alloc.sum(axis=0) if len(alloc) else np.zeros(len(columns), dtype=np.int64)
    lost = np.zeros(len(columns), dtype=np.int64)
    gpu = np.fromiter((c for c, name in enumerate(columns) if gpu_column(name)), dtype=np.intp)
    if len(sick) and len(gpu):
        rows = np.ix_(sick, gpu)
        lost[gpu] = np.maximum(alloc[rows] - used[rows], 0).sum(axis=0)
    return capacity, lost
