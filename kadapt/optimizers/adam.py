"""Adam whose beta_1 (its momentum) and learning-rate multiplier live in variables."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from kadapt.optimizers.live_variables import LearningRateMultiplier
from kadapt.optimizers.live_variables import RestartableMoments
from kadapt.optimizers.live_variables import scalar_variable
from kadapt.optimizers.live_variables import slot_key
from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class Adam(RestartableMoments, LearningRateMultiplier, keras.optimizers.Optimizer):
    """Drop-in for `keras.optimizers.Adam` whose `beta_1` can change mid-fit.

    Keras 3's Adam compiles `beta_1` as a Python float, like SGD's momentum.
    Here `beta_1` (exposed also as `momentum`, so `kadapt.MomentumScheduler`
    drives it) and `learning_rate_multiplier` are variables. The update is
    Keras' Adam; its bias correction uses the current beta_1 (1 - beta_1^t),
    which is exact while beta_1 is constant. On JAX, assign them from a
    callback through `self.model.optimizer` (see `kadapt.optimizers.SGD`).
    The correction counts from the step the moments last started from zero
    (`RestartableMoments`): after a rollback that restarts them, the steps
    are a fresh Adam's.

    Args:
        learning_rate: Float or `LearningRateSchedule`. Defaults to `0.001`.
        beta_1: Float in [0, 1). Defaults to `0.9`.
        beta_2: Float in [0, 1). Defaults to `0.999`.
        epsilon: Positive float. Defaults to `1e-7`.
        learning_rate_multiplier: Positive float. Defaults to `1.0`.
        **kwargs: Passed to `keras.optimizers.Optimizer` (`weight_decay`, ...).

    Example:

    ```python
    optimizer = kadapt.optimizers.Adam(1e-3)
    optimizer.beta_1 = 0.85  # takes effect at the next step
    ```
    """

    def __init__(self, learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 0.001,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                 learning_rate_multiplier: float = 1.0, name: str = "adam", **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        check_range("beta_1", beta_1, low=0.0, high=1.0, high_open=True)
        check_range("beta_2", beta_2, low=0.0, high=1.0, high_open=True)
        check_range("epsilon", epsilon, low=0.0, low_open=True)
        self.beta_2, self.epsilon = float(beta_2), float(epsilon)
        self._beta_1 = scalar_variable(self, "beta_1", beta_1)
        self._init_multiplier(learning_rate_multiplier)

    @property
    def beta_1(self) -> keras.Variable:
        """The beta_1 variable; assign a float to change it live."""
        return self._beta_1

    @beta_1.setter
    def beta_1(self, value: float) -> None:
        check_range("beta_1", float(value), low=0.0, high=1.0, high_open=True)
        self._beta_1.assign(value)

    momentum = beta_1

    def build(self, variables: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(variables)
        self._moments = {slot_key(v): self.add_variable_from_reference(v, "momentum") for v in variables}
        self._second = {slot_key(v): self.add_variable_from_reference(v, "velocity") for v in variables}
        self._init_moments_from()

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        dtype = variable.dtype
        rate = self._multiplied(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = self.moments_step(dtype)
        beta_1 = ops.cast(self._beta_1, dtype)
        alpha = rate * ops.sqrt(1 - ops.power(self.beta_2, step)) / (1 - ops.power(beta_1, step))
        m, v = self._moments[slot_key(variable)], self._second[slot_key(variable)]
        self.assign_add(m, (gradient - m) * (1 - beta_1))
        self.assign_add(v, (ops.square(gradient) - v) * (1 - self.beta_2))
        self.assign_sub(variable, m * alpha / (ops.sqrt(v) + self.epsilon))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            beta_1=float(ops.convert_to_numpy(self._beta_1)),
            beta_2=self.beta_2,
            epsilon=self.epsilon,
            learning_rate_multiplier=float(ops.convert_to_numpy(self._multiplier)),
        )
        return config
