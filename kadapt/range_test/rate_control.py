"""Setting the rate of each step of the range test on the model's own optimizer.

The applied rate at step `i` is `rates[i]`, whatever the optimizer holds:

- a float rate (a variable): assigned before each step;
- a `LearningRateSchedule` (or another callable): swapped, for the test, for
  `SweepSchedule`, which computes `rates[i]` in the compiled step from
  `iterations` (reset to 0 for the test); the train function is rebuilt
  before the test and after it, when the schedule is back. The test so
  measures constant rates; the suggestion is the rate to give the
  schedule's peak (with kadapt's optimizers: `learning_rate_multiplier =
  suggestion / peak`);
- kadapt's optimizers: `learning_rate_multiplier` is 1 during the test.

Iterations, the rate variable and the multiplier are optimizer variables:
the caller's snapshot restores them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import keras

from kadapt._compat import learning_rate_as_set


class SweepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`start * (stop / start) ** (step / (num_steps - 1))`, the range test's sweep."""

    def __init__(self, start: float, stop: float, num_steps: int) -> None:
        self.start, self.stop, self.num_steps = start, stop, num_steps

    def __call__(self, step: Any) -> Any:
        fraction = keras.ops.cast(step, "float32") / (self.num_steps - 1)
        return self.start * keras.ops.exp(fraction * math.log(self.stop / self.start))

    def get_config(self) -> dict[str, Any]:
        return {"start": self.start, "stop": self.stop, "num_steps": self.num_steps}


@contextlib.contextmanager
def swept_rate(model: keras.Model, start: float, stop: float,
               num_steps: int) -> Iterator[Callable[[float], None]]:
    """Yields `set_rate(rate)`, to call before each step; undoes the swap on exit."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)  # a LossScaleOptimizer's
    if getattr(optimizer, "learning_rate_multiplier", None) is not None:
        optimizer.learning_rate_multiplier = 1.0
    original = learning_rate_as_set(optimizer)  # the schedule must come back as the same object
    if isinstance(original, keras.Variable):
        yield _assigner(optimizer)
        return
    optimizer.learning_rate = SweepSchedule(start, stop, num_steps)
    optimizer.iterations.assign(0)
    model.make_train_function(force=True)
    try:
        yield lambda rate: None
    finally:
        optimizer.learning_rate = original
        model.make_train_function(force=True)


def _assigner(optimizer):
    def set_rate(rate):
        optimizer.learning_rate = rate
    return set_rate
