"""`MomentumScheduler`: sets the optimizer's momentum from a schedule each step."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras


class MomentumScheduler(keras.callbacks.Callback):
    """Sets momentum to `schedule(step)` before every training step.

    `step` is `optimizer.iterations` (logical steps, also under kadapt's
    accumulation). The optimizer must keep momentum in a variable, as
    `kadapt.optimizers.SGD` (momentum) and `kadapt.optimizers.Adam` (beta_1)
    do; Keras' own optimizers bake it into the compiled step, so changing it
    there would be silently ignored — that raises instead.

    The schedule yields to anyone else who sets the momentum mid-fit (the
    `kadapt.meta.MetaAdjuster`'s momentum actions, a callback of the user's):
    once the momentum before a step is not the value the schedule set, the
    scheduler stops setting it for the rest of that `fit`, so that change
    stands. `yielded_at_step` records the step (`None` while scheduling).

    Args:
        schedule: Callable `step -> momentum`: a Python function or a kadapt
            schedule such as `kadapt.CosineMomentum`.

    Example:

    ```python
    optimizer = kadapt.optimizers.SGD(kadapt.CosineAnnealing(0.1, 1e-3, 1000), momentum=0.9)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, callbacks=[kadapt.MomentumScheduler(kadapt.CosineMomentum(0.95, 0.85, 1000))])
    ```
    """

    def __init__(self, schedule: Callable[[Any], Any]) -> None:
        super().__init__()
        if not callable(schedule):
            raise TypeError(
                "Argument `schedule` must be a callable `step -> momentum`, e.g. "
                f"kadapt.CosineMomentum(0.95, 0.85, total_steps). Received: schedule={schedule!r}"
            )
        self.schedule = schedule

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = _inner(self.model.optimizer)
        if not isinstance(optimizer, _live_momentum_optimizers()):
            raise TypeError(
                "`MomentumScheduler` needs an optimizer whose momentum changes mid-fit; "
                f"{type(optimizer).__name__} compiles it as a constant. Use "
                "`kadapt.optimizers.SGD` or `kadapt.optimizers.Adam`. "
                f"Received: optimizer={type(optimizer).__name__}"
            )
        self._last_set = None
        self.yielded_at_step = None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.yielded_at_step is not None:
            return
        # Read through `self.model` every step: on JAX that writes the trainer's state back
        # into the variables, so the step and momentum read are current and the momentum set
        # here is what the next step reads (Keras syncs otherwise only at epoch ends).
        optimizer = _inner(self.model.optimizer)
        step = int(optimizer.iterations.numpy())
        current = float(optimizer.momentum.numpy())
        if self._last_set is not None and not math.isclose(current, self._last_set, rel_tol=1e-6):
            self.yielded_at_step = step
            return
        self._last_set = float(self.schedule(step))
        optimizer.momentum = self._last_set


def _inner(optimizer):
    """The optimizer that holds the momentum (the inner one of a `LossScaleOptimizer`)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def _live_momentum_optimizers():
    from kadapt.optimizers.adam import Adam
    from kadapt.optimizers.sgd import SGD

    return (Adam, SGD)
