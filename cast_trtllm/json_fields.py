"""Field checks for the versioned JSON files the core reads (width profiles, learned cost tables).

Every check takes the field's JSON path (e.g. `profile.latency_ms["1024"]["1"]`) and
raises `ValueError` that starts with it, so a user sees which field of which file is wrong.
"""

from __future__ import annotations

import math
from typing import Any, Sequence


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def obj(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def fields_of(value: Any, path: str, known: set[str], optional: set[str] = frozenset()) -> dict:
    """A JSON object with no unknown fields and every non-optional one present."""
    value = obj(value, path)
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {unknown}")
    missing = sorted(known - optional - set(value))
    if missing:
        raise ValueError(f"{path}.{missing[0]}: missing")
    return value


def int_keyed(value: Any, path: str) -> dict[int, Any]:
    """A JSON object keyed by decimal strings (prefix length, batch size, bucket), int-keyed."""
    value = obj(value, path)
    bad = [k for k in value if not (isinstance(k, str) and k.isdigit())]
    if bad:
        raise ValueError(f'{path}: key "{bad[0]}" is not a decimal integer')
    return {int(k): v for k, v in value.items()}


def ascending_ints(values: Any, path: str) -> tuple[int, ...]:
    """A non-empty list of strictly ascending integers >= 1."""
    if not isinstance(values, (list, tuple)) or not values or any(
            isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ValueError(f"{path}: expected a non-empty list of integers, got {values!r}")
    if values[0] < 1 or any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{path}: expected strictly ascending integers >= 1, got {list(values)}")
    return tuple(values)


def milliseconds(value: Any, path: str, what: str = "ms", positive: bool = True, note: str = "") -> float:
    """A finite duration in ms, > 0 (or >= 0 with positive=False); `note` explains the slot."""
    if not (is_number(value) and math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise ValueError(f"{path}: expected {what} {'>' if positive else '>='} 0{note}, got {value!r}")
    return float(value)


def milliseconds_list(values: Any, path: str, what: str = "ms", per: str = "",
                      keys: Sequence[Any] | None = None) -> tuple[float, ...]:
    """A list of durations in ms > 0; with `keys`, exactly one per key, named `per` in errors
    (per="packed count": 'expected 8 values (one per packed count)', '(packed count 32)')."""
    if not isinstance(values, (list, tuple)) or (keys is not None and len(values) != len(keys)):
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        wanted = "a list of values" if keys is None else f"{len(keys)} values (one per {per})"
        raise ValueError(f"{path}: expected {wanted}, got {got}")
    return tuple(milliseconds(v, f"{path}[{i}]", what, note="" if keys is None else f" ({per} {keys[i]})")
                 for i, v in enumerate(values))
