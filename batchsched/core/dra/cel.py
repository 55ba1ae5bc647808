"""CEL device selectors, evaluated the way Kubernetes' structured allocator evaluates them.

A DeviceClass (``spec.selectors[].cel.expression``) and a ResourceClaim request
(``selectors[].cel.expression``) pick devices with a CEL expression over one variable,
``device``::

    device.driver                      the driver's name ("gpu.nvidia.com")
    device.attributes[domain][name]    int, bool, string, semver (or lists of them)
    device.capacity[domain][name]      a quantity
    device.allowMultipleAllocations    bool

``domain`` is the part of a fully qualified attribute name before the ``/``. Upstream's
environment (k8s.io/dynamic-resource-allocation/cel/compile.go on the Kubernetes base
environment) adds ``quantity()`` and ``semver()`` values with their member functions; this
module provides the ones selectors use: ``quantity``, ``isQuantity``, ``sign``, ``compareTo``,
``isGreaterThan``, ``isLessThan``, ``asInteger``, ``asApproximateFloat``, ``isInteger``,
``add``, ``sub`` for quantities and ``semver`` (with its optional normalize flag),
``isSemver``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``,
``patch`` for versions, ``cel.bind``, and the string extensions but ``format`` and
``strings.quote`` (``charAt``, ``indexOf``, ``lastIndexOf``, ``lowerAscii``, ``upperAscii``,
``replace``, ``split``, ``substring``, ``trim``, ``join``), next to CEL's standard functions
and macros. An expression that calls a function outside that set (``format``, the list, set,
regex, IP, CIDR and URL extensions of the Kubernetes environment) is refused when it is
compiled, naming the function, never evaluated as something else; so is the optional syntax
(``x.?name``), which the library does not parse.

Semantics kept from upstream (checked expression by expression against
k8s.io/dynamic-resource-allocation/cel v0.37.2 on the same devices):

- Looking up a domain a device has no attribute in gives an empty map, so
  ``has(device.attributes["other.example.com"].x)`` is false, while reading a missing name
  (``device.attributes["gpu.nvidia.com"].nope``) is a runtime error unless guarded by
  ``has()`` or ``in``.
- A runtime error, or a result that is not a bool, is an error for the whole allocation,
  not a reason to skip the device: upstream's allocator returns the error from
  ``Allocate`` and the scheduler aborts that pod's attempt (it is retried with back-off).
  :meth:`Selector.matches` raises :class:`CelError`; the allocator lets it through. An
  attribute or capacity value CEL cannot read is such an error too, on each evaluation.
- Expressions longer than 10 KiB (``CELSelectorExpressionMaxLength``) are refused. The cost
  limit (``CELSelectorExpressionMaxCost``) is not counted here: the library has no cost
  tracker; the apiserver refuses an expression whose estimated cost exceeds it when the
  object is written, so what we read is bounded already.
- Without a type checker, types are known only on evaluation: ``device.driver`` compiles
  and then fails on the first device, and ``device.driver == 1`` is false, where upstream
  refuses both at compile time. Either way no device is allocated with them.

Library: ``common-expression-language`` (Python bindings of the Rust ``cel`` crate), chosen
over the pure-Python ``cel-python`` by measurement on the selectors NVIDIA's DRA driver
classes and typical claims use (driver and type, productName, memory capacity against
``quantity("40Gi")``, driverVersion against ``semver("550.0.0")``, ``in``, ``has`` with
``startsWith``, allowMultipleAllocations) over eight A100 and MIG devices, both given the
same Python quantity and semver functions: it compiled an expression in 5-41 us against
64-1130 us and evaluated it in 0.2-15 us per device against 57-350 us (cel-python's
transpiling runner evaluates in 20-40 us but cannot call extension functions that are not
module-level names). Both gave the same matches. The allocator evaluates each selector on
each candidate device of each node for each pod, so evaluation time is what counts; through
this module it is 0.3-15 us per device (a quantity or semver comparison calls back into
Python), a device's :func:`device_env` ~45 us, a compile ~25-200 us once per expression.
What the binding lacks, worked around here: values must be plain CEL values, so a quantity
or a version is a one-key map (``{"$quantity": "4.294967296E+10"}``,
``{"$semver": "550.54.15"}``) in a canonical form (``==`` compares values, as upstream),
and the extension functions check that marker; its maps have no default and it has no
``cel.bind``, so both are rewritten in the source (see :func:`_rewritten`). It logs a
warning on its ``cel`` logger when an extension function raises.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import cel  # imported where first used: its package loads a command line (a quarter second at start)

from batchsched.core.quantity import QuantityError, parse_quantity

#: upstream's CELSelectorExpressionMaxLength, in bytes
MAX_EXPRESSION_LENGTH = 10 * 1024

_QUANTITY = "$quantity"
_SEMVER = "$semver"
_INT64 = (-(2**63), 2**63 - 1)
#: enough digits that no quantity the API accepts is rounded (its largest is ~10^18 * 2^60)
_PRECISION = 80


class CelError(ValueError):
    """An expression that does not compile, or fails on a device. The message names the expression."""


# --- quantities -----------------------------------------------------------------------------


def _quantity_value(amount: Decimal) -> dict[str, str]:
    """A quantity as CEL sees it; equal amounts give equal maps, whatever their spelling."""
    with localcontext(prec=_PRECISION):
        return {_QUANTITY: str(amount.normalize())}


def _parse_quantity(text: object) -> Decimal:
    if not isinstance(text, str) or text != text.strip():
        raise QuantityError(f"bad quantity {text!r}")
    with localcontext(prec=_PRECISION):
        return parse_quantity(text)


def _amount(value: object, function: str) -> Decimal:
    if isinstance(value, dict) and _QUANTITY in value:
        return Decimal(value[_QUANTITY])
    raise TypeError(f"no such overload: {function} needs a quantity, got {_describe(value)}")


def _amount_or_int(value: object, function: str) -> Decimal:
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    return _amount(value, function)


def _quantity(text: object) -> dict[str, str]:
    if not isinstance(text, str):
        raise TypeError(f"no such overload: quantity needs a string, got {_describe(text)}")
    return _quantity_of(text)


@functools.lru_cache(maxsize=4096)
def _quantity_of(text: str) -> dict[str, str]:
    """Parsed once per spelling: a selector's ``quantity("40Gi")`` runs on every device.
    Callers never change the map (the library copies it into a CEL value)."""
    return _quantity_value(_parse_quantity(text))


def _is_quantity(text: object) -> bool:
    try:
        _parse_quantity(text)
    except QuantityError:
        return False
    return True


def _as_int64(amount: Decimal) -> int | None:
    if amount != amount.to_integral_value() or not _INT64[0] <= amount <= _INT64[1]:
        return None
    return int(amount)


def _as_integer(value: object) -> int:
    whole = _as_int64(_amount(value, "asInteger"))
    if whole is None:
        raise ValueError("cannot convert value to integer")
    return whole


def _add(value: object, other: object) -> dict[str, str]:
    with localcontext(prec=_PRECISION):
        return _quantity_value(_amount(value, "add") + _amount_or_int(other, "add"))


def _sub(value: object, other: object) -> dict[str, str]:
    with localcontext(prec=_PRECISION):
        return _quantity_value(_amount(value, "sub") - _amount_or_int(other, "sub"))


def _sign(value: object) -> int:
    amount = _amount(value, "sign")
    return (amount > 0) - (amount < 0)


# --- semantic versions (semver.org 2.0.0, as github.com/blang/semver/v4 parses them) --------

_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER_RE = re.compile(
    rf"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    rf"(?:-({_ID}(?:\.{_ID})*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?",
    re.ASCII,
)

#: a version as its ordering key: (major, minor, patch, no prerelease?, prerelease ids)
_VersionKey = tuple[int, int, int, bool, tuple[tuple[int, int | str], ...]]


@functools.lru_cache(maxsize=4096)
def _version_key(text: str) -> _VersionKey:
    m = _SEMVER_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"bad semantic version {text!r}")
    pre = m.group(4)
    # numeric identifiers order before alphanumeric ones, then by value
    ids = tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split(".")) if pre else ()
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), pre is None, ids


def _semver_value(text: str) -> dict[str, str]:
    """A version as CEL sees it; build metadata is dropped, as it plays no part in equality."""
    _version_key(text)
    return {_SEMVER: text.split("+", 1)[0]}


def _normalized(text: str) -> str:
    """Upstream's lenient spelling: an optional "v", leading zeros, missing minor or patch."""
    parts = [_without_leading_zeros(p) for p in text.removeprefix("v").split(".", 2)]
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            raise ValueError(f"bad semantic version {text!r}: a short version has no prerelease or build")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def _without_leading_zeros(part: str) -> str:
    if len(part) < 2:
        return part
    part = part.lstrip("0")
    return part if part[:1].isdigit() else "0" + part


def _semver(text: object, normalize: object = False) -> dict[str, str]:
    if not isinstance(text, str) or not isinstance(normalize, bool):
        raise TypeError(f"no such overload: semver({text!r}, {normalize!r})")
    return _semver_value(_normalized(text) if normalize else text)


def _is_semver(text: object, normalize: object = False) -> bool:
    try:
        _semver(text, normalize)
    except ValueError:
        return False
    return True


def _version(value: object, function: str) -> _VersionKey:
    if isinstance(value, dict) and _SEMVER in value:
        return _version_key(value[_SEMVER])
    raise TypeError(f"no such overload: {function} needs a semver, got {_describe(value)}")


def _describe(value: object) -> str:
    if isinstance(value, dict) and len(value) == 1 and (_QUANTITY in value or _SEMVER in value):
        kind, text = next(iter(value.items()))
        return f"{kind[1:]}({text!r})"
    return repr(value)


# --- what both share: the three comparisons -------------------------------------------------


def _ordered(a: object, b: object, function: str) -> int:
    """-1, 0 or 1: two quantities or two versions, never one of each."""
    if isinstance(a, dict) and _QUANTITY in a:
        x, y = _amount(a, function), _amount(b, function)
        return (x > y) - (x < y)
    v, w = _version(a, function), _version(b, function)
    return (v > w) - (v < w)


# --- the string extensions of the Kubernetes environment (cel-go ext.Strings, version 2) -----
# Indexes count code points; ``format`` and ``strings.quote`` are not provided.

#: what Go's strings.TrimSpace trims (unicode.IsSpace), which differs from str.isspace
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _text(value: object, function: str) -> str:
    if isinstance(value, str):
        return value
    raise TypeError(f"no such overload: {function} needs a string, got {_describe(value)}")


def _int(value: object, function: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"no such overload: {function} needs an int, got {_describe(value)}")


def _index(value: object, function: str, size: int) -> int:
    i = _int(value, function)
    if not 0 <= i <= size:
        raise ValueError(f"index out of range: {i}")
    return i


def _char_at(text: object, index: object) -> str:
    s = _text(text, "charAt")
    i = _index(index, "charAt", len(s))
    return s[i : i + 1]


def _index_of(text: object, sub: object, offset: object = 0) -> int:
    if isinstance(text, list):  # the Kubernetes lists library's indexOf
        return next((i for i, item in enumerate(text) if item == sub), -1)
    s, needle, off = _text(text, "indexOf"), _text(sub, "indexOf"), _int(offset, "indexOf")
    if off < 0:
        raise ValueError(f"index out of range: {off}")
    if not needle:
        return min(off, len(s))
    return -1 if off >= len(s) else s.find(needle, off)


def _last_index_of(text: object, sub: object, offset: object = None) -> int:
    if isinstance(text, list):
        return max((i for i, item in enumerate(text) if item == sub), default=-1)
    s, needle = _text(text, "lastIndexOf"), _text(sub, "lastIndexOf")
    if offset is None:
        if not needle:
            return len(s)
        if len(s.encode()) < len(needle.encode()):
            return -1
        offset = len(s) - 1
    off = _int(offset, "lastIndexOf")
    if off < 0:
        raise ValueError(f"index out of range: {off}")
    if not needle:
        return min(off, len(s))
    return -1 if off >= len(s) else s.rfind(needle, 0, off + len(needle))


def _substring(text: object, start: object, end: object = None) -> str:
    s = _text(text, "substring")
    if end is not None and _int(start, "substring") > _int(end, "substring"):
        raise ValueError(f"invalid substring range. start: {start}, end: {end}")
    first = _index(start, "substring", len(s))
    return s[first : len(s) if end is None else _index(end, "substring", len(s))]


def _split(text: object, separator: object, limit: object = -1) -> list[str]:
    s, sep, n = _text(text, "split"), _text(separator, "split"), _int(limit, "split")
    if n == 0:
        return []
    if sep:
        return s.split(sep, n - 1 if n > 0 else -1)
    if n < 0 or n >= len(s):
        return list(s)
    return [*s[: n - 1], s[n - 1 :]]


def _replace(text: object, old: object, new: object, limit: object = -1) -> str:
    f = "replace"
    return _text(text, f).replace(_text(old, f), _text(new, f), _int(limit, f))


def _join(items: object, separator: object = "") -> str:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise TypeError(f"no such overload: join needs a list of strings, got {items!r}")
    return _text(separator, "join").join(items)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "sign": _sign,
    "asInteger": _as_integer,
    "isInteger": lambda q: _as_int64(_amount(q, "isInteger")) is not None,
    "asApproximateFloat": lambda q: float(_amount(q, "asApproximateFloat")),
    "add": _add,
    "sub": _sub,
    "semver": _semver,
    "isSemver": _is_semver,
    "major": lambda v: _version(v, "major")[0],
    "minor": lambda v: _version(v, "minor")[1],
    "patch": lambda v: _version(v, "patch")[2],
    "compareTo": lambda a, b: _ordered(a, b, "compareTo"),
    "isGreaterThan": lambda a, b: _ordered(a, b, "isGreaterThan") > 0,
    "isLessThan": lambda a, b: _ordered(a, b, "isLessThan") < 0,
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": lambda s: _text(s, "lowerAscii").translate(_ASCII_LOWER),
    "upperAscii": lambda s: _text(s, "upperAscii").translate(_ASCII_UPPER),
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "trim": lambda s: _text(s, "trim").strip(_GO_SPACE),
    "join": _join,
}

#: CEL's standard named functions the library provides (operators and macros have ids
#: starting with "_", "@" or "!", and are all standard)
_STANDARD = frozenset(
    {
        "size", "contains", "startsWith", "endsWith", "matches",
        "int", "uint", "double", "string", "bytes", "bool", "dyn", "type", "duration", "timestamp",
        "getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek",
        "getHours", "getMinutes", "getSeconds", "getMilliseconds",
    }
)
_PROVIDED = _STANDARD | _FUNCTIONS.keys()


# --- the device -----------------------------------------------------------------------------

_SCALARS = {"int": int, "bool": bool, "string": str, "version": str}
_LISTS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}


def _scalar(kind: str, value: Any) -> Any:
    if type(value) is not _SCALARS[kind]:  # not isinstance: a bool is no int here
        raise TypeError(f"{kind} needs a {_SCALARS[kind].__name__}, got {value!r}")
    return _semver_value(str(value)) if kind == "version" else value


def _attribute_value(attribute: Mapping[str, Any]) -> Any:
    """The CEL value of one DeviceAttribute (``{"int": 3}``, ``{"versions": [...]}``, ...)."""
    if len(attribute) != 1 or not attribute.keys() <= _SCALARS.keys() | _LISTS.keys():
        raise ValueError(
            f"needs exactly one of {sorted(_SCALARS.keys() | _LISTS.keys())}, got {dict(attribute)!r}"
        )
    [(kind, value)] = attribute.items()
    if kind in _SCALARS:
        return _scalar(kind, value)
    if not isinstance(value, list):
        raise TypeError(f"{kind} needs a list, got {value!r}")
    return [_scalar(_LISTS[kind], v) for v in value]


def _domain_and_name(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


@dataclass(frozen=True, slots=True, eq=False)
class DeviceEnv:
    """One device as every selector sees it: built once per device, evaluated many times.

    ``problem`` is an attribute or capacity CEL cannot read; like upstream, it is an error
    of each evaluation on this device, not of building it.
    """

    context: cel.Context
    problem: str | None = None


def device_env(
    driver: str,
    attributes: Mapping[str, Mapping[str, Any]],
    capacity: Mapping[str, Mapping[str, Any]],
    allow_multiple_allocations: bool = False,
) -> DeviceEnv:
    """The ``device`` variable of a device from a ResourceSlice.

    ``attributes`` maps a fully qualified name (``"gpu.nvidia.com/type"``) to the API's
    DeviceAttribute dict; ``capacity`` maps one to the API's DeviceCapacity dict
    (``{"value": "40Gi"}``).
    """
    problem = None
    attrs: dict[str, dict[str, Any]] = {}
    for name, attribute in attributes.items():
        domain, ident = _domain_and_name(name, driver)
        try:
            attrs.setdefault(domain, {})[ident] = _attribute_value(attribute)
        except (ValueError, TypeError) as exc:
            problem = problem or f"attribute {name}: {exc}"
    caps: dict[str, dict[str, Any]] = {}
    for name, cap in capacity.items():
        domain, ident = _domain_and_name(name, driver)
        try:
            value = cap.get("value")
            number = isinstance(value, int | float) and not isinstance(value, bool)
            caps.setdefault(domain, {})[ident] = _quantity(str(value) if number else value)
        except (QuantityError, TypeError) as exc:
            problem = problem or f"capacity {name}: {exc}"
    device = {
        "driver": driver,
        "attributes": attrs,
        "capacity": caps,
        "allowMultipleAllocations": bool(allow_multiple_allocations),
    }
    import cel

    return DeviceEnv(cel.Context(variables={"device": device}, functions=_FUNCTIONS), problem)


# --- compiled selectors ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Selector:
    """One compiled selector expression (one object per expression: see :func:`compile_selector`)."""

    expression: str
    _program: cel.Program

    def matches(self, env: DeviceEnv) -> bool:
        """Whether the device is selected. Raises :class:`CelError` on a runtime error or a
        result that is not a bool: an error for the allocation, not a reason to skip the device."""
        if env.problem is not None:
            raise CelError(f"CEL expression {self.expression!r}: {env.problem}")
        try:
            result = self._program.execute(env.context)
        except KeyError as exc:
            raise CelError(
                f"CEL expression {self.expression!r}: no such key: {exc.args[0]} "
                "(guard it with has() or 'in')"
            ) from exc
        except Exception as exc:  # the library reports errors as several builtin types
            raise CelError(f"CEL expression {self.expression!r}: {_reason(exc)}") from exc
        if not isinstance(result, bool):
            raise CelError(
                f"CEL expression {self.expression!r} must evaluate to bool, "
                f"got {type(result).__name__} {result!r}"
            )
        return result


_CALL_FAILED = re.compile(
    r"Function '(\w+)' error: Python function call failed: \w+: (.*?)\. Check function arguments.*",
    re.DOTALL,
)


def _reason(exc: Exception) -> str:
    """The library's message, less its wording about Python callbacks."""
    m = _CALL_FAILED.fullmatch(str(exc))
    return f"{m.group(1)}(): {m.group(2)}" if m else str(exc)


def compile_selector(expression: str) -> Selector:
    """The compiled selector; each distinct expression is compiled once (a refusal too)."""
    compiled = _compiled(expression)
    if isinstance(compiled, CelError):
        raise compiled.with_traceback(None)  # the one cached error, without the last raise's frames
    return compiled


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str) -> Selector | CelError:
    size = len(expression.encode())
    if size > MAX_EXPRESSION_LENGTH:
        return CelError(
            f"CEL expression {expression[:80]!r}... is {size} bytes, more than {MAX_EXPRESSION_LENGTH}"
        )
    import cel

    try:
        cel.compile(expression)
        program = cel.compile(_rewritten(expression))
    except ValueError as exc:
        return CelError(f"CEL expression {expression!r} does not compile: {exc}")
    unknown = sorted(f for f in program.functions() if f[0] not in "_@!" and f not in _PROVIDED)
    if unknown:
        return CelError(
            f"CEL expression {expression!r} calls {', '.join(unknown)}, "
            "which batchsched's CEL environment does not provide"
        )
    return Selector(expression, program)


# --- what the library lacks, written in what it has -----------------------------------------
#
# Two rewrites of the source, applied after it parsed as written (so a syntax error points at
# the user's text): ``cel.bind(v, init, body)`` as ``[init].map(v, body)[0]`` (upstream's
# DRA environment has cel.bind; the library has no such macro), and ``device.attributes[K]``
# / ``device.capacity[K]`` as ``(K in device.attributes ? device.attributes[K] : {})``
# (upstream's outer maps give an empty map for an absent domain; the library's fail).

_BIND = re.compile(r"cel\s*\.\s*bind\s*\(")
_LOOKUP = re.compile(r"device\s*\.\s*(attributes|capacity)\s*\[")
_PREFIXED_STRING = re.compile(r"(?:[rR][bB]?|[bB][rR]?)(?=['\"])")
_IDENTIFIER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*")


def _rewritten(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        end = _skip(text, i)
        if end is not None:
            out.append(text[i:end])
            i = end
            continue
        starts_name = i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_.")
        bind = _BIND.match(text, i) if starts_name else None
        lookup = _LOOKUP.match(text, i) if starts_name else None
        if bind is not None:
            close = _closing(text, bind.end())
            args = _arguments(text, bind.end(), close)
            name = _IDENTIFIER.fullmatch(args[0]) if len(args) == 3 else None
            if name is not None:
                init, body = _rewritten(args[1]), _rewritten(args[2])
                out.append(f"[{init}].map({name.group(1)}, {body})[0]")
                i = close + 1
                continue
        elif lookup is not None:
            close = _closing(text, lookup.end())
            key = _rewritten(text[lookup.end() : close])
            field = f"device.{lookup.group(1)}"
            out.append(f"(({key}) in {field} ? {field}[{key}] : {{}})")
            i = close + 1
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _skip(text: str, i: int) -> int | None:
    """The end of the string literal or comment that starts at ``i``, if one does."""
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
        return None
    prefix = _PREFIXED_STRING.match(text, i)
    q = prefix.end() if prefix else i
    if q >= len(text) or text[q] not in "'\"":
        return None
    raw = prefix is not None and "r" in prefix.group().lower()
    quote = text[q] * 3 if text.startswith(text[q] * 3, q) else text[q]
    j = q + len(quote)
    while j < len(text):
        if not raw and text[j] == "\\":
            j += 2
        elif text.startswith(quote, j):
            return j + len(quote)
        else:
            j += 1
    return len(text)


def _closing(text: str, i: int) -> int:
    """The index of the bracket closing the one just before ``i`` (the text parsed, so its
    brackets balance)."""
    depth = 1
    while i < len(text):
        end = _skip(text, i)
        if end is not None:
            i = end
            continue
        depth += 1 if text[i] in "([{" else -1 if text[i] in ")]}" else 0
        if depth == 0:
            return i
        i += 1
    return len(text)


def _arguments(text: str, start: int, close: int) -> list[str]:
    """The comma-separated arguments between ``start`` and ``close``."""
    args, depth, i, first = [], 0, start, start
    while i < close:
        end = _skip(text, i)
        if end is not None:
            i = end
            continue
        depth += 1 if text[i] in "([{" else -1 if text[i] in ")]}" else 0
        if depth == 0 and text[i] == ",":
            args.append(text[first:i])
            first = i + 1
        i += 1
    args.append(text[first:close])
    return args
