"""When a unit that did not fit is worth trying again.

A unit that failed is skipped until capacity changes (the mirror's capacity generation
moves: a pod ended, a node was added or changed), the retry interval passes, or something
about the unit itself changed (the session clears it then). Single pods are kept by UID,
gangs by unit key. This is what makes a cycle with nothing new to try cheap.
"""

from __future__ import annotations

__all__ = ["RetryGate"]


class RetryGate:
    """When each unit last failed, at which capacity generation: a unit is tried again when
    capacity changed, the retry interval passed, or something about it changed."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float]] = {}

    def failed(self, key: str, generation: int, now: float) -> None:
        self._seen[key] = (generation, now)

    def clear(self, key: str | None = None) -> None:
        if key is None:
            self._seen.clear()
        else:
            self._seen.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._seen

    def skip(self, key: str, generation: int, now: float, interval: float) -> bool:
        seen = self._seen.get(key)
        return seen is not None and seen[0] == generation and now - seen[1] < interval
