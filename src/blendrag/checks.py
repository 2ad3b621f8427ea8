"""Checks of numbers given in configs: one predicate, one message, wherever a config takes one.

``bool`` is an ``int`` to Python but never a number to a config; NaN compares false with
everything (a NaN timeout never fires, a NaN threshold passes every test) and an infinite
value is as bad, so a number must be finite.
"""

from __future__ import annotations

import math


def is_finite_number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value))


def check_at_least(label: str, value: object, low: float = 0.0, *, strict: bool = False) -> None:
    """ValueError naming ``label`` unless ``value`` is a finite number >= ``low`` (> with
    ``strict``)."""
    if not is_finite_number(value) or value < low or (strict and value == low):  # type: ignore[operator]
        raise ValueError(f"{label} must be a finite number {'>' if strict else '>='} {low:g}, "
                         f"got {value!r}")


def is_count(value: object, low: int = 0) -> bool:
    """An int (not a bool) >= ``low``."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= low


def check_count(label: str, value: object, low: int = 0) -> None:
    """ValueError naming ``label`` unless ``value`` is an integer >= ``low`` (a float such as
    2.5 would reach a slice or a buffer size)."""
    if not is_count(value, low):
        raise ValueError(f"{label} must be an integer >= {low}, got {str(value)[:40]!r}")
