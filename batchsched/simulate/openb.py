"""The openb GPU-cluster trace (Alibaba, ATC'23 "Beware of Fragmentation") as Kubernetes objects.

Nodes (``sn, cpu_milli, memory_mib, gpu, model``) become nodes offering ``gpu`` cards as
``elasticgpu.io/gpu-core`` (100 per card) with the model in ``nvidia.com/gpu.product``.
Tasks (``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, ...,
creation_time, deletion_time``) become pods: a task with ``num_gpu`` 1 and ``gpu_milli``
below 1000 asks for that share of one card (``gpu-core`` = milli / 10); others for whole
cards; ``gpu_spec`` (models separated by ``|``) becomes a required node affinity.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchsched.core.devices import ELASTIC_CORE, MODEL_LABEL

JSON = dict[str, Any]
NAMESPACE = "openb"


@dataclass(slots=True, frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    def manifest(self) -> JSON:
        alloc = {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi", "pods": "1000"}
        if self.gpus:
            alloc[ELASTIC_CORE] = str(100 * self.gpus)
        labels = {"kubernetes.io/hostname": self.name}
        if self.model:
            labels[MODEL_LABEL] = self.model
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "uid": f"node-{self.name}", "labels": labels},
            "status": {"allocatable": alloc, "capacity": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }


@dataclass(slots=True, frozen=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...]
    created: float
    deleted: float

    @property
    def gpu_request(self) -> int:
        """Card compute asked for, in thousandths of a card."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < 1000

    def manifest(self, uid: str, created: float = 0.0, scheduler: str = "batchsched") -> JSON:
        requests: dict[str, str] = {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"}
        if self.shared:
            requests[ELASTIC_CORE] = str(max(1, self.gpu_milli // 10))
        elif self.num_gpu:
            requests[ELASTIC_CORE] = str(100 * self.num_gpu)
        spec: JSON = {
            "schedulerName": scheduler,
            "containers": [{"name": "task", "image": "openb/task", "resources": {"requests": requests}}],
        }
        if self.gpu_spec:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": MODEL_LABEL, "operator": "In", "values": list(self.gpu_spec)},
                ]}],
            }}}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": NAMESPACE, "uid": uid,
                         "creationTimestamp": _timestamp(created)},
            "spec": spec, "status": {"phase": "Pending"},
        }


def _timestamp(seconds: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(text: str) -> int:
    return int(float(text)) if text not in ("", "nan") else 0


def read_nodes(path: Path) -> list[TraceNode]:
    with path.open(newline="") as f:
        return [
            TraceNode(row["sn"], _int(row["cpu_milli"]), _int(row["memory_mib"]), _int(row["gpu"]),
                      "" if row.get("model") in (None, "", "nan") else row["model"])
            for row in csv.DictReader(f)
        ]


def read_tasks(path: Path) -> list[Task]:
    with path.open(newline="") as f:
        return list(_tasks(csv.DictReader(f)))


def _tasks(rows: Iterator[dict[str, str]]) -> Iterator[Task]:
    for row in rows:
        spec = row.get("gpu_spec") or ""
        yield Task(
            name=row["name"], cpu_milli=_int(row["cpu_milli"]), memory_mib=_int(row["memory_mib"]),
            num_gpu=_int(row["num_gpu"]), gpu_milli=_int(row["gpu_milli"]),
            gpu_spec=tuple(s for s in spec.split("|") if s and s != "nan"),
            created=float(_int(row.get("creation_time") or "0")),
            deleted=float(_int(row.get("deletion_time") or "0")),
        )
