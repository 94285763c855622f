"""Schedule-Free SGD: SGD whose iterates are averaged instead of scheduled."""

from __future__ import annotations

from typing import Any

import keras

from kadapt.optimizers.schedule_free import ScheduleFree
from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class ScheduleFreeSGD(ScheduleFree):
    """Schedule-Free SGD (PyPI `schedulefree` 1.4.1, `SGDScheduleFree`).

    Needs no learning-rate schedule: it takes gradients at
    y = momentum * x + (1 - momentum) * z, steps z by plain SGD and keeps x, the
    weighted average of z (see `kadapt.optimizers.schedule_free`). Weight decay
    is added to the gradient at y. The model's variables hold y while training
    and x after `fit` (so `evaluate`, `predict` and `save` after `fit` see x).
    To have `fit`'s own validation see x, pass
    `kadapt.callbacks.ScheduleFreeEvaluation()`; kadapt's accumulating models add
    it themselves. BatchNorm statistics gathered at y are not those of x: see
    `kadapt.optimizers.recompute_batch_statistics`.

    Args:
        learning_rate: Positive float, not a schedule. Defaults to `1.0`.
        momentum: Float in (0, 1), the interpolation beta. Defaults to `0.9`.
        weight_decay: Non-negative float, L2 added to the gradient at y. Defaults to `0.0`.
        warmup_steps: Non-negative int. Linear warmup of the rate. Defaults to `0`.
        r: Non-negative float. Polynomial weighting power of the average. Defaults to `0.0`.
        weight_lr_power: Non-negative float. The average weights steps by
            max-rate-so-far to this power. Defaults to `2.0`.
        learning_rate_multiplier: Positive float, a variable that live callbacks
            may change. Defaults to `1.0`.
        **kwargs: Passed to `keras.optimizers.Optimizer` (`clipnorm`, `name`, ...).

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.ScheduleFreeSGD(0.5, warmup_steps=100), loss="mse")
    model.fit(x, y, callbacks=[kadapt.callbacks.ScheduleFreeEvaluation()])
    ```
    """

    def __init__(self, learning_rate: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0,
                 warmup_steps: int = 0, r: float = 0.0, weight_lr_power: float = 2.0,
                 learning_rate_multiplier: float = 1.0, name: str = "schedule_free_sgd",
                 **kwargs: Any) -> None:
        check_range("momentum", momentum, low=0.0, high=1.0, low_open=True, high_open=True)
        super().__init__(learning_rate, weight_decay, warmup_steps, r, weight_lr_power,
                         learning_rate_multiplier, name, **kwargs)
        self.momentum = self._interpolation = float(momentum)

    def direction(self, gradient: Any, key: Any) -> Any:
        return gradient

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(momentum=self.momentum)
        return config
