"""One set of defaults: what the scheduler applies when its configuration file leaves a key
out is what the session, the queues, reservations, cards and node health apply when built
with no settings (as the tests, the simulator and the estimates build them)."""

from __future__ import annotations

import dataclasses

from batchsched.config import parse_config
from batchsched.core.settings import SessionSettings


def test_the_configuration_files_defaults_are_the_sessions() -> None:
    applied = parse_config(None).session_settings()
    core = SessionSettings()
    differ = {f.name: (getattr(applied, f.name), getattr(core, f.name)) for f in dataclasses.fields(SessionSettings)
              if getattr(applied, f.name) != getattr(core, f.name)}
    assert differ == {}
