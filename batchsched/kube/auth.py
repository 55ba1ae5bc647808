"""Who may read the scheduler's debug endpoints and web view: the cluster decides.

A request carries the caller's bearer token (``Authorization: Bearer ...``), as a kubeconfig
or a ServiceAccount gives it. The token is checked with the TokenReview API and the user it
names is asked about with SubjectAccessReview, for the verb ``get`` on the request's path as
a non-resource URL, as kube-scheduler and the other kube components do for theirs. So RBAC
grants access: a ClusterRole with ``nonResourceURLs: ["/debug/*", "/ui", "/ui/*"]``
(``batchsched-viewer`` in manifests/base/rbac.yaml). The scheduler needs ``create`` on
``tokenreviews`` and ``subjectaccessreviews`` for this (what ``system:auth-delegator``
grants).

Answers are remembered for :data:`CACHE_SECONDS` per (token, path), so a web page that
polls costs the apiserver two requests per path every few seconds at most.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batchsched.kube.api import KubeAPI
from batchsched.kube.errors import KubeError

__all__ = ["CACHE_SECONDS", "Decision", "RequestAuth"]

CACHE_SECONDS = 10.0
_CACHE_MAX = 4096


@dataclass(slots=True, frozen=True)
class Decision:
    """``status`` 200 (allowed), 401 (no or a bad token), 403 (denied) or 503 (the
    apiserver could not be asked); ``message`` says which, for the caller."""

    status: int
    message: str
    user: str = ""


class RequestAuth:
    """Delegated authentication and authorization against the cluster."""

    def __init__(self, client: KubeAPI, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Decision]] = {}

    async def check(self, authorization: str | None, path: str) -> Decision:
        token = _bearer(authorization)
        if token is None:
            return Decision(401, "a bearer token is required (use batchsched explain/dashboard, or send your kubeconfig's token)")
        key = (hashlib.sha256(token.encode()).hexdigest(), path)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        decision = await self._ask(token, path)
        if decision.status != 503:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = (now, decision)
        return decision

    async def _ask(self, token: str, path: str) -> Decision:
        try:
            review = await self.client.create("/apis/authentication.k8s.io/v1/tokenreviews", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token},
            })
        except KubeError as exc:
            return Decision(503, f"could not review the token: {exc}")
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision(401, f"the token was not accepted: {status.get('error') or 'unauthenticated'}")
        user: dict[str, Any] = status.get("user") or {}
        name = str(user.get("username") or "")
        spec: dict[str, Any] = {
            "user": name, "groups": list(user.get("groups") or []),
            "nonResourceAttributes": {"path": path, "verb": "get"},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        try:
            sar = await self.client.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
            })
        except KubeError as exc:
            return Decision(503, f"could not ask whether {name} may get {path}: {exc}")
        if not (sar.get("status") or {}).get("allowed"):
            return Decision(403, f"{name} may not get {path} (grant the ClusterRole batchsched-viewer)", name)
        return Decision(200, "", name)


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
