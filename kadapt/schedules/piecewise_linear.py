"""`PiecewiseLinear`: a learning rate interpolated linearly between knots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kadapt")
class PiecewiseLinear(keras.optimizers.schedules.LearningRateSchedule):
    """Linear interpolation through the knots `(boundaries[i], values[i])`.

    For b_i <= step <= b_(i+1),

        lr = v_i + (v_(i+1) - v_i) * (step - b_i) / (b_(i+1) - b_i),

    `values[0]` before the first knot and `values[-1]` after the last. The
    speed records' triangular schedule is `PiecewiseLinear([0, w, T], [0, lr, 0])`.

    Args:
        boundaries: Increasing list of ints (steps), at least two.
        values: List of floats, as many as `boundaries`.
        name: String. Defaults to `"PiecewiseLinear"`.

    Example:

    ```python
    schedule = kadapt.schedules.PiecewiseLinear([0, 200, 1000], [0.0, 0.4, 0.0])
    optimizer = kadapt.optimizers.SGD(schedule, momentum=0.9, nesterov=True)
    ```
    """

    def __init__(self, boundaries: Sequence[int], values: Sequence[float], name: str = "PiecewiseLinear") -> None:
        boundaries, values = [int(b) for b in boundaries], [float(v) for v in values]
        if len(boundaries) < 2 or len(boundaries) != len(values):
            raise ValueError(
                "Arguments `boundaries` and `values` must be lists of the same length >= 2. "
                f"Received: boundaries={boundaries}, values={values}"
            )
        if any(b >= c for b, c in zip(boundaries, boundaries[1:])):
            raise ValueError(f"Argument `boundaries` must be increasing. Received: boundaries={boundaries}")
        self.boundaries, self.values, self.name = boundaries, values, name

    def __call__(self, step: Any) -> Any:
        step = ops.cast(step, "float32")
        rate = ops.convert_to_tensor(self.values[0], "float32")
        b, v = self.boundaries, self.values
        for b0, b1, v0, v1 in zip(b, b[1:], v, v[1:]):
            fraction = ops.clip((step - b0) / (b1 - b0), 0.0, 1.0)
            rate = ops.where(step >= b0, v0 + (v1 - v0) * fraction, rate)
        return rate

    def get_config(self) -> dict[str, Any]:
        return {"boundaries": self.boundaries, "values": self.values, "name": self.name}
