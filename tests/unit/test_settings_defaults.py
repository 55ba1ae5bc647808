"""One set of defaults: what the scheduler applies when its configuration file leaves a key
out is what the session, the queues, reservations, cards and node health apply when built
with no settings (as the tests, the simulator and the estimates build them).

The configuration's defaults are read from the core's settings values (``batchsched.config``);
the YAML files that document them are held to them in ``test_model_config.py`` and
``test_chart.py``. What still declares a default of its own (a keyword default of a book or
a writer that the running scheduler always sets from the configuration) is held equal here,
so that nothing built without settings runs with a value production never uses."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from batchsched.config import Config, parse_config
from batchsched.core.gangs.book import GroupBook
from batchsched.core.queues.book import QueueInput, QueueSettings
from batchsched.core.settings import FIRST_WALK_BUDGET, SessionSettings
from batchsched.insight.estimate import estimate_starts
from batchsched.insight.explain import Insight
from batchsched.kube.binder import Binder
from batchsched.kube.evictor import Evictor
from batchsched.kube.leader import LeaderElector
from batchsched.kube.status import StatusWriter
from batchsched.kube.views import SessionViews


def test_the_configuration_files_defaults_are_the_sessions() -> None:
    applied = parse_config(None).session_settings()
    core = SessionSettings()
    differ = {f.name: (getattr(applied, f.name), getattr(core, f.name)) for f in dataclasses.fields(SessionSettings)
              if getattr(applied, f.name) != getattr(core, f.name)}
    # one on purpose: a scheduler's first cycle stops at its first placement, a session
    # built alone (a test, a replay) walks its first cycle as it walks the others
    assert differ == {"first_walk_budget": (FIRST_WALK_BUDGET, None)}


def keyword_defaults(fn: Any) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def field_defaults(cls: Any) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_the_books_keyword_defaults_are_the_settings() -> None:
    """The gang book and the cycle's queue input, built without the session's settings
    (as policy tests build them), apply the settings' defaults."""
    session, queues = SessionSettings(), QueueSettings()
    groups = keyword_defaults(GroupBook)
    assert (groups["default_timeout"], groups["initial_backoff"], groups["max_backoff"],
            groups["whole_job_restart"]) == (
        session.gang_default_timeout, session.gang_initial_backoff, session.gang_max_backoff,
        session.gang_whole_job_restart,
    )
    given = field_defaults(QueueInput)
    assert (given["max_searches"], given["max_search_seconds"], given["preemption"]) == (
        queues.max_searches, queues.max_search_seconds, queues.preemption,
    )


def test_the_edges_keyword_defaults_are_the_configurations() -> None:
    """The writers, the leader election and the views, built without a configuration (as
    their tests build them), apply the configuration's defaults."""
    cfg = Config()
    binder = keyword_defaults(Binder)
    assert (binder["concurrency"], binder["retries"]) == (cfg.binder.concurrency, cfg.binder.retries)
    assert keyword_defaults(Evictor)["concurrency"] == cfg.gang.eviction_concurrency
    assert keyword_defaults(StatusWriter)["concurrency"] == cfg.status.concurrency
    leader = keyword_defaults(LeaderElector)
    le = cfg.leader_election
    assert (leader["lease_duration"], leader["renew_deadline"], leader["retry_period"]) == (
        le.lease_duration_seconds, le.renew_deadline_seconds, le.retry_period_seconds,
    )
    insight = field_defaults(Insight)
    ex = cfg.explain
    assert (insight["estimate_ttl"], insight["max_steps"]) == (ex.estimate_ttl_seconds, ex.estimate_max_steps)
    assert keyword_defaults(estimate_starts)["max_steps"] == ex.estimate_max_steps
    assert keyword_defaults(SessionViews)["budget"] == ex.estimate_budget_seconds
