"""Volumes: what a pod's storage says about where it may go.

The book mirrors PersistentVolumeClaims, PersistentVolumes and StorageClasses, and turns
each pending pod's claims into either a constraint or a visible refusal:

- a claim that is **bound** (``spec.volumeName`` set, its PersistentVolume known): the
  volume's required node affinity is ANDed into the pod's required node affinity, so the
  pod only goes where its volume can be mounted (a local disk, a zone);
- a claim that **does not exist** yet, or is bound to a volume not yet seen: the pod waits,
  told why;
- a claim **not bound** whose StorageClass binds ``WaitForFirstConsumer``: batchsched does
  not provision volumes (the volume would have to be chosen with the node): the pod is
  refused, naming the claim, until that is supported; with ``Immediate`` binding it waits
  for the claim to be bound;

(``spec.resourceClaims``, dynamic resource allocation, are :mod:`batchsched.core.dra`'s.)

A refused or waiting pod is :attr:`~batchsched.core.model.Pod.invalid` with the reason, so
it is reported (Event and ``PodScheduled=False``) and never placed; when a claim, volume
or class changes, the pods using it are looked at again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from batchsched.core.model import Pod, Term, and_terms, parse_node_terms

__all__ = ["VolumeBook", "VolumeClaim", "parse_claim", "parse_storage_class", "parse_volume"]

WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"


@dataclass(slots=True, frozen=True)
class VolumeClaim:
    namespace: str
    name: str
    volume: str = ""
    storage_class: str = ""
    phase: str = "Pending"


def parse_claim(obj: Mapping[str, Any]) -> VolumeClaim:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return VolumeClaim(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta["name"]),
        volume=str(spec.get("volumeName") or ""),
        storage_class=str(spec.get("storageClassName") or ""),
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
    )


def parse_volume(obj: Mapping[str, Any]) -> tuple[str, tuple[Term, ...] | None]:
    """A PersistentVolume's name and its required node affinity (None: any node)."""
    required = ((obj.get("spec") or {}).get("nodeAffinity") or {}).get("required")
    terms = parse_node_terms(required.get("nodeSelectorTerms")) if isinstance(required, Mapping) else None
    return str(obj["metadata"]["name"]), terms


def parse_storage_class(obj: Mapping[str, Any]) -> tuple[str, str]:
    """A StorageClass's name and volume binding mode."""
    return str(obj["metadata"]["name"]), str(obj.get("volumeBindingMode") or "Immediate")


class VolumeBook:
    """Claims, volumes and storage classes, and the constraint each pending pod gets."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], VolumeClaim] = {}
        self.volumes: dict[str, tuple[Term, ...] | None] = {}
        self.classes: dict[str, str] = {}

    # -- mirror: each returns the claim keys whose pods must be looked at again

    def claim_event(self, kind: str, claim: VolumeClaim) -> set[tuple[str, str]]:
        key = (claim.namespace, claim.name)
        if kind == "DELETED":
            self.claims.pop(key, None)
        else:
            self.claims[key] = claim
        return {key}

    def replace_claims(self, claims: list[VolumeClaim]) -> set[tuple[str, str]]:
        keys = set(self.claims) | {(c.namespace, c.name) for c in claims}
        self.claims = {(c.namespace, c.name): c for c in claims}
        return keys

    def volume_event(self, kind: str, name: str, terms: tuple[Term, ...] | None) -> set[tuple[str, str]]:
        if kind == "DELETED":
            self.volumes.pop(name, None)
        else:
            self.volumes[name] = terms
        return {k for k, c in self.claims.items() if c.volume == name}

    def replace_volumes(self, volumes: list[tuple[str, tuple[Term, ...] | None]]) -> set[tuple[str, str]]:
        self.volumes = dict(volumes)
        return set(self.claims)

    def class_event(self, kind: str, name: str, mode: str) -> set[tuple[str, str]]:
        if kind == "DELETED":
            self.classes.pop(name, None)
        else:
            self.classes[name] = mode
        return {k for k, c in self.claims.items() if c.storage_class == name}

    def replace_classes(self, classes: list[tuple[str, str]]) -> set[tuple[str, str]]:
        self.classes = dict(classes)
        return set(self.claims)

    # -- the constraint

    def apply(self, pod: Pod) -> Pod:
        """``pod`` as scheduling must see it: its volumes' node affinity added, or invalid
        with the reason its claims keep it from being placed."""
        if not pod.claims or pod.invalid:
            return pod
        terms = pod.required_terms
        for name in pod.claims:
            claim = self.claims.get((pod.namespace, name))
            where = f"PersistentVolumeClaim {pod.namespace}/{name}"
            if claim is None:
                return replace(pod, invalid=f"{where} does not exist yet")
            if not claim.volume:
                if self.classes.get(claim.storage_class) == WAIT_FOR_FIRST_CONSUMER:
                    return replace(pod, invalid=(
                        f"{where} waits for its first consumer (StorageClass {claim.storage_class}, "
                        "WaitForFirstConsumer): batchsched does not provision volumes yet"
                    ))
                return replace(pod, invalid=f"{where} is not bound to a volume yet")
            if claim.volume not in self.volumes:
                return replace(pod, invalid=f"{where} is bound to PersistentVolume {claim.volume}, not seen yet")
            terms = and_terms(terms, self.volumes[claim.volume])
        return pod if terms == pod.required_terms else replace(pod, required_terms=terms)
