"""Argument checks with Keras-style messages, shared by every kadapt module."""

from __future__ import annotations

import math
import numbers


def check_micro_batch_size(value: object, name: str = "micro_batch_size") -> int:
    """Returns `value` as an int if it is a positive integer, else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"Argument `{name}` must be a positive int. "
            f"Received: {name}={value!r} (of type {type(value).__name__})"
        )
    if value <= 0:
        raise ValueError(
            f"Argument `{name}` must be a positive int (rows per forward "
            f"pass), e.g. 32. Received: {name}={value!r}"
        )
    return int(value)


def check_non_negative_int(value: object, name: str) -> int:
    """Returns `value` as an int if it is an integer >= 0, else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(
            f"Argument `{name}` must be an int >= 0. Received: {name}={value!r}"
        )
    return int(value)


def check_range(name: str, value: object, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, integer: bool = False) -> None:
    """Raises unless `value` is a number (an int if `integer`) within the bounds."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        noun = "an int" if integer else "a number"
        raise TypeError(f"Argument `{name}` must be {noun}. Received: {name}={value!r}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        raise ValueError(
            f"Argument `{name}` must be in {left}{low}, {high}{right}. Received: {name}={value!r}"
        )


def checked_lease(lease_seconds: object) -> float:
    """Returns `lease_seconds` as a float if it is a positive finite number, else raises."""
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, numbers.Real) or not (
            math.isfinite(lease_seconds) and lease_seconds > 0):
        raise ValueError(
            f"Argument `lease_seconds` must be a positive number of seconds. Received: lease_seconds={lease_seconds!r}")
    return float(lease_seconds)
