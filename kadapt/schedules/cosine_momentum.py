"""`CosineMomentum`: momentum mirrored to the cosine learning rate."""

from __future__ import annotations

from typing import Any

import keras

from kadapt.schedules.cosine_annealing import CosineAnnealing
from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class CosineMomentum:
    """Momentum that is low while the learning rate is high, and back.

    With c_t the cosine annealing of the same steps scaled to [0, 1]
    (`CosineAnnealing(1, 0, total_steps, warmup_steps)`),

        momentum_t = momentum_max - (momentum_max - momentum_min) * c_t,

    so during warmup momentum falls from `momentum_max` to `momentum_min`, then
    rises back along the cosine while the learning rate anneals (e.g.
    0.95 -> 0.85 -> 0.95). Call it with the step; use it with
    `kadapt.MomentumScheduler`.

    Args:
        momentum_max: Float in [0, 1). Momentum where the learning rate is lowest.
        momentum_min: Float in [0, momentum_max]. Momentum at the peak rate.
        total_steps: Positive int. Steps of the whole schedule.
        warmup_steps: Int in [0, total_steps). Defaults to `0`.

    Example:

    ```python
    momentum = kadapt.CosineMomentum(0.95, 0.85, total_steps=1000, warmup_steps=100)
    float(momentum(100))  # 0.85
    ```
    """

    def __init__(self, momentum_max: float, momentum_min: float, total_steps: int, warmup_steps: int = 0) -> None:
        check_range("momentum_max", momentum_max, low=0.0, high=1.0, high_open=True)
        check_range("momentum_min", momentum_min, low=0.0, high=momentum_max)
        self.momentum_max, self.momentum_min = float(momentum_max), float(momentum_min)
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self._shape = CosineAnnealing(1.0, 0.0, total_steps, warmup_steps)

    def __call__(self, step: Any) -> Any:
        spread = self.momentum_max - self.momentum_min
        return self.momentum_max - spread * self._shape(step)

    def get_config(self) -> dict[str, Any]:
        return {
            "momentum_max": self.momentum_max,
            "momentum_min": self.momentum_min,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CosineMomentum:
        return cls(**config)
