"""Errors from the Kubernetes API, translated once at the client boundary.

Every failure that crosses :mod:`batchsched.kube` is one of these, so callers decide what
to do by kind, never by parsing a status code or a message::

    KubeError
    ├── TemporaryError      back off and try again (429, 5xx, timeouts, dropped connections)
    ├── ConflictError       409: the object changed or already exists; resync that object
    ├── ExpiredError        410: a watch's resourceVersion is too old; relist
    └── PermanentError      the request itself is wrong; retrying changes nothing
        ├── NotFoundError   404
        ├── ForbiddenError  401, 403
        └── InvalidError    400, 422
"""

from __future__ import annotations


class KubeError(Exception):
    """A request to the API server failed."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class TemporaryError(KubeError):
    """The server or the network failed for now; the same request may succeed later."""


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


def error_for(status: int, reason: str, message: str) -> KubeError:
    """The error class for an HTTP status from the API server."""
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
    elif status == 429 or status >= 500:
        cls = TemporaryError
    else:
        cls = PermanentError
    return cls(status, reason, message)
