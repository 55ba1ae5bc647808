"""Leader election on a ``coordination.k8s.io/v1`` Lease, so only one scheduler binds pods.

Several replicas run; one holds the Lease and schedules, the others stand by. The rules
are those of kube-scheduler's elector, written for asyncio:

- **Acquire.** Create the Lease if there is none. Take it over when its holder is empty, is
  us, or has let it lapse (``renewTime + leaseDurationSeconds`` is in the past). Otherwise
  look again every ``retry_period``, or at the moment the Lease as read lapses when that
  comes sooner: a holder that died is replaced when its lease ends, not up to a retry
  period later (a live holder has renewed by then, and the look finds the new renewTime).
- **Write with a precondition.** Every write is a PUT carrying the resourceVersion that was
  read (or a create), so two candidates cannot both win a round: the loser gets a 409 and
  tries again later.
- **Renew.** The leader renews every ``retry_period``. When no renewal has succeeded for
  ``renew_deadline`` it stops leading (``on_stopped_leading``) and :meth:`run` returns: the
  process is expected to exit, like kube-scheduler. Since ``renew_deadline`` is shorter than
  ``lease_duration``, the old leader has stopped before a standby may take over, provided
  the replicas' clocks agree to within the difference.
- **Release.** On a graceful shutdown :meth:`LeaderElector.release` empties the holder, so
  a standby takes over at its next look instead of waiting for the lease to lapse.
- **Fence.** Noticing a lost lease takes a running renew loop, and a replica can be paused
  (SIGSTOP, a long collection, a slow step) or cut off past its deadline with writes
  queued. So the elector also keeps a :class:`Fence`: open until ``renewTime +
  renew_deadline`` of its last successful write of the Lease, by the clock that wrote
  ``renewTime``, closed at once when leadership ends. Every write made for the leader
  checks it right before each attempt and is dropped, never sent, once it has passed
  (:class:`Fenced`). A standby takes over only after ``renewTime + leaseDurationSeconds``,
  later than the fence, so two replicas never write for the leader at the same time as
  long as their clocks agree to within the difference. What the fence cannot stop is a
  request sent before the deadline that the network delivers after it.
- **When the holder's writes end.** The holder writes its ``renew_deadline`` on the Lease
  (:data:`RENEW_DEADLINE_ANNOTATION`), so a standby knows when the holder's fence closes
  without a renewal: ``renewTime`` plus that, never later than the lapse. A new leader
  reads the cluster again only where its mirror may predate that moment, and a standby
  whose holder went silent can read it before the lapse (``holder_writes_end``).

Errors are the kinds of :mod:`batchsched.kube.errors`: temporary errors and conflicts are
simply retried; permanent ones (a missing RBAC rule, a missing namespace) are logged and
retried slowly, since an operator may fix them while we wait. The pauses come from
:mod:`batchsched.kube.retry`: the campaign is a steady poll (``retry_period``, jittered),
the release a short :class:`~batchsched.kube.retry.RetryPolicy` that re-reads the Lease
after a conflict. Renewals are not backed off: as in kube-scheduler, one try every
``retry_period`` until ``renew_deadline``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from batchsched.kube.api import JSON, KubeAPI
from batchsched.kube.client import before_send
from batchsched.kube.errors import (
    ConflictError,
    ForbiddenError,
    KubeError,
    NotFoundError,
    PermanentError,
    TemporaryError,
)
from batchsched.kube.retry import Backoff, RetryPolicy

__all__ = ["ENDPOINT_ANNOTATION", "RENEW_DEADLINE_ANNOTATION", "Fence", "Fenced", "LeaderElector"]

log = logging.getLogger("batchsched.leader")

Callback = Callable[[], Awaitable[None] | None]
T = TypeVar("T")

_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"
#: the Lease annotation where the leader says where its views are served
#: (``batchsched explain`` and ``batchsched dashboard`` read it)
ENDPOINT_ANNOTATION = "batchsched.io/endpoint"
#: the Lease annotation where the holder says its ``renew_deadline`` in seconds: it writes
#: nothing for the leader later than its ``renewTime`` plus that (its fence)
RENEW_DEADLINE_ANNOTATION = "batchsched.io/renew-deadline-seconds"
# How long to wait before looking again after a permanent error (403, 404 namespace, 422).
_SLOW_RETRY_FACTOR = 10.0
_SLOW_RETRY_MIN = 10.0
_JITTER = 0.2
#: a standby looks again this long after the lapse it read, so its clock is past it
_LAPSE_MARGIN = 0.01


def micro_time(ts: float) -> str:
    """A ``metav1.MicroTime`` string for a Unix time."""
    return datetime.fromtimestamp(ts, UTC).strftime(_MICRO_TIME)


def parse_time(value: object) -> float | None:
    """The Unix time of a ``Time``/``MicroTime`` string, or ``None`` when absent or invalid."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


class Fenced(Exception):
    """A write made for the leader was not sent: this replica's fence had passed.

    Not a :class:`~batchsched.kube.errors.KubeError`: nothing was asked of the apiserver,
    so no retry policy retries it. Writers report it as an outcome of its own
    (``fenced``) or drop the write; the next leader reads the truth from its watches.
    """


class Fence:
    """Until when this replica may write for the leader (see the module docstring).

    A new fence is closed; :meth:`always_open` is the fence of a replica that runs without
    leader election. The elector moves it: :meth:`extend` after each successful write of
    the Lease, :meth:`close` when leadership ends. ``clock`` must be the clock the Lease's
    ``renewTime`` is written with (the elector's).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time, until: float = 0.0) -> None:
        self._clock = clock
        self._until = until
        self._led = asyncio.Event()  # set once the fence has been opened
        if until > 0:
            self._led.set()

    @classmethod
    def always_open(cls) -> Fence:
        return cls(until=math.inf)

    @property
    def deadline(self) -> float:
        """The clock time at which the fence closes (``inf`` when it never does)."""
        return self._until

    def is_open(self) -> bool:
        return self._clock() < self._until

    def check(self, what: str) -> None:
        """Raise :class:`Fenced` once the deadline has passed; ``what`` names the write."""
        if not self.is_open():
            raise Fenced(f"{what}: not sent, this replica's lease deadline has passed")

    async def send(self, write: Callable[[], Awaitable[T]], *, what: str) -> T:
        """``write()`` (one request) behind the fence: checked now, and again at the last
        moment, as the request is written to its connection
        (:data:`~batchsched.kube.client.before_send`)."""
        self.check(what)
        token = before_send.set(lambda: self.check(what))
        try:
            return await write()
        finally:
            before_send.reset(token)

    def guard(self, write: Callable[[], Awaitable[T]], *, what: str) -> Callable[[], Awaitable[T]]:
        """``write`` behind the fence: each call (each attempt of a retry) is checked."""

        async def attempt() -> T:
            return await self.send(write, what=what)

        return attempt

    def extend(self, until: float) -> None:
        """Open the fence until ``until`` (a renewal succeeded)."""
        self._until = until
        self._led.set()

    async def led(self) -> None:
        """Return once the fence has been open at least once (this replica has led).

        What a standby learns before it leads (an object it cannot read, to be reported
        with a Warning Event) waits for this rather than being dropped at a closed fence:
        its session remembers having told it, so a dropped report would never be sent.
        """
        await self._led.wait()

    def close(self) -> None:
        self._until = -math.inf


async def _call(callback: Callback) -> None:
    result = callback()
    if inspect.isawaitable(result):
        await result


class LeaderElector:
    """Campaign for one Lease and hold it while we lead.

    ``on_started_leading`` runs as a task beside the renewals (it may be the scheduler's
    whole main loop) and is cancelled when leadership ends. An elector runs once: after
    :meth:`run` returns or :meth:`release` is called, make a new one to campaign again.
    ``fence`` is the :class:`Fence` it keeps (a new one when not given; it must read the
    same clock as ``clock``).
    """

    def __init__(
        self,
        *,
        client: KubeAPI,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15,
        renew_deadline: float = 10,
        retry_period: float = 2,
        clock: Callable[[], float] = time.time,
        fence: Fence | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        if not identity:
            raise ValueError("the identity of a leader candidate must not be empty")
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(
                "need 0 < retry_period < renew_deadline < lease_duration, got "
                f"{retry_period}, {renew_deadline}, {lease_duration}"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        #: written on the Lease while this candidate holds it (where to reach the leader)
        self.annotations = {**(annotations or {}), RENEW_DEADLINE_ANNOTATION: f"{renew_deadline:g}"}
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self.fence = fence if fence is not None else Fence(clock=clock)
        self.fence.close()
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._path = f"{self._collection}/{name}"
        # Whole seconds, rounded up: a shorter lease than asked for would let a standby
        # take over before we have noticed that we stopped renewing.
        self._duration_seconds = max(1, math.ceil(lease_duration))
        self._is_leader = False
        self._stopping = False
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()  # one read-modify-write of the Lease at a time
        self._lease: JSON | None = None  # the Lease as last written by us, while we hold it
        self._last_renew = 0.0  # clock time written as renewTime by our last success
        #: until when the previous holder of the Lease we took over could have written for
        #: the leader (:meth:`_writes_end`; 0 when there was none): a write that holder
        #: made is in the cluster by then
        self.predecessor_until = 0.0
        #: the Lease as last read held by another candidate: when it lapses, and until
        #: when that holder could have written without renewing it (both 0 when the last
        #: read found it free or ours)
        self.holder_lapses_at = 0.0
        self.holder_writes_end = 0.0
        self._seen_holder: str | None = None  # for logging changes of holder only
        #: the campaign: look every retry_period (jittered), stop waiting on release()
        self.poll = RetryPolicy(
            backoff=Backoff(
                initial=retry_period, cap=retry_period * (1 + _JITTER), factor=1.0, jitter=_JITTER
            ),
            sleep=self._pause,
        )
        #: giving the Lease up: three tries, a conflict re-reads it
        release_pause = min(retry_period, 0.5)
        self.release_retry = RetryPolicy(
            backoff=Backoff(initial=release_pause, cap=2 * release_pause, jitter=_JITTER),
            retries=2,
            refetch=True,
        )

    @property
    def is_leader(self) -> bool:
        """True from a successful acquisition until leadership is lost or given up."""
        return self._is_leader

    # -- the campaign -----------------------------------------------------------------

    async def run(self, on_started_leading: Callback, on_stopped_leading: Callback) -> None:
        """Acquire the Lease, lead while it is renewed, return once leadership has ended.

        ``on_stopped_leading`` is awaited when leadership ends for any reason other than the
        cancellation of :meth:`run` itself: renewals failed for ``renew_deadline``, another
        candidate holds the Lease, :meth:`release` was called, or ``on_started_leading``
        raised (that error is then re-raised, after the Lease has been released).
        """
        if not await self._acquire():
            return
        log.info("%s became the leader on lease %s/%s", self.identity, self.namespace, self.name)
        renew = asyncio.create_task(self._renew_loop(), name=f"lease-renew-{self.name}")
        lead = asyncio.create_task(_call(on_started_leading), name=f"leading-{self.name}")
        failure: BaseException | None = None
        try:
            pending: set[asyncio.Task[Any]] = {renew, lead}
            while renew in pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if lead in done and not lead.cancelled() and lead.exception() is not None:
                    failure = lead.exception()
                    break
        finally:
            self._lost()
            renew.cancel()
            lead.cancel()
            await asyncio.gather(renew, lead, return_exceptions=True)
        if failure is not None:
            log.error("%s: the leading task failed, giving up the lease", self.identity)
            await self.release()
        elif not renew.cancelled() and (exc := renew.exception()) is not None:
            raise exc
        log.info("%s stopped leading on lease %s/%s", self.identity, self.namespace, self.name)
        await _call(on_stopped_leading)
        if failure is not None:
            raise failure

    async def release(self, settle: Callable[[], Awaitable[object]] | None = None) -> None:
        """Give the Lease up if we hold it, and stop campaigning. Never raises a KubeError.

        The fence closes first and no renewal opens it again, so nothing more is written
        for the leader; ``settle`` (when given) is awaited next, for the writes already
        sent to land (a writer's drain: what was queued fails at the closed fence, at
        once); then the holder is emptied and ``leaseDurationSeconds`` set to 1, so a
        standby takes over at its next look instead of waiting for the lease to lapse.
        Whether we hold the Lease is read from the server, so this also works after
        :meth:`run` was cancelled.
        """
        self._stopping = True
        self._stop.set()
        self._lost()
        if settle is not None:
            await settle()

        async def give_up() -> bool:
            lease = self._lease or await self.client.get(self._path)
            self._lease = None  # read it again after a conflict
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return False
            spec.update(
                holderIdentity="",
                leaseDurationSeconds=1,
                renewTime=micro_time(self._clock()),
            )
            await self.client.replace(self._path, {**lease, "spec": spec})
            return True

        async with self._lock:
            try:
                released = await self.release_retry.call(give_up, what="releasing the lease")
            except NotFoundError:
                return
            except (TemporaryError, ConflictError) as exc:
                log.warning("%s: gave up releasing the lease (%s); it will lapse", self.identity, exc)
                return
            except KubeError as exc:
                log.warning("%s: could not release the lease: %s", self.identity, exc)
                return
            if released:
                log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)

    # -- internals --------------------------------------------------------------------

    async def _acquire(self) -> bool:
        """Look for the Lease every ``retry_period`` until it is ours; False when stopped."""
        while not self._stopping:
            delay = self.poll.delay(0)
            try:
                async with asyncio.timeout(self.renew_deadline), self._lock:
                    if self._stopping:
                        return False
                    if await self._try_acquire_or_renew():
                        return True
                if self.holder_lapses_at:
                    # held by another: look again when it lapses, if that comes first
                    to_lapse = self.holder_lapses_at - self._clock() + _LAPSE_MARGIN
                    delay = min(delay, max(0.0, to_lapse))
            except TimeoutError:
                log.warning("%s: acquiring the lease timed out", self.identity)
            except (TemporaryError, ConflictError) as exc:
                log.debug("%s: acquiring the lease failed, will retry: %s", self.identity, exc)
            except ForbiddenError as exc:
                log.error("%s: not allowed to use lease %s: %s", self.identity, self._path, exc)
                delay = self._slow_retry()
            except PermanentError as exc:
                log.error("%s: cannot use lease %s: %s", self.identity, self._path, exc)
                delay = self._slow_retry()
            await self.poll.sleep(delay)
        return False

    async def _renew_loop(self) -> None:
        """Renew every ``retry_period``; return when leadership is lost or given up."""
        delay = self.retry_period
        while True:
            await self._pause(delay)
            if self._stopping:
                return
            remaining = self._last_renew + self.renew_deadline - self._clock()
            if remaining <= 0:
                log.error(
                    "%s: no renewal succeeded for %.1f s, leadership lost",
                    self.identity,
                    self.renew_deadline,
                )
                self._lost()
                return
            try:
                async with asyncio.timeout(remaining), self._lock:
                    if self._stopping:
                        return
                    held = await self._try_acquire_or_renew()
            except TimeoutError:
                log.warning("%s: renewing the lease timed out", self.identity)
            except ForbiddenError as exc:
                log.error("%s: not allowed to renew the lease: %s", self.identity, exc)
            except KubeError as exc:
                log.warning("%s: renewing the lease failed: %s", self.identity, exc)
            else:
                if not held:
                    log.error("%s: lease taken by %s", self.identity, self._seen_holder)
                    self._lost()
                    return
                delay = self.retry_period
                continue
            # retry, but wake up in time to step down at the deadline
            to_deadline = self._last_renew + self.renew_deadline - self._clock()
            delay = max(0.0, min(self.retry_period, to_deadline))

    async def _try_acquire_or_renew(self) -> bool:
        """One round: True when the Lease is ours afterwards, False when someone else's."""
        try:
            return await self._round()
        except BaseException:
            self._lease = None  # what we hold may be stale now: read it again next time
            raise

    async def _round(self) -> bool:
        now = self._clock()
        lease = self._lease
        if lease is None:
            try:
                lease = await self.client.get(self._path)
            except NotFoundError:
                return await self._create()
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        self._observe(holder)
        if holder and holder != self.identity and not self._expired(spec, now):
            self.holder_lapses_at = self._lapses_at(spec)
            self.holder_writes_end = self._writes_end(lease)
            self._lease = None
            self._lost()
            return False
        self.holder_lapses_at = self.holder_writes_end = 0.0
        write_time = self._clock()
        if holder != self.identity:
            self.predecessor_until = self._writes_end(lease)
            spec["acquireTime"] = micro_time(write_time)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self._duration_seconds
        spec["renewTime"] = micro_time(write_time)
        body = {**lease, "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec}
        if self.annotations:
            meta = dict(lease.get("metadata") or {})
            meta["annotations"] = {**(meta.get("annotations") or {}), **self.annotations}
            body["metadata"] = meta
        self._lease = await self.client.replace(self._path, body)
        self._took(write_time)
        return True

    async def _create(self) -> bool:
        write_time = self._clock()
        stamp = micro_time(write_time)
        body: JSON = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace, "annotations": dict(self.annotations)},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._duration_seconds,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        self._lease = await self.client.create(self._collection, body)
        self._observe(self.identity)
        self._took(write_time)
        return True

    def _took(self, write_time: float) -> None:
        """The Lease now says we hold it, renewed at ``write_time``."""
        self._last_renew = write_time
        self._is_leader = True
        if not self._stopping:  # a renewal that lands during release() opens nothing
            self.fence.extend(write_time + self.renew_deadline)

    def _lost(self) -> None:
        self._is_leader = False
        self.fence.close()

    def _lapses_at(self, spec: JSON) -> float:
        """When a Lease last renewed as ``spec`` says lapses (0 when it names no time)."""
        renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
        if renewed is None:
            return 0.0
        duration = spec.get("leaseDurationSeconds")
        seconds = float(duration) if isinstance(duration, int | float) else self.lease_duration
        return renewed + seconds

    def _writes_end(self, lease: JSON) -> float:
        """Until when the holder a Lease names could have written for the leader: its
        renewTime plus the renew deadline it published (its fence), else the lapse."""
        spec = lease.get("spec") or {}
        lapse = self._lapses_at(spec)
        renewed = parse_time(spec.get("renewTime"))
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        try:
            deadline = float(annotations.get(RENEW_DEADLINE_ANNOTATION, ""))
        except (TypeError, ValueError):
            return lapse
        if renewed is None or not 0 < deadline < math.inf:
            return lapse
        return min(lapse, renewed + deadline)

    def _expired(self, spec: JSON, now: float) -> bool:
        return self._lapses_at(spec) <= now

    def _observe(self, holder: str) -> None:
        if holder != self._seen_holder:
            if holder != self.identity:
                log.info(
                    "%s: lease %s/%s is held by %r",
                    self.identity,
                    self.namespace,
                    self.name,
                    holder,
                )
            self._seen_holder = holder

    def _slow_retry(self) -> float:
        return max(_SLOW_RETRY_MIN, self.retry_period * _SLOW_RETRY_FACTOR)

    async def _pause(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or less when :meth:`release` is called meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._stop.wait()
