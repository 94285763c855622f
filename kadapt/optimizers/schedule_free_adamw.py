"""Schedule-Free AdamW: Adam whose iterates are averaged instead of scheduled."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from kadapt.optimizers.live_variables import RestartableMoments
from kadapt.optimizers.live_variables import slot_key
from kadapt.optimizers.schedule_free import ScheduleFree
from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class ScheduleFreeAdamW(RestartableMoments, ScheduleFree):
    """Schedule-Free AdamW (PyPI `schedulefree` 1.4.1, `AdamWScheduleFree`).

    Needs no learning-rate schedule: it takes gradients at
    y = beta_1 * x + (1 - beta_1) * z, steps z by Adam's normalized gradient
    (no first moment: beta_1 is the interpolation) and keeps x, the weighted
    average of z (see `kadapt.optimizers.schedule_free`):

        v = beta_2 * v + (1 - beta_2) * g^2
        d = g / (sqrt(v / (1 - beta_2^t)) + epsilon) + weight_decay * y

    The model's variables hold y while training and x after `fit` (so
    `evaluate`, `predict` and `save` after `fit` see x). To have `fit`'s own
    validation see x, pass `kadapt.callbacks.ScheduleFreeEvaluation()`;
    kadapt's accumulating models add it themselves. BatchNorm statistics
    gathered at y are not those of x: see
    `kadapt.optimizers.recompute_batch_statistics`.

    Args:
        learning_rate: Positive float, not a schedule. Defaults to `0.0025`.
        beta_1: Float in (0, 1), the interpolation beta. Defaults to `0.9`.
        beta_2: Float in [0, 1). Defaults to `0.999`.
        epsilon: Positive float. Defaults to `1e-8`.
        weight_decay: Non-negative float, applied at y. Defaults to `0.0`.
        warmup_steps: Non-negative int. Linear warmup of the rate. Defaults to `0`.
        r: Non-negative float. Polynomial weighting power of the average. Defaults to `0.0`.
        weight_lr_power: Non-negative float. The average weights steps by
            max-rate-so-far to this power. Defaults to `2.0`.
        learning_rate_multiplier: Positive float, a variable that live callbacks
            may change. Defaults to `1.0`.
        **kwargs: Passed to `keras.optimizers.Optimizer` (`clipnorm`, `name`, ...).

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.ScheduleFreeAdamW(warmup_steps=100), loss="mse")
    model.fit(x, y, callbacks=[kadapt.callbacks.ScheduleFreeEvaluation()])
    ```
    """

    def __init__(self, learning_rate: float = 0.0025, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-8, weight_decay: float = 0.0, warmup_steps: int = 0,
                 r: float = 0.0, weight_lr_power: float = 2.0, learning_rate_multiplier: float = 1.0,
                 name: str = "schedule_free_adamw", **kwargs: Any) -> None:
        check_range("beta_1", beta_1, low=0.0, high=1.0, low_open=True, high_open=True)
        check_range("beta_2", beta_2, low=0.0, high=1.0, high_open=True)
        check_range("epsilon", epsilon, low=0.0, low_open=True)
        super().__init__(learning_rate, weight_decay, warmup_steps, r, weight_lr_power,
                         learning_rate_multiplier, name, **kwargs)
        self.beta_1 = self._interpolation = float(beta_1)
        self.beta_2, self.epsilon = float(beta_2), float(epsilon)

    def build(self, variables: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(variables)
        self._second = {slot_key(v): self.add_variable_from_reference(v, "velocity") for v in variables}
        self._init_moments_from()

    def direction(self, gradient: Any, key: Any) -> Any:
        v = self._second[key]
        v_new = self.beta_2 * v + (1 - self.beta_2) * ops.square(gradient)
        self.assign(v, v_new)
        correction = 1 - ops.power(ops.cast(self.beta_2, gradient.dtype), self.moments_step(gradient.dtype))
        return gradient / (ops.sqrt(v_new / correction) + self.epsilon)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        return config
