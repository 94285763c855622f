"""`CosineAnnealing`: lr_t = lr_min + (lr_max - lr_min) * (1 + cos(pi * T_cur / T_tot)) / 2."""

import keras

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

    Args:
        lr_max: Positive float. The rate at the start of the annealing.
        lr_min: Float in [0, lr_max]. The rate at the end.
        total_steps: Positive int. Steps of the whole schedule, warmup included.
        warmup_steps: Int in [0, total_steps). Steps of linear warmup. Defaults to `0`.

    Example:

    ```python
    schedule = kadapt.CosineAnnealing(lr_max=0.1, lr_min=1e-4, total_steps=1000)
    optimizer = keras.optimizers.SGD(schedule, momentum=0.9)
    ```
    """

    def __init__(self, lr_max, lr_min, total_steps, warmup_steps=0, name="CosineAnnealing"):
        check_range("lr_max", lr_max, low=0.0, low_open=True)
        check_range("lr_min", lr_min, low=0.0, high=lr_max)
        check_range("total_steps", total_steps, low=1, integer=True)
        check_range("warmup_steps", warmup_steps, low=0, high=total_steps - 1, integer=True)
        self.lr_max, self.lr_min = float(lr_max), float(lr_min)
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        super().__init__(
            initial_learning_rate=0.0 if warmup_steps else self.lr_max,
            decay_steps=self.total_steps - self.warmup_steps,
            alpha=self.lr_min / self.lr_max,
            name=name,
            warmup_target=self.lr_max if warmup_steps else None,
            warmup_steps=self.warmup_steps,
        )

    def get_config(self):
        return {
            "lr_max": self.lr_max,
            "lr_min": self.lr_min,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "name": self.name,
        }
