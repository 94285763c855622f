"""`ScheduleFreeEvaluation`: `fit`'s validation at x, Schedule-Free's average."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import keras

from kadapt.validation import check_non_negative_int


def schedule_free_optimizer(model: keras.Model) -> Any:
    """The model's Schedule-Free optimizer (inside a loss-scale wrapper too), else `None`."""
    from kadapt.optimizers.schedule_free import ScheduleFree

    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return optimizer if isinstance(optimizer, ScheduleFree) else None


@contextlib.contextmanager
def at_evaluation_point(model: keras.Model) -> Iterator[None]:
    """Inside, the model holds x where its Schedule-Free optimizer has it at y;
    y comes back exactly on exit. With another optimizer, nothing changes."""
    optimizer = schedule_free_optimizer(model)
    if optimizer is None or optimizer.at_evaluation_point:
        yield
        return
    optimizer.move_to_evaluation_point(model.trainable_variables)
    try:
        yield
    finally:
        optimizer.move_to_gradient_point(model.trainable_variables)


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

    With `batches`, BatchNorm moving statistics are recomputed at x as the
    reference does (`kadapt.optimizers.recompute_batch_statistics`: the mean
    over training-mode passes of the first `steps` of them) before each
    validation and at the end of `fit`: statistics gathered at y are not
    those of x. List it after a callback that restores weights at the end
    (`EarlyStopping(restore_best_weights=True)`), so the restored x gets
    its own statistics. Training is unaffected: a training step normalizes
    by its batch's statistics, not the moving ones.

    Args:
        batches: Iterable of training inputs or `(x, y, ...)` batches (a
            `tf.data.Dataset`, iterated afresh each time), or `None`.
            Defaults to `None` (statistics left as training gathered them).
        steps: Non-negative int. At most this many batches per recompute.
            Defaults to `50` (the reference's).

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.ScheduleFreeAdamW(), loss="mse")
    model.fit(x, y, validation_data=(x_val, y_val),
              callbacks=[kadapt.callbacks.ScheduleFreeEvaluation()])
    ```
    """

    def __init__(self, batches: Iterable[Any] | None = None, steps: int = 50) -> None:
        super().__init__()
        self.batches, self.steps = batches, check_non_negative_int(steps, "steps")
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
            self._recompute_batch_statistics()

    def on_test_begin(self, logs: dict | None = None) -> None:
        optimizer = schedule_free_optimizer(self.model)
        self._swapped = optimizer is not None and not optimizer.at_evaluation_point
        if self._swapped:
            optimizer.move_to_evaluation_point(self.model.trainable_variables)
            self._recompute_batch_statistics()

    def on_test_end(self, logs: dict | None = None) -> None:
        if self._swapped:
            schedule_free_optimizer(self.model).move_to_gradient_point(self.model.trainable_variables)
            self._swapped = False

    def _recompute_batch_statistics(self):
        if self.batches is not None:
            from kadapt.optimizers.batch_statistics import recompute_batch_statistics

            recompute_batch_statistics(self.model, self.batches, self.steps)


def with_schedule_free_evaluation(model: keras.Model, callbacks: list | None) -> list | None:
    """`callbacks` plus a `ScheduleFreeEvaluation` if the model's optimizer is
    Schedule-Free and none is there yet; else `callbacks` unchanged."""
    if schedule_free_optimizer(model) is None:
        return callbacks
    callbacks = list(callbacks or [])
    if not any(isinstance(c, ScheduleFreeEvaluation) for c in callbacks):
        callbacks.append(ScheduleFreeEvaluation())
    return callbacks
