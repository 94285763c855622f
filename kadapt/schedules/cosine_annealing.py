"""`CosineAnnealing`: lr_t = lr_min + (lr_max - lr_min) * (1 + cos(pi * T_cur / T_tot)) / 2."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class CosineAnnealing(keras.optimizers.schedules.CosineDecay):
    """Cosine annealing from `lr_max` to `lr_min`, after an optional linear warmup.

    For step t < `warmup_steps` the rate rises linearly from 0 to `lr_max`;
    afterwards, with T_cur = t - warmup_steps and T_tot = total_steps -
    warmup_steps,

        lr_t = lr_min + (lr_max - lr_min) * (1 + cos(pi * T_cur / T_tot)) / 2,

    and `lr_min` once T_cur >= T_tot. This is Keras' `CosineDecay` with
    `alpha = lr_min / lr_max`, named by its endpoints.

    With `restarts` = r > 0 the annealing part is Keras' `CosineDecayRestarts`
    (SGDR) instead: r + 1 cycles, cycle i lasting L·m^i steps with
    m = `cycle_length_multiplier` and L chosen so the cycles fill T_tot
    exactly (L = T_tot / (1 + m + ... + m^r)); within cycle i, at T_i steps
    into it,

        lr_t = lr_min + (lr_max - lr_min) * p^i * (1 + cos(pi * T_i / (L·m^i))) / 2,

    p = `peak_multiplier`, and `lr_min` from `total_steps` on.

    Args:
        lr_max: Positive float. The rate at the start of the annealing.
        lr_min: Float in [0, lr_max]. The rate at the end.
        total_steps: Positive int. Steps of the whole schedule, warmup included.
        warmup_steps: Int in [0, total_steps). Steps of linear warmup. Defaults to `0`.
        restarts: Int >= 0. Warm restarts after the first cycle. Defaults to `0`.
        cycle_length_multiplier: Positive float. Each cycle is this many times
            as long as the one before. Defaults to `2.0`.
        peak_multiplier: Float in (0, 1]. Each cycle's peak above `lr_min` is
            this many times the one before. Defaults to `1.0`.

    Example:

    ```python
    schedule = kadapt.CosineAnnealing(lr_max=0.1, lr_min=1e-4, total_steps=1000)
    optimizer = keras.optimizers.SGD(schedule, momentum=0.9)
    restarting = kadapt.CosineAnnealing(0.1, 1e-4, 700, restarts=2)  # cycles of 100, 200, 400
    ```
    """

    def __init__(self, lr_max: float, lr_min: float, total_steps: int, warmup_steps: int = 0, restarts: int = 0,
                 cycle_length_multiplier: float = 2.0, peak_multiplier: float = 1.0,
                 name: str = "CosineAnnealing") -> None:
        check_range("lr_max", lr_max, low=0.0, low_open=True)
        check_range("lr_min", lr_min, low=0.0, high=lr_max)
        check_range("total_steps", total_steps, low=1, integer=True)
        check_range("warmup_steps", warmup_steps, low=0, high=total_steps - 1, integer=True)
        check_range("restarts", restarts, low=0, integer=True)
        check_range("cycle_length_multiplier", cycle_length_multiplier, low=0.0, low_open=True)
        check_range("peak_multiplier", peak_multiplier, low=0.0, high=1.0, low_open=True)
        self.lr_max, self.lr_min = float(lr_max), float(lr_min)
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self.restarts = int(restarts)
        self.cycle_length_multiplier = float(cycle_length_multiplier)
        self.peak_multiplier = float(peak_multiplier)
        super().__init__(
            initial_learning_rate=0.0 if warmup_steps else self.lr_max,
            decay_steps=self.total_steps - self.warmup_steps,
            alpha=self.lr_min / self.lr_max,
            name=name,
            warmup_target=self.lr_max if warmup_steps else None,
            warmup_steps=self.warmup_steps,
        )
        self._cycles = self._restarting_schedule() if self.restarts else None

    def _restarting_schedule(self):
        cycles = sum(self.cycle_length_multiplier**i for i in range(self.restarts + 1))
        return keras.optimizers.schedules.CosineDecayRestarts(
            initial_learning_rate=self.lr_max,
            first_decay_steps=(self.total_steps - self.warmup_steps) / cycles,
            t_mul=self.cycle_length_multiplier,
            m_mul=self.peak_multiplier,
            alpha=self.lr_min / self.lr_max,
        )

    def __call__(self, step: Any) -> Any:
        if self._cycles is None:
            return super().__call__(step)
        step = ops.cast(step, "float32")
        annealed = ops.where(step >= self.total_steps, self.lr_min, self._cycles(step - self.warmup_steps))
        return ops.where(step < self.warmup_steps, super().__call__(step), annealed)

    def get_config(self) -> dict[str, Any]:
        return {
            "lr_max": self.lr_max,
            "lr_min": self.lr_min,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "restarts": self.restarts,
            "cycle_length_multiplier": self.cycle_length_multiplier,
            "peak_multiplier": self.peak_multiplier,
            "name": self.name,
        }
