"""`FilterMuon`: Keras' Muon on convolution filters, as airbench trains them."""

from __future__ import annotations

import math
import re
from typing import Any

import keras

from kadapt._compat import learning_rate_as_set
from kadapt._compat import muon_takes_adamw
from kadapt.optimizers.live_rate import live_rate
from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class FilterMuon(keras.optimizers.Muon):
    """Keras' `Muon` whose orthogonalized step trains the convolution filters.

    Keras' Muon takes its Newton-Schulz step on variables of exactly 2
    dimensions and its AdamW step on the rest, a convolution's filters
    included. airbench (Keller Jordan's CIFAR-10 speedrun) does the
    opposite: each filter bank, flattened to a matrix, takes the Muon step;
    batch normalization, biases and the classifier the other one. Here a
    filter of shape `(*window, in, out)` (ndim 3, 4 or 5: Conv1D, Conv2D,
    Conv3D) is the matrix G of shape `(prod(window) * in, out)`; its step is

        m <- momentum * m + g
        u <- g + momentum * m                      (Nesterov)
        w <- w - lr * NS5(u) * sqrt(max(rows, out)) * rms_rate

    with NS5 Keras' quintic Newton-Schulz iteration (`ns_steps` of it) and
    `rms_rate` its step-size match to Adam's (Keras' `lr_adjust`). Every
    variable of fewer dimensions (biases, batch normalization, dense
    kernels, the classifier's among them) takes Keras' AdamW step at
    `learning_rate * adam_lr_ratio`; so does a filter whose path matches
    `exclude_layers`.

    The applied rate is `learning_rate * learning_rate_multiplier`, the
    multiplier an optimizer variable from the start (`kadapt.optimizers.live_rate`
    returns it), so a saved optimizer loads with as many variables as it
    saved, its state kept.

    Args:
        learning_rate: Float or `LearningRateSchedule`. Defaults to `0.001`.
        learning_rate_multiplier: Positive float. Defaults to `1.0`.
        **kwargs: Keras' `Muon`'s other arguments (`momentum`, `ns_steps`,
            `rms_rate`, `exclude_layers`, `weight_decay`, ...).

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.FilterMuon(0.01), loss="mse")
    ```
    """

    def __init__(self, learning_rate: float | Any = 0.001, learning_rate_multiplier: float = 1.0,
                 **kwargs: Any) -> None:
        check_range("learning_rate_multiplier", learning_rate_multiplier, low=0.0, low_open=True)
        super().__init__(learning_rate=learning_rate, **kwargs)
        live_rate(self).assign(learning_rate_multiplier)  # the rate becomes MultipliedSchedule(rate, multiplier)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        schedule = learning_rate_as_set(self)  # the MultipliedSchedule live_rate installed: saved as its two parts
        rate = schedule.learning_rate
        config["learning_rate"] = keras.optimizers.schedules.serialize(rate) if isinstance(
            rate, keras.optimizers.schedules.LearningRateSchedule) else rate
        config["learning_rate_multiplier"] = float(keras.ops.convert_to_numpy(schedule.multiplier))
        return config

    # Keras' Muon decides every per-variable choice (its slots, its step, its decay) through this one
    # method, so overriding it is the whole change of rule.
    def _should_use_adamw(self, variable: keras.Variable) -> bool:
        if len(variable.shape) not in (3, 4, 5):
            return True
        return any(re.search(keyword, variable.path) for keyword in self.exclude_layers)

    def zeropower_via_newtonschulz5(self, x: Any, steps: int) -> Any:
        """Keras' Newton-Schulz iteration on `x` flattened to `(rows, out)`, reshaped back."""
        shape = tuple(x.shape)
        matrix = keras.ops.reshape(x, (-1, shape[-1]))
        return keras.ops.reshape(super().zeropower_via_newtonschulz5(matrix, steps), shape)

    def lr_adjust(self, x: Any) -> Any:
        """`x * sqrt(max(rows, out)) * rms_rate` for the flattened matrix (Keras' rule for a 2-D one)."""
        if self.rms_rate is None:
            return x
        rows, columns = math.prod(x.shape[:-1]), x.shape[-1]
        return x * math.sqrt(max(rows, columns)) * self.rms_rate


def muon_variables(optimizer: keras.optimizers.Muon, variables: list[keras.Variable]) -> list[keras.Variable]:
    """Those of `variables` that `optimizer` (Keras' `Muon` or `FilterMuon`) gives its Muon step."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return [variable for variable in variables if not muon_takes_adamw(optimizer, variable)]
