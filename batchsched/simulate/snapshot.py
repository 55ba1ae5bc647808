"""Replay a cluster snapshot (:mod:`batchsched.kube.snapshot`) through the session: every
object goes through the parser and session intake the watch uses; one step places what
is pending, as the scheduler would with that configuration. DRA objects (ResourceSlices,
DeviceClasses, DeviceTaintRules, ResourceClaims) are listed into the session before the pods; a pending pod's
claims are then allocated by the step and written on the simulation's claims (see
:class:`~batchsched.simulate.engine.Claims`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchsched.config import parse_config
from batchsched.core.disruption import parse_pdb
from batchsched.core.gangs import parse_podgroup
from batchsched.core.model import parse_pod, parse_priority_class
from batchsched.core.volumes import parse_claim, parse_storage_class, parse_volume
from batchsched.simulate.engine import Placed, Simulation

KIND = "BatchschedSnapshot"


def load(snapshot: Mapping[str, Any], *, now: float, use_jit: bool = True) -> Simulation:
    """A simulation holding the snapshot's objects, its session set up as the snapshot's
    configuration says (nothing stepped yet)."""
    if snapshot.get("kind") != KIND:
        raise ValueError(f"not a batchsched snapshot (kind {snapshot.get('kind')!r})")
    settings = parse_config(snapshot.get("config") or None).session_settings()
    sim = Simulation(settings, use_jit=use_jit)
    s = sim.session
    objs: Mapping[str, list[dict[str, Any]]] = snapshot.get("objects") or {}
    s.on_namespaces_listed(objs.get("namespaces", []))
    classes = [parse_priority_class(o) for o in objs.get("priorityclasses", [])]
    s.on_priority_classes_listed({pc.name: pc.value for pc in classes},
                                 [pc.name for pc in classes if pc.never_preempts])
    s.on_queues_listed(objs.get("queues", []))
    s.on_budgets_listed([parse_pdb(o) for o in objs.get("poddisruptionbudgets", [])])
    s.on_claims_listed([parse_claim(o) for o in objs.get("persistentvolumeclaims", [])])
    s.on_volumes_listed([parse_volume(o) for o in objs.get("persistentvolumes", [])])
    s.on_storage_classes_listed([parse_storage_class(o) for o in objs.get("storageclasses", [])])
    for name, items in objs.items():
        if name.startswith("podgroups."):
            api = name.split(".", 1)[1]
            s.on_groups_listed(api, [parse_podgroup(api, o) for o in items])
    sim.add_nodes(objs.get("nodes", []))
    sim.add_devices(slices=objs.get("resourceslices", []), classes=objs.get("deviceclasses", []),
                    taint_rules=objs.get("devicetaintrules", []))
    sim.claims.add(objs.get("resourceclaims", []))
    pods = [parse_pod(o) for o in objs.get("pods", [])]
    for pod, o in zip(pods, objs.get("pods", []), strict=True):
        sim.objects[pod.uid] = dict(o)
    s.on_pods_listed(pods)
    return sim


def replay(snapshot: Mapping[str, Any], *, now: float, use_jit: bool = True) -> dict[str, Placed]:
    """Where the session places the snapshot's pending pods (by pod uid), in one step."""
    sim = load(snapshot, now=now, use_jit=use_jit)
    sim.step(now)
    return dict(sim.placed)
