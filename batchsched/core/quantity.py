"""Kubernetes resource quantities as integers in the units the scheduler counts in.

CPU is counted in milli-CPU, memory and storage in bytes, everything else (GPUs, pods,
other extended resources) in whole units, rounding up like the apiserver does for
``Quantity.Value()`` / ``MilliValue()``.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")

#: counted in thousandths: CPU, and the GPU card compute of the device model
#: (``batchsched.io/gpu``: a quota of "2.5" is two and a half cards)
MILLI_RESOURCES = frozenset({"cpu", "batchsched.io/gpu"})

#: the largest amount the scheduler counts, in its units (about 10^15: a pebibyte of
#: memory, 10^12 CPUs): every request, allocatable and quota is below it, so sums over
#: thousands of pods or nodes stay far inside the int64 arrays. Anything at or above it
#: is refused where it is parsed, as an unreadable quantity.
MAX_UNITS = 2**50


class QuantityError(ValueError):
    """A quantity string that Kubernetes would not accept."""


class QuantityRangeError(QuantityError):
    """A quantity Kubernetes accepts, beyond what batchsched counts (:data:`MAX_UNITS`)."""


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a quantity such as ``"500m"``, ``"16Gi"`` or ``"1e3"``."""
    if isinstance(value, bool):
        raise QuantityError(f"bad quantity {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    m = _RE.match(text)
    if not m:
        raise QuantityError(f"bad quantity {value!r}")
    number, suffix = m.group(1), m.group(2) or ""
    if "e" in number.lower() and suffix:
        raise QuantityError(f"bad quantity {value!r}")
    try:
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation as exc:
        raise QuantityError(f"bad quantity {value!r}") from exc


def to_units(resource: str, value: str | int | float) -> int:
    """The quantity in the scheduler's integer unit for ``resource`` (milli-CPU for cpu).
    Each distinct (resource, value) is parsed once: a cluster's pods repeat a few strings."""
    if not isinstance(value, str | int | float):
        raise QuantityError(f"bad quantity {value!r}")
    return _to_units(resource, value)


@functools.lru_cache(maxsize=16384)
def _to_units(resource: str, value: str | int | float) -> int:
    q = parse_quantity(value)
    if resource in MILLI_RESOURCES:
        q = q * 1000
    if not q.is_finite() or abs(q) >= MAX_UNITS:
        raise QuantityRangeError(
            f"quantity {value!r} of {resource} is beyond what batchsched counts "
            f"(at most {format_units(resource, MAX_UNITS - 1)})"
        )
    return math.ceil(q)


def format_units(resource: str, units: int) -> str:
    """A short human form: ``2500m`` CPU as ``2.5``, bytes as ``Gi``, counts as they are."""
    if resource in MILLI_RESOURCES:
        return f"{units / 1000:g}"
    if resource in ("memory", "ephemeral-storage"):
        for suffix, div in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if units >= div:
                return f"{units / div:g}{suffix}"
    return str(units)
