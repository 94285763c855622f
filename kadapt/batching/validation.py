"""Argument checks shared by the batching modules."""

import numbers


def check_micro_batch_size(value, name="micro_batch_size"):
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


def check_non_negative_int(value, name):
    """Returns `value` as an int if it is an integer >= 0, else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(
            f"Argument `{name}` must be an int >= 0. Received: {name}={value!r}"
        )
    return int(value)
