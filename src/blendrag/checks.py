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
