"""The live learning-rate channel on any Keras optimizer: its rate times a multiplier variable."""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np

from kadapt._compat import learning_rate_as_set
from kadapt.optimizers.live_variables import scalar_variable
from kadapt.validation import check_range

Schedule = keras.optimizers.schedules.LearningRateSchedule


@keras.saving.register_keras_serializable(package="kadapt")
class MultipliedSchedule(Schedule):
    """`learning_rate(step) * multiplier`: a rate or schedule scaled by a variable.

    `kadapt.optimizers.live_rate` puts one under a Keras optimizer, with the
    multiplier an optimizer variable: the compiled step reads it (on JAX as
    part of the optimizer's state), so assigning it takes effect at the next
    step without a retrace. Saved, the multiplier is written as the float it
    holds; loaded, the rate it gives is the same, and `live_rate` makes it a
    variable again.

    Args:
        learning_rate: Float or `LearningRateSchedule`. The rate to scale.
        multiplier: Positive float, or a scalar `keras.Variable`. Defaults to `1.0`.

    Example:

    ```python
    schedule = MultipliedSchedule(keras.optimizers.schedules.CosineDecay(0.1, 1000), 0.5)
    float(schedule(0))  # 0.05
    ```
    """

    def __init__(self, learning_rate: float | Schedule, multiplier: float | keras.Variable = 1.0) -> None:
        if not isinstance(learning_rate, (float, Schedule)):
            raise TypeError("Argument `learning_rate` must be a float or a LearningRateSchedule. "
                            f"Received: learning_rate={learning_rate!r}")
        if not isinstance(multiplier, keras.Variable):
            check_range("multiplier", multiplier, low=0.0, low_open=True)
        self.learning_rate, self.multiplier = learning_rate, multiplier

    def __call__(self, step: Any) -> Any:
        rate = self.learning_rate(step) if isinstance(self.learning_rate, Schedule) else self.learning_rate
        return keras.ops.cast(rate, "float32") * keras.ops.cast(self.multiplier, "float32")

    def get_config(self) -> dict[str, Any]:
        rate = self.learning_rate
        return {"learning_rate": keras.optimizers.schedules.serialize(rate) if isinstance(rate, Schedule) else rate,
                "multiplier": float(keras.ops.convert_to_numpy(self.multiplier))}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MultipliedSchedule:
        rate = config["learning_rate"]
        if isinstance(rate, dict):
            rate = keras.optimizers.schedules.deserialize(rate)
        return cls(rate, config["multiplier"])


def live_rate(optimizer: keras.optimizers.Optimizer) -> keras.Variable:
    """The optimizer's learning-rate multiplier variable, installed on first call.

    kadapt's `SGD` and `Adam` have one (`learning_rate_multiplier`); any other
    Keras optimizer gets one here: its learning rate (a float or a
    `LearningRateSchedule`) becomes `MultipliedSchedule(rate, multiplier)`,
    the multiplier a new optimizer variable at 1, so the steps are the
    optimizer's own until it is changed. The applied rate is then
    `optimizer.learning_rate`, and Keras' `learning_rate` setter refuses a
    float, as for any schedule: change the rate through the multiplier.
    Install before the train function is traced (a traced step holds the
    schedule it was traced with: rebuild it with
    `model.make_train_function(force=True)`) and before taking rollback
    points (the optimizer gains a variable).

    Args:
        optimizer: `keras.optimizers.Optimizer` whose learning rate is a float
            or a `LearningRateSchedule` (a `LossScaleOptimizer`: its inner one's).

    Returns:
        The scalar `keras.Variable` the applied rate is multiplied by.

    Example:

    ```python
    optimizer = keras.optimizers.AdamW(1e-3)
    live_rate(optimizer).assign(0.1)  # the next step at 1e-4
    ```
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    multiplier = learning_rate_multiplier(optimizer)
    if multiplier is not None:
        return multiplier
    rate = learning_rate_as_set(optimizer)
    if isinstance(rate, MultipliedSchedule):  # loaded from a file: its multiplier a float
        rate, value = rate.learning_rate, rate.multiplier
    elif isinstance(rate, keras.Variable):
        rate, value = float(keras.ops.convert_to_numpy(rate)), 1.0
    elif isinstance(rate, Schedule):
        value = 1.0
    else:
        raise ValueError("A live learning rate needs a float or a LearningRateSchedule: wrap the callable in a "
                         f"keras.optimizers.schedules.LearningRateSchedule. Received: learning_rate={rate!r}")
    multiplier = scalar_variable(optimizer, "learning_rate_multiplier", value)
    optimizer.learning_rate = MultipliedSchedule(rate, multiplier)
    return multiplier


def learning_rate_multiplier(optimizer: keras.optimizers.Optimizer) -> keras.Variable | None:
    """The optimizer's live multiplier (kadapt's, or one `live_rate` installed); `None` without one."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    own = getattr(optimizer, "learning_rate_multiplier", None)
    if own is not None:
        return own
    rate = learning_rate_as_set(optimizer)
    if isinstance(rate, MultipliedSchedule) and isinstance(rate.multiplier, keras.Variable):
        return rate.multiplier
    return None


def live_rate_of(model: keras.Model) -> keras.Variable:
    """`live_rate(model.optimizer)`, with the model's train function rebuilt where it installs one."""
    installed = learning_rate_multiplier(model.optimizer) is None
    multiplier = live_rate(model.optimizer)
    if installed:
        model.make_train_function(force=True)
    return multiplier


def set_learning_rate_multiplier(optimizer: keras.optimizers.Optimizer, value: float) -> None:
    """Assigns the live multiplier (`live_rate(optimizer)`); the next step applies it."""
    check_range("learning_rate_multiplier", float(value), low=0.0, low_open=True)
    live_rate(optimizer).assign(value)


def reload_live_rate(model: keras.Model, path: str | os.PathLike) -> bool:
    """Restores the optimizer state of `model`, loaded from the `.keras` file
    `path`, where the file holds a live rate's multiplier among its optimizer variables.

    Saved, the multiplier is written twice: as a float in the optimizer's
    config, and as one of its variables. Loaded, Keras builds the optimizer
    from its config, the multiplier a float, so the file has one variable
    more than the optimizer and Keras skips them all (momentum, iterations:
    the state `kadapt.load_model(run, for_training=True)` promises).
    Here the multiplier becomes a variable again where it was installed:
    before the optimizer was built (as `kadapt train` and `FilterMuon` do),
    or after (a callback installing it in `fit`); then the whole state is
    loaded again, and kept where the multiplier read back is the float the
    config holds.

    Returns:
        Whether the state was restored (False where the file holds no live rate).
    """
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    rate = learning_rate_as_set(inner) if inner is not None else None
    if not isinstance(rate, MultipliedSchedule) or isinstance(rate.multiplier, keras.Variable):
        return False
    value = np.float32(rate.multiplier)
    if inner.built and _loaded(model, path, live_rate(inner), value):  # installed after the build
        return True
    compiled = keras.saving.deserialize_keras_object(model.get_compile_config())
    multiplier = live_rate(compiled["optimizer"])  # installed before the build
    model.compile(**compiled)
    model.optimizer.build(model.trainable_variables)
    return _loaded(model, path, multiplier, value)


def _loaded(model, path, multiplier, value):
    try:
        model.load_weights(path)
    except ValueError:  # a variable of another shape at the multiplier's place
        return False
    return bool(np.float32(keras.ops.convert_to_numpy(multiplier)) == value)
