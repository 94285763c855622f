"""SGD whose momentum and learning-rate multiplier live in variables."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from kadapt.optimizers.live_variables import LearningRateMultiplier
from kadapt.optimizers.live_variables import scalar_variable
from kadapt.optimizers.live_variables import slot_key
from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class SGD(LearningRateMultiplier, keras.optimizers.Optimizer):
    """Drop-in for `keras.optimizers.SGD` whose momentum can change mid-fit.

    Keras 3's SGD compiles `momentum` into the training step as a Python
    float: assigning `optimizer.momentum` in a callback is silently ignored.
    Here `momentum` and `learning_rate_multiplier` are variables read by the
    compiled step, so assigning either property takes effect at the next
    step. On JAX, assign them from a callback through `self.model.optimizer`:
    reading `self.model` makes Keras' JAX trainer write its state back into
    the variables and read them again before the next step. The applied rate
    is `learning_rate(step) * learning_rate_multiplier`, which also works
    when `learning_rate` is a schedule. The update is Keras' heavy-ball form:

        velocity = momentum * velocity - lr * gradient
        w += velocity                              (nesterov=False)
        w += momentum * velocity - lr * gradient   (nesterov=True)

    The velocity is in units of the weights, so a change of the rate (a
    schedule's, or the multiplier's) acts on the gradient's share only: the
    velocity built before runs out over ~1 / (1 - momentum) steps. PyTorch's
    SGD keeps it in units of the gradient (`p -= lr * buf`), where a cut acts
    at once; at a constant rate the two are the same.

    Args:
        learning_rate: Float or `LearningRateSchedule`. Defaults to `0.01`.
        momentum: Float in [0, 1). Defaults to `0.0`.
        nesterov: Bool. Nesterov momentum. Defaults to `False`.
        learning_rate_multiplier: Positive float. Defaults to `1.0`.
        **kwargs: Passed to `keras.optimizers.Optimizer` (`weight_decay`,
            `clipnorm`, `use_ema`, `name`, ...). Weight decay is decoupled as in
            Keras: w -= lr * weight_decay * w.

    Example:

    ```python
    optimizer = kadapt.optimizers.SGD(0.1, momentum=0.9, nesterov=True)
    optimizer.momentum = 0.95  # takes effect at the next step, even mid-fit
    ```
    """

    def __init__(self, learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 0.01,
                 momentum: float = 0.0, nesterov: bool = False, learning_rate_multiplier: float = 1.0,
                 name: str = "SGD", **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        check_range("momentum", momentum, low=0.0, high=1.0, high_open=True)
        self.nesterov = bool(nesterov)
        self._momentum = scalar_variable(self, "momentum", momentum)
        self._init_multiplier(learning_rate_multiplier)

    @property
    def momentum(self) -> keras.Variable:
        """The momentum variable; assign a float to change it live."""
        return self._momentum

    @momentum.setter
    def momentum(self, value: float) -> None:
        check_range("momentum", float(value), low=0.0, high=1.0, high_open=True)
        self._momentum.assign(value)

    def build(self, variables: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(variables)
        # Velocities always exist, so momentum can rise from 0 mid-run.
        self._velocity_slots = {
            slot_key(v): self.add_variable_from_reference(v, "velocity") for v in variables
        }

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        dtype = variable.dtype
        rate = self._multiplied(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        momentum = ops.cast(self._momentum, dtype)
        velocity = self._velocity_slots[slot_key(variable)]
        self.assign(velocity, momentum * velocity - rate * gradient)
        if self.nesterov:
            self.assign_add(variable, momentum * velocity - rate * gradient)
        else:
            self.assign_add(variable, velocity)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            momentum=float(ops.convert_to_numpy(self._momentum)),
            nesterov=self.nesterov,
            learning_rate_multiplier=float(ops.convert_to_numpy(self._multiplier)),
        )
        return config

