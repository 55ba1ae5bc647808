"""One retry policy for every request at the kube edge.

Each caller used to carry its own loop and constants; now they all say *how* they back off
(a :class:`Backoff`: exponential, jittered, capped) and how often they retry (a
:class:`RetryPolicy`), and *what* is retried is decided by the error's class from
:mod:`batchsched.kube.errors`, never by its text:

- :class:`~batchsched.kube.errors.TemporaryError`: pause, then try again, up to
  ``retries`` more times; after that the last error is raised;
- :class:`~batchsched.kube.errors.ConflictError`: raised at once, and the caller resyncs
  that object; or, for a read-modify-write that reads its object afresh on each attempt
  (``refetch=True``), tried again at once;
- anything else (permanent, expired, a plain ``KubeError``): raised at once.

Loops that never give up (the reflector, the leader's campaign) keep their own shape and
take their pauses from :meth:`RetryPolicy.pause`. The sleep and the random source are the
policy's, so a test passes a fake sleep and runs in milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from batchsched.kube.coalesce import WriteLater
from batchsched.kube.errors import (
    ConflictError,
    KubeError,
    NotFoundError,
    TemporaryError,
    refine,
)

__all__ = [
    "WATCH_RETRY_CAP",
    "Backoff",
    "RetryPolicy",
    "Sleep",
    "bindings",
    "evictions",
    "status_writes",
    "try_write",
    "watches",
]

log = logging.getLogger("batchsched.retry")

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]

# factor ** attempt stays finite however long a loop has been failing
_MAX_EXPONENT = 64


async def _asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Backoff:
    """The pause before retry number ``attempt`` (0 for the first).

    ``initial * factor ** attempt``, stretched by a random factor in ``[1, 1 + jitter)`` so
    that many callers failing together do not retry together, and never more than ``cap``.
    A ``factor`` of 1 makes a steady poll.
    """

    initial: float
    cap: float
    factor: float = 2.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap:
            raise ValueError(f"need 0 < initial <= cap, got {self.initial}, {self.cap}")
        if self.factor < 1 or self.jitter < 0:
            raise ValueError(f"need factor >= 1 and jitter >= 0, got {self.factor}, {self.jitter}")

    def delay(self, attempt: int, *, draw: float) -> float:
        """The pause for ``attempt``, with ``draw`` a random number in ``[0, 1)``."""
        base = self.initial * self.factor ** min(max(attempt, 0), _MAX_EXPONENT)
        return min(base * (1 + self.jitter * draw), self.cap)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one kind of request is retried; see the module docstring for what is retried."""

    backoff: Backoff
    retries: int = 3
    refetch: bool = False
    sleep: Sleep = _asyncio_sleep
    draw: Callable[[], float] = field(default_factory=lambda: random.Random().random)

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must not be negative, got {self.retries}")

    def delay(self, attempt: int) -> float:
        return self.backoff.delay(attempt, draw=self.draw())

    async def pause(self, attempt: int) -> None:
        """Sleep the pause before retry number ``attempt``."""
        await self.sleep(self.delay(attempt))

    async def call(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        what: str = "request",
        stop: Callable[[KubeError], bool] | None = None,
    ) -> T:
        """Await ``attempt()`` until it succeeds or the policy gives up (raising the error).

        ``stop`` ends the call at once on an error that would otherwise be retried. The
        error raised is in its most specific class (:func:`~batchsched.kube.errors.refine`).
        """
        tried = 0
        while True:
            try:
                return await attempt()
            except KubeError as raised:
                exc = refine(raised)
                again = isinstance(exc, TemporaryError) or (
                    self.refetch and isinstance(exc, ConflictError)
                )
                if not again or tried >= self.retries or (stop is not None and stop(exc)):
                    if exc is raised:
                        raise
                    raise exc from raised
            log.debug("%s failed (%s), retry %d of %d", what, exc, tried + 1, self.retries)
            if isinstance(exc, TemporaryError):
                await self.pause(tried)
            tried += 1


async def try_write(
    policy: RetryPolicy,
    write: Callable[[], Awaitable[object]],
    *,
    what: str,
    gone: Callable[[], None] | None = None,
) -> bool:
    """One best-effort write under ``policy``: True when it landed. Never raises a KubeError.

    An object that is gone (404, or 409 from a UID precondition) drops the write and calls
    ``gone``; a refused write is logged and dropped; temporary errors still failing after
    the retries raise :class:`~batchsched.kube.coalesce.WriteLater` (the coalescing writer
    tries the value again later).
    """
    try:
        await policy.call(write, what=what)
    except (NotFoundError, ConflictError) as exc:
        log.debug("dropping %s: %s", what, exc)
        if gone is not None:
            gone()
    except TemporaryError as exc:
        log.warning("putting off %s after %d tries: %s", what, policy.retries + 1, exc)
        raise WriteLater(what) from exc
    except KubeError as exc:
        log.warning("could not write %s: %s", what, exc)
    else:
        return True
    return False


# -- the policies in use, in one place ---------------------------------------------------


def status_writes() -> RetryPolicy:
    """Pod conditions, Events, PodGroup and Queue status: a few quick tries, then drop."""
    return RetryPolicy(backoff=Backoff(initial=0.5, cap=8.0, jitter=0.5), retries=3)


def bindings(retries: int) -> RetryPolicy:
    """A Binding: retried quickly, since a pod waits on it."""
    return RetryPolicy(backoff=Backoff(initial=0.2, cap=5.0), retries=retries)


def evictions(retries: int) -> RetryPolicy:
    """An Eviction, or the DisruptionTarget condition before it."""
    return RetryPolicy(backoff=Backoff(initial=0.5, cap=10.0), retries=retries)


#: the longest pause between a reflector's tries: once the apiserver answers again, the
#: mirror is listed within this long (15 reflectors retrying this often cost an apiserver
#: that is away nothing; a longer cap left new pods unseen for up to half a minute)
WATCH_RETRY_CAP = 5.0


def watches() -> RetryPolicy:
    """A reflector's list or watch: never given up; ``pause(attempt)`` only."""
    return RetryPolicy(backoff=Backoff(initial=0.5, cap=WATCH_RETRY_CAP, jitter=0.5))
