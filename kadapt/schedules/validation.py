"""Range checks with Keras-style messages."""

import numbers


def check_range(name, value, low=None, high=None, low_open=False, high_open=False, integer=False):
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
