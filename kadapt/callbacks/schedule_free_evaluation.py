"""`ScheduleFreeEvaluation`: `fit`'s validation at x, Schedule-Free's average."""

from __future__ import annotations

from typing import Any

import keras


def schedule_free_optimizer(model: keras.Model) -> Any:
    """The model's Schedule-Free optimizer (inside a loss-scale wrapper too), else `None`."""
    from kadapt.optimizers.schedule_free import ScheduleFree

    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return optimizer if isinstance(optimizer, ScheduleFree) else None


class ScheduleFreeEvaluation(keras.callbacks.Callback):
    """Evaluates at x and trains at y with a Schedule-Free optimizer.

    Schedule-Free optimizers take gradients at y but x, the average, is the
    model to judge and keep. Keras calls the optimizer's
    `finalize_variable_values` at the end of `fit`, which leaves x in the
    model; this callback does the rest, as `keras.callbacks.SwapEMAWeights`
    does for EMA: `fit`'s validation sees x (swapped in at `on_test_begin`,
    y restored exactly at `on_test_end`), and the next `fit` starts from y
    again exactly (`on_train_begin`). It also leaves x at the end of `fit`
    where a `keras.optimizers.LossScaleOptimizer` (mixed precision) wraps the
    optimizer: that wrapper does not pass `finalize_variable_values` on.
    kadapt's accumulating models
    (`kadapt.accumulate`) add it to `fit` themselves. With another optimizer
    it does nothing.

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.ScheduleFreeAdamW(), loss="mse")
    model.fit(x, y, validation_data=(x_val, y_val),
              callbacks=[kadapt.callbacks.ScheduleFreeEvaluation()])
    ```
    """

    def __init__(self) -> None:
        super().__init__()
        self._swapped = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        optimizer = schedule_free_optimizer(self.model)
        if optimizer is not None:
            optimizer.move_to_gradient_point(self.model.trainable_variables)

    def on_train_end(self, logs: dict | None = None) -> None:
        # Keras' `LossScaleOptimizer` does not pass `finalize_variable_values` on.
        optimizer = schedule_free_optimizer(self.model)
        if optimizer is not None:
            optimizer.move_to_evaluation_point(self.model.trainable_variables)

    def on_test_begin(self, logs: dict | None = None) -> None:
        optimizer = schedule_free_optimizer(self.model)
        self._swapped = optimizer is not None and not optimizer.at_evaluation_point
        if self._swapped:
            optimizer.move_to_evaluation_point(self.model.trainable_variables)

    def on_test_end(self, logs: dict | None = None) -> None:
        if self._swapped:
            schedule_free_optimizer(self.model).move_to_gradient_point(self.model.trainable_variables)
            self._swapped = False


def with_schedule_free_evaluation(model: keras.Model, callbacks: list | None) -> list | None:
    """`callbacks` plus a `ScheduleFreeEvaluation` if the model's optimizer is
    Schedule-Free and none is there yet; else `callbacks` unchanged."""
    if schedule_free_optimizer(model) is None:
        return callbacks
    callbacks = list(callbacks or [])
    if not any(isinstance(c, ScheduleFreeEvaluation) for c in callbacks):
        callbacks.append(ScheduleFreeEvaluation())
    return callbacks
