"""The workload mix kept across restarts, in a ConfigMap next to the Lease.

The fragmentation policy measures against the mix of pods the cluster runs
(:mod:`batchsched.core.devices`, counted by :class:`~batchsched.core.mirror.ClusterState`).
Most of it is rebuilt at every start from the pods the scheduler lists; what no listing
shows any more is the pods that are gone (finished and deleted) and the prior the
configuration gave (``gpuSharing.mix``). That part, :meth:`ClusterState.mix_gone
<batchsched.core.mirror.ClusterState.mix_gone>`, is what the leader keeps here:

- where: ConfigMap ``<leaseName>-workload-mix`` (``batchsched-workload-mix`` by default) in
  the Lease's namespace, data key ``mix.json``: ``{"kinds": [{"cpuMilli": 8000,
  "wholeCards": 1, "shareMilli": 1000, "count": 12}, ...]}``;
- written by the leader only (through its :class:`~batchsched.kube.leader.Fence`), at most
  every :data:`WRITE_EVERY_SECONDS` and only when it changed, off the scheduling path: a
  failed write is logged and tried again at the next turn;
- read by every replica at start-up, before its first step: it takes the place of the
  configured prior (:meth:`ClusterState.restore_mix
  <batchsched.core.mirror.ClusterState.restore_mix>`). Absent, unreadable or malformed, it
  is a warning line and the mix starts from the prior and the listed pods: a start never
  fails for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

from batchsched.core.devices import MILLI, MixKind, mix_rows
from batchsched.core.mirror import MIX_WINDOW, ClusterState
from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.errors import KubeError, NotFoundError
from batchsched.kube.leader import Fence, Fenced

__all__ = [
    "DATA_KEY", "WRITE_EVERY_SECONDS", "MixStore", "configmap_name", "mix_document", "observe_mix", "read_mix_document",
]

log = logging.getLogger("batchsched.mixstore")

#: the data key of the ConfigMap
DATA_KEY = "mix.json"
#: the leader writes the mix at most this often (when it changed)
WRITE_EVERY_SECONDS = 30.0
#: a start waits this long at most for the stored mix
READ_TIMEOUT_SECONDS = 10.0
#: kinds a stored mix may hold at most (a larger one is refused as malformed)
MAX_STORED_KINDS = 4096


class MixFormatError(ValueError):
    """A stored mix that cannot be read; the message says why."""


def configmap_name(lease_name: str) -> str:
    """The ConfigMap of the mix of the replicas that share the Lease ``lease_name``."""
    return f"{lease_name}-workload-mix"


def mix_document(counts: Mapping[MixKind, int]) -> str:
    """``counts`` as the ConfigMap's ``mix.json``, most frequent kind first."""
    kinds = [
        {"cpuMilli": cpu, "wholeCards": whole, "shareMilli": share, "count": n}
        for (cpu, whole, share), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if n > 0
    ]
    return json.dumps({"kinds": kinds}, separators=(",", ":"))


def read_mix_document(text: str) -> dict[MixKind, int]:
    """The counts of a ``mix.json``; :class:`MixFormatError` naming what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise MixFormatError(f"not JSON ({exc})") from None
    kinds = doc.get("kinds") if isinstance(doc, dict) else None
    if not isinstance(kinds, list):
        raise MixFormatError("no list under \"kinds\"")
    if len(kinds) > MAX_STORED_KINDS:
        raise MixFormatError(f"{len(kinds)} kinds, more than {MAX_STORED_KINDS}")
    counts: dict[MixKind, int] = {}
    for i, entry in enumerate(kinds):
        kind, n = _kind(entry, f"kinds[{i}]")
        counts[kind] = counts.get(kind, 0) + n
    return counts


def _kind(entry: Any, where: str) -> tuple[MixKind, int]:
    if not isinstance(entry, dict):
        raise MixFormatError(f"{where}: not an object")
    values: list[int] = []
    for key, top in (("cpuMilli", 2**40), ("wholeCards", 1024), ("shareMilli", MILLI), ("count", MIX_WINDOW)):
        v = entry.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
            raise MixFormatError(f"{where}.{key}: expected a whole number from 0 to {top}, got {v!r}")
        values.append(v)
    cpu, whole, share, n = values
    if whole and share != MILLI:
        raise MixFormatError(f"{where}: whole cards with a share of {share} (a whole-card kind has {MILLI})")
    return (cpu, whole, share), n


def observe_mix(gauge: Gauge, state: ClusterState) -> None:
    """The mix the kernels measure against (the rows of the next snapshot) on ``gauge``,
    one series per kind; kinds that left the mix leave the gauge."""
    gauge.clear()
    for weight, cpu, whole, share in mix_rows(state.mix):
        gauge.labels(f"{cpu / MILLI:g}", str(whole), f"{(share if not whole else 0) / MILLI:g}").set(weight / 1000)


class MixStore:
    """Reads the stored mix into the mirror at start-up; writes it while leading."""

    def __init__(
        self,
        client: KubeAPI,
        state: ClusterState,
        *,
        namespace: str,
        lease_name: str,
        fence: Fence | None = None,
        every: float = WRITE_EVERY_SECONDS,
    ) -> None:
        self.client = client
        self.state = state
        self.fence = fence if fence is not None else Fence.always_open()
        self.every = every
        self.name = configmap_name(lease_name)
        self.path = f"/api/v1/namespaces/{namespace}/configmaps"
        #: what the server holds, as far as this replica knows (nothing is written while equal)
        self._written: dict[MixKind, int] | None = None
        self.writes = 0

    async def restore(self) -> bool:
        """Seed the mirror's mix with the stored one; False (and a warning, unless there is
        none yet) when it could not be."""
        try:
            obj = await asyncio.wait_for(self.client.get(f"{self.path}/{self.name}"), READ_TIMEOUT_SECONDS)
        except NotFoundError:
            log.warning("no stored workload mix (ConfigMap %s; a new cluster has none until the leader "
                        "writes it): the mix starts from the prior and the pods listed", self.name)
            return False
        except (KubeError, TimeoutError) as exc:
            log.warning("the stored workload mix (ConfigMap %s) could not be read: %s; "
                        "the mix starts from the prior and the pods listed", self.name, str(exc) or "timed out")
            return False
        text = (obj.get("data") or {}).get(DATA_KEY)
        try:
            if not isinstance(text, str):
                raise MixFormatError(f"no data key {DATA_KEY}")
            counts = read_mix_document(text)
        except MixFormatError as exc:
            log.warning("the stored workload mix (ConfigMap %s) is malformed: %s; "
                        "the mix starts from the prior and the pods listed", self.name, exc)
            return False
        self.state.restore_mix(counts)
        self._written = counts
        log.info("workload mix restored from ConfigMap %s: %d kinds, %d pods",
                 self.name, len(counts), sum(counts.values()))
        return True

    async def run(self) -> None:
        """Write the mix every :attr:`every` seconds while it changes (the leader only)."""
        while True:
            await asyncio.sleep(self.every)
            await self.write()

    async def write(self) -> bool:
        """Write the mix now if this replica leads and it changed; whether it was written."""
        if not self.fence.is_open():
            return False
        counts = self.state.mix_gone()
        if counts == self._written:
            return False
        body: JSON = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self.name, "labels": {"app.kubernetes.io/name": "batchsched"}},
            "data": {DATA_KEY: mix_document(counts)},
        }
        try:
            await self.fence.send(lambda: self._put(body), what=f"ConfigMap {self.name}")
        except Fenced:
            return False
        except KubeError as exc:
            log.warning("the workload mix was not written (ConfigMap %s): %s; tried again in %.0f s",
                        self.name, exc, self.every)
            return False
        self._written = counts
        self.writes += 1
        return True

    async def _put(self, body: JSON) -> JSON:
        """Replace the ConfigMap (the latest mix wins), or create it the first time."""
        try:
            return await self.client.replace(f"{self.path}/{self.name}", body)
        except NotFoundError:
            return await self.client.create(self.path, body)
