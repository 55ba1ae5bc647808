"""Errors from the Kubernetes API, translated once at the client boundary.

Every failure that crosses :mod:`batchsched.kube` is one of these, so callers decide what
to do by kind, never by parsing a status code or a message::

    KubeError
    ├── TemporaryError      back off and try again (429, 5xx, timeouts, dropped connections)
    │   └── DisruptionBudgetError  429 from the Eviction API: a PodDisruptionBudget says "not now"
    ├── ConflictError       409: the object changed or already exists; resync that object
    ├── ExpiredError        410: a watch's resourceVersion is too old; relist
    └── PermanentError      the request itself is wrong; retrying changes nothing
        ├── NotFoundError   404
        ├── ForbiddenError  401, 403
        └── InvalidError    400, 422

:func:`error_for` is the one mapping from an answer (HTTP status, the Status object's
``reason``, ``message`` and ``details.causes``) to a class; :mod:`batchsched.kube.retry`
decides from the class alone what is retried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DISRUPTION_BUDGET",
    "ConflictError",
    "DisruptionBudgetError",
    "ExpiredError",
    "ForbiddenError",
    "InvalidError",
    "KubeError",
    "NotFoundError",
    "PermanentError",
    "TemporaryError",
    "error_for",
    "from_status",
    "refine",
]

#: The cause the Eviction API gives when a PodDisruptionBudget refuses (a StatusCause's type,
#: which its JSON calls ``reason``: ``details.causes[].reason``).
DISRUPTION_BUDGET = "DisruptionBudget"


class KubeError(Exception):
    """A request to the API server failed.

    ``causes`` are the cause types (``details.causes[].reason``) of the server's Status.
    """

    def __init__(
        self, status: int, reason: str, message: str, *, causes: Iterable[str] = ()
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = tuple(causes)


class TemporaryError(KubeError):
    """The server or the network failed for now; the same request may succeed later."""


class DisruptionBudgetError(TemporaryError):
    """429 from the Eviction API: a PodDisruptionBudget allows no disruption now.

    Temporary (the budget may allow it later), but a preemption reports it at once
    rather than waiting for it.
    """


class ConflictError(KubeError):
    """409: the object was changed, is being deleted, or already exists."""


class ExpiredError(KubeError):
    """410 Gone: the resourceVersion a watch started from is no longer kept."""


class PermanentError(KubeError):
    """The request cannot succeed as it stands."""


class NotFoundError(PermanentError):
    """404: no such object (or no such resource type)."""


class ForbiddenError(PermanentError):
    """401/403: the caller is not allowed to do this."""


class InvalidError(PermanentError):
    """400/422: the server rejected the object or the request."""


def error_for(
    status: int, reason: str, message: str, *, causes: Iterable[str] = ()
) -> KubeError:
    """The error for an answer from the API server: its class is decided here only."""
    causes = tuple(causes)
    cls: type[KubeError]
    if status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = ConflictError
    elif status == 410:
        cls = ExpiredError
    elif status in (401, 403):
        cls = ForbiddenError
    elif status in (400, 422):
        cls = InvalidError
    elif status == 429 and DISRUPTION_BUDGET in causes:
        cls = DisruptionBudgetError
    elif status == 429 or status >= 500:
        cls = TemporaryError
    else:
        cls = PermanentError
    return cls(status, reason, message, causes=causes)


def from_status(status: int, body: Mapping[str, Any] | None, *, fallback: str = "") -> KubeError:
    """The error for an HTTP status and the ``Status`` object the server sent with it."""
    body = body or {}
    details = body.get("details")
    causes = details.get("causes") if isinstance(details, Mapping) else None
    # a StatusCause's type is the JSON key "reason"; "type" is read too, as older code wrote it
    types = [
        str(c.get("reason") or c.get("type")) for c in causes or ()
        if isinstance(c, Mapping) and (c.get("reason") or c.get("type"))
    ]
    return error_for(
        status, str(body.get("reason", "")), str(body.get("message", fallback)), causes=types
    )


def refine(exc: KubeError) -> KubeError:
    """``exc`` in the most specific class :func:`error_for` gives its parts.

    Errors from the client already are; one built by hand from a status (``KubeError(404,
    ...)``, ``TemporaryError(429, ...)``) is narrowed to the class the client would have
    raised, never widened to an unrelated one (a dropped connection, status 0, stays
    temporary).
    """
    if exc.status <= 0:
        return exc
    narrower = error_for(exc.status, exc.reason, exc.message, causes=exc.causes)
    if type(narrower) is type(exc) or not isinstance(narrower, type(exc)):
        return exc
    return narrower
