"""The plain endpoints (``/metrics``, ``/healthz``, ``/readyz``) are answered from a thread
of their own: a probe gets its answer while a long step holds the event loop (the first
step over a large backlog took seconds, and a restarted scheduler was seen ready only after
it had bound for 3.5 s), and ``/healthz`` still fails once that loop has stopped turning."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from batchsched.app import Scheduler
from batchsched.config import parse_config
from batchsched.kube.endpoints import LOOP_STALL_SECONDS, PlainEndpoints
from batchsched.kube.fake import FakeKube


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_ready_health_and_metrics_answer_as_their_callbacks_say() -> None:
    ready: list[bool] = [False]
    stalled: list[float | None] = [None]
    ep = PlainEndpoints("127.0.0.1:0", CollectorRegistry(), ready=lambda: ready[0], stalled=lambda: stalled[0])
    try:
        assert get(ep.port, "/readyz") == (503, "not ready")
        ready[0] = True
        assert get(ep.port, "/readyz") == (200, "ok")
        assert get(ep.port, "/healthz") == (200, "ok")
        stalled[0] = 75.0
        assert get(ep.port, "/healthz") == (503, "the event loop has not run for 75 s")
        assert get(ep.port, "/metrics")[0] == 200
        assert get(ep.port, "/nothing")[0] == 404
    finally:
        ep.close()


def test_a_replica_answers_its_probes_while_a_long_step_holds_its_loop() -> None:
    sched = Scheduler(FakeKube(), parse_config({"leaderElection": {"enabled": False},  # type: ignore[arg-type]
                                                "metricsAddress": "127.0.0.1:0"}))
    answers: list[tuple[float, tuple[int, str]]] = []

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(sched.run())
        try:
            for _ in range(500):
                if sched.ready:
                    break
                await asyncio.sleep(0.02)
            assert sched.ready and sched.http_port

            def probe() -> None:
                time.sleep(0.2)  # inside the long step below
                t0 = time.monotonic()
                answer = get(sched.http_port or 0, "/readyz")
                answers.append((time.monotonic() - t0, answer))

            prober = threading.Thread(target=probe)
            prober.start()
            time.sleep(1.5)  # a step of 1.5 s: the loop turns for nothing else
            await asyncio.get_running_loop().run_in_executor(None, prober.join)
            assert get(sched.http_port, "/healthz") == (200, "ok")
            assert sched._stalled() is None and LOOP_STALL_SECONDS > 1.5
        finally:
            sched.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(main())
    [(seconds, answer)] = answers
    assert answer == (200, "ok")
    assert seconds < 1.0  # answered during the step, not after it
