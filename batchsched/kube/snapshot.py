"""A snapshot of what the scheduler reads from a cluster, as one JSON document.

``batchsched snapshot`` and the running scheduler's ``/debug/snapshot`` both list every
collection the scheduler watches (nodes, pods, PodGroups, Queues, PriorityClasses,
namespaces, budgets, volumes, and DRA's ResourceSlices, DeviceClasses, DeviceTaintRules and ResourceClaims) and add the scheduler's configuration, so that
``batchsched simulate --snapshot FILE`` replays the same objects through the same session.
A collection the cluster does not serve (a CRD not installed) is recorded as empty.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from batchsched.kube.api import KubeAPI
from batchsched.kube.errors import NotFoundError
from batchsched.kube.intake import DRA_API, PODGROUP_PATHS
from batchsched.kube.queuestatus import QUEUES_PATH

KIND = "BatchschedSnapshot"
VERSION = 1

#: collection name in the snapshot -> the path it is listed from
COLLECTIONS: dict[str, str] = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "priorityclasses": "/apis/scheduling.k8s.io/v1/priorityclasses",
    "queues": QUEUES_PATH,
    "namespaces": "/api/v1/namespaces",
    "poddisruptionbudgets": "/apis/policy/v1/poddisruptionbudgets",
    "persistentvolumeclaims": "/api/v1/persistentvolumeclaims",
    "persistentvolumes": "/api/v1/persistentvolumes",
    "storageclasses": "/apis/storage.k8s.io/v1/storageclasses",
    "resourceslices": f"{DRA_API}/resourceslices",
    "deviceclasses": f"{DRA_API}/deviceclasses",
    "devicetaintrules": f"{DRA_API}/devicetaintrules",
    "resourceclaims": f"{DRA_API}/resourceclaims",
    **{f"podgroups.{api}": path for api, path in PODGROUP_PATHS.items()},
}


async def take_snapshot(client: KubeAPI, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every watched collection, listed now, and ``config`` (the configuration file's
    document, as :func:`batchsched.config.parse_config` reads it)."""
    objects: dict[str, list[dict[str, Any]]] = {}
    missing: list[str] = []
    for name, path in COLLECTIONS.items():
        try:
            items, _ = await client.list(path)
        except NotFoundError:
            items = []
            missing.append(name)
        objects[name] = items
    return {
        "kind": KIND, "version": VERSION,
        "takenAt": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": config or {}, "notServed": missing, "objects": objects,
    }
