"""The one retry policy: what is retried is decided by the error's class, pauses grow
exponentially up to a cap; and the one mapping from an answer to that class."""

from __future__ import annotations

import asyncio

import pytest

from batchsched.kube.coalesce import WriteLater
from batchsched.kube.errors import (
    DISRUPTION_BUDGET,
    ConflictError,
    DisruptionBudgetError,
    ExpiredError,
    ForbiddenError,
    InvalidError,
    KubeError,
    NotFoundError,
    PermanentError,
    TemporaryError,
    error_for,
    from_status,
    refine,
)
from batchsched.kube.fake import FakeSleep
from batchsched.kube.retry import Backoff, RetryPolicy, try_write


class Flaky:
    """An attempt that raises ``errors`` in order, then returns ``"ok"``."""

    def __init__(self, *errors: KubeError) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def policy(sleep: FakeSleep, *, retries: int = 3, refetch: bool = False, draw: float = 0.0) -> RetryPolicy:
    return RetryPolicy(
        backoff=Backoff(initial=0.5, cap=3.0), retries=retries, refetch=refetch,
        sleep=sleep, draw=lambda: draw,
    )


def test_temporary_errors_are_retried_with_growing_delays_up_to_the_cap() -> None:
    sleep = FakeSleep()
    attempt = Flaky(*[TemporaryError(503, "ServiceUnavailable", "")] * 4)
    assert asyncio.run(policy(sleep, retries=4).call(attempt)) == "ok"
    assert attempt.calls == 5
    assert sleep.delays == [0.5, 1.0, 2.0, 3.0]


def test_jitter_stretches_each_delay_but_never_past_the_cap() -> None:
    sleep = FakeSleep()
    attempt = Flaky(*[TemporaryError(500, "", "")] * 3)
    asyncio.run(policy(sleep, draw=0.5).call(attempt))
    assert sleep.delays == [0.75, 1.5, 3.0]


def test_after_the_retries_the_last_temporary_error_is_raised() -> None:
    sleep = FakeSleep()
    errors = [TemporaryError(500, "", str(i)) for i in range(3)]
    attempt = Flaky(*errors)
    with pytest.raises(TemporaryError) as raised:
        asyncio.run(policy(sleep, retries=2).call(attempt))
    assert raised.value is errors[2]
    assert attempt.calls == 3
    assert len(sleep.delays) == 2


@pytest.mark.parametrize(
    "error",
    [
        InvalidError(422, "Invalid", ""),
        ForbiddenError(403, "Forbidden", ""),
        NotFoundError(404, "NotFound", ""),
        ExpiredError(410, "Expired", ""),
        PermanentError(418, "", ""),
        ConflictError(409, "Conflict", ""),
    ],
)
def test_permanent_errors_and_conflicts_are_not_retried(error: KubeError) -> None:
    sleep = FakeSleep()
    attempt = Flaky(error)
    with pytest.raises(type(error)):
        asyncio.run(policy(sleep).call(attempt))
    assert attempt.calls == 1
    assert sleep.delays == []


def test_a_refetching_policy_tries_a_conflict_again_at_once() -> None:
    sleep = FakeSleep()
    attempt = Flaky(ConflictError(409, "Conflict", ""), ConflictError(409, "Conflict", ""))
    assert asyncio.run(policy(sleep, refetch=True).call(attempt)) == "ok"
    assert attempt.calls == 3
    assert sleep.delays == []  # the attempt re-reads its object; nothing to wait for


def test_stop_ends_the_call_on_an_error_it_names() -> None:
    sleep = FakeSleep()
    attempt = Flaky(TemporaryError(429, "TooManyRequests", "", causes=[DISRUPTION_BUDGET]))
    with pytest.raises(DisruptionBudgetError):
        asyncio.run(policy(sleep).call(attempt, stop=lambda e: isinstance(e, DisruptionBudgetError)))
    assert attempt.calls == 1


def test_an_error_built_by_hand_is_classified_as_the_client_would() -> None:
    sleep = FakeSleep()
    attempt = Flaky(KubeError(503, "ServiceUnavailable", ""), KubeError(404, "NotFound", ""))
    with pytest.raises(NotFoundError):
        asyncio.run(policy(sleep).call(attempt))
    assert attempt.calls == 2


def test_try_write_says_whether_the_write_landed_and_puts_off_what_kept_failing() -> None:
    sleep = FakeSleep()
    gone: list[bool] = []

    async def main() -> list[bool]:
        p = policy(sleep, retries=1)
        return [
            await try_write(p, Flaky(TemporaryError(500, "", "")), what="w"),
            await try_write(p, Flaky(NotFoundError(404, "", "")), what="w", gone=lambda: gone.append(True)),
            await try_write(p, Flaky(InvalidError(422, "", "")), what="w"),
        ]

    assert asyncio.run(main()) == [True, False, False]
    assert gone == [True]

    # still failing after the retries: neither landed nor given up, but put off (the
    # coalescing writer tries the value again later)
    async def failing() -> bool:
        return await try_write(policy(sleep, retries=1), Flaky(*[TemporaryError(500, "", "")] * 2), what="w")

    with pytest.raises(WriteLater):
        asyncio.run(failing())


def test_backoff_is_validated() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=2.0, cap=1.0)
    with pytest.raises(ValueError):
        Backoff(initial=1.0, cap=2.0, factor=0.5)
    with pytest.raises(ValueError):
        RetryPolicy(backoff=Backoff(initial=1.0, cap=1.0), retries=-1)
    assert Backoff(initial=1.0, cap=30.0).delay(10_000, draw=0.0) == 30.0  # no overflow


# -- the mapping, in one place --------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "causes", "message", "cls"),
    [
        (404, (), "", NotFoundError),
        (409, (), "", ConflictError),
        (410, (), "", ExpiredError),
        (403, (), "", ForbiddenError),
        (422, (), "", InvalidError),
        (500, (), "", TemporaryError),
        (429, (), "slow down", TemporaryError),
        (429, (DISRUPTION_BUDGET,), "", DisruptionBudgetError),
        (429, ("SomethingElse",), "would violate the pod's disruption budget", TemporaryError),
        # the cause decides, never the message's text
        (429, (), "Cannot evict pod as it would violate the pod's disruption budget.", TemporaryError),
        (418, (), "", PermanentError),
    ],
)
def test_error_for(status: int, causes: tuple[str, ...], message: str, cls: type[KubeError]) -> None:
    assert type(error_for(status, "", message, causes=causes)) is cls


def test_from_status_reads_reason_message_and_causes() -> None:
    err = from_status(429, {
        "kind": "Status", "reason": "TooManyRequests", "message": "Cannot evict pod",
        "details": {"causes": [{"reason": "DisruptionBudget", "message": "needs 2 healthy pods"}]},
    })
    assert isinstance(err, DisruptionBudgetError)
    assert (err.status, err.reason, err.message, err.causes) == (
        429, "TooManyRequests", "Cannot evict pod", ("DisruptionBudget",)
    )
    plain = from_status(502, None, fallback="<html>bad gateway</html>")
    assert type(plain) is TemporaryError and plain.message == "<html>bad gateway</html>"


def test_refine_narrows_never_widens() -> None:
    assert type(refine(TemporaryError(429, "", "", causes=[DISRUPTION_BUDGET]))) is DisruptionBudgetError
    assert type(refine(KubeError(403, "", ""))) is ForbiddenError
    dropped = TemporaryError(0, "ClientConnectorError", "connection reset")
    assert refine(dropped) is dropped
    odd = TemporaryError(404, "", "")  # a status its class does not agree with stays as built
    assert refine(odd) is odd
