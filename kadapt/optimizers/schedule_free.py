"""What Schedule-Free SGD and AdamW share: the averaging weights and the two points.

Schedule-Free (Defazio et al. 2024, "The Road Less Scheduled"; PyPI
`schedulefree` 1.4.1) keeps three sequences: z (the base SGD/Adam iterate), x
(the running average of z, the point to evaluate and save) and y (the point the
gradient is taken at):

    y_t = beta * x_t + (1 - beta) * z_t
    z_{t+1} = z_t - lr_t * g(y_t)
    x_{t+1} = (1 - c_{t+1}) * x_t + c_{t+1} * z_{t+1}
    c_{t+1} = w_t / sum_{i<=t} w_i,  w_t = (t + 1)^r * max_{i<=t}(lr_i)^weight_lr_power

with lr_t = learning_rate * learning_rate_multiplier * min(1, (t + 1) / warmup_steps).
As in the reference, the model's variables hold y during training and z is
optimizer state; x is recovered from them: x = (y - (1 - beta) * z) / beta.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from kadapt.optimizers.live_variables import LearningRateMultiplier
from kadapt.optimizers.live_variables import reject_keras_accumulation
from kadapt.optimizers.live_variables import scalar_variable
from kadapt.optimizers.live_variables import slot_key
from kadapt.validation import check_non_negative_int
from kadapt.validation import check_range


def check_learning_rate(learning_rate: object) -> None:
    """Schedule-Free takes a positive float rate: its warmup replaces a schedule."""
    if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(
            "Schedule-Free optimizers need no learning-rate schedule: they average the "
            "iterates instead, and `warmup_steps` gives the warmup. Pass a float. "
            f"Received: learning_rate={learning_rate!r}"
        )
    check_range("learning_rate", learning_rate, low=0.0, low_open=True)


class ScheduleFree(LearningRateMultiplier, keras.optimizers.Optimizer):
    """Base of `ScheduleFreeSGD` and `ScheduleFreeAdamW`; see this module's docstring.

    Subclasses set `self._interpolation` (beta) and implement `direction`.
    At the end of `fit` the model holds x (`finalize_variable_values`); y is
    kept exactly in an optimizer slot, so the next `fit` resumes at y once
    `kadapt.callbacks.ScheduleFreeEvaluation` (added by kadapt's accumulating
    models themselves) moves it back before the first step. Without it, the
    first step of that `fit` takes its gradient at x and then continues from
    the saved y: only that one gradient differs.
    """

    # The iterates z and y are weights: a rollback's restart (`kadapt.meta.observe.rollback`) restores them.
    slots_kept_on_restart = ("z", "y")

    def __init__(self, learning_rate: float, weight_decay: float, warmup_steps: int, r: float,
                 weight_lr_power: float, learning_rate_multiplier: float, name: str,
                 **kwargs: Any) -> None:
        check_learning_rate(learning_rate)
        reject_keras_accumulation(kwargs)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        check_range("weight_decay", weight_decay, low=0.0)
        self.warmup_steps = check_non_negative_int(warmup_steps, "warmup_steps")
        check_range("r", r, low=0.0)
        check_range("weight_lr_power", weight_lr_power, low=0.0)
        self.schedule_free_weight_decay = float(weight_decay)
        self.r, self.weight_lr_power = float(r), float(weight_lr_power)
        self._init_multiplier(learning_rate_multiplier)
        self._lr_max = scalar_variable(self, "lr_max", -1.0)
        self._weight_sum = scalar_variable(self, "weight_sum", 0.0)
        # 1.0 while the model holds x (after `fit`, during validation), else 0.0.
        self._at_evaluation_point = scalar_variable(self, "at_evaluation_point", 0.0)

    def build(self, variables: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(variables)
        self._z, self._y = {}, {}
        for variable in variables:
            self._z[slot_key(variable)] = self.add_variable_from_reference(variable, "z")
            # y while the model holds x: one more copy, so y comes back exactly.
            self._y[slot_key(variable)] = self.add_variable_from_reference(variable, "y")

    def apply(self, grads: list[Any], trainable_variables: list[keras.Variable] | None = None) -> None:
        """As `keras.optimizers.Optimizer.apply`; first advances the step's
        averaging weight c, shared by every variable."""
        if len(grads) == 0:
            return  # Keras' `apply` steps nothing, `iterations` included.
        self._step_scalars = self._advance_average()
        super().apply(grads, trainable_variables)
        self._at_evaluation_point.assign(0.0)

    def _advance_average(self):
        step = ops.cast(self.iterations, "float32") + 1.0
        warmup = ops.minimum(1.0, step / max(self.warmup_steps, 1))
        rate = ops.cast(self.learning_rate, "float32") * ops.cast(self._multiplier, "float32") * warmup
        lr_max = ops.maximum(rate, self._lr_max)
        weight = ops.power(step, self.r) * ops.power(lr_max, self.weight_lr_power)
        # No step averaged yet: the first step, or the start put back by a rollback
        # (`kadapt.meta.observe.rollback`), which leaves `iterations` counting on.
        first = ops.equal(ops.convert_to_tensor(self._weight_sum), 0.0)
        weight_sum = self._weight_sum + weight
        self._lr_max.assign(lr_max)
        self._weight_sum.assign(weight_sum)
        average_weight = ops.where(weight_sum > 0, weight / ops.maximum(weight_sum, 1e-38), 0.0)
        return {"rate": rate, "average_weight": average_weight, "first": first}

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        dtype = variable.dtype
        key = slot_key(variable)
        at_x = ops.convert_to_tensor(self._at_evaluation_point) > 0
        y = ops.where(at_x, ops.convert_to_tensor(self._y[key]), ops.convert_to_tensor(variable))
        # z starts at the weights of the first step, as Keras' EMA starts: an
        # initializer reading the weights cannot be lifted out of an XLA step.
        z = ops.where(self._step_scalars["first"], y, ops.convert_to_tensor(self._z[key]))
        direction = self.direction(ops.cast(gradient, dtype), key)
        if self.schedule_free_weight_decay:
            direction = direction + self.schedule_free_weight_decay * y
        rate = ops.cast(self._step_scalars["rate"], dtype)
        c = ops.cast(self._step_scalars["average_weight"], dtype)
        y = y + c * (z - y) + rate * (self._interpolation * (1 - c) - 1) * direction
        self.assign(variable, y)
        self.assign(self._z[key], z - rate * direction)

    def direction(self, gradient: Any, key: Any) -> Any:
        """The base optimizer's step direction for one variable (updates its state)."""
        raise NotImplementedError

    @property
    def at_evaluation_point(self) -> bool:
        """Whether the model's variables hold x (the average) rather than y."""
        return bool(ops.convert_to_numpy(self._at_evaluation_point) > 0)

    def move_to_evaluation_point(self, variables: list[keras.Variable]) -> None:
        """Sets `variables` (the model's trainable ones) from y to x, keeping y.

        Does nothing if they hold x already or the optimizer has not stepped.
        """
        if not self.built or self.at_evaluation_point or int(ops.convert_to_numpy(self.iterations)) == 0:
            return
        beta = self._interpolation
        for variable in self._known(variables):
            key = slot_key(variable)
            # Copies, never one buffer shared: on JAX two variables holding
            # one buffer cannot both be donated to the compiled step.
            self._y[key].assign(ops.copy(variable))
            variable.assign(variable + (1 - 1 / beta) * (self._z[key] - variable))
        self._at_evaluation_point.assign(1.0)

    def move_to_gradient_point(self, variables: list[keras.Variable]) -> None:
        """Sets `variables` back to y, exactly as they were; the inverse of
        `move_to_evaluation_point`."""
        if not self.built or not self.at_evaluation_point:
            return
        for variable in self._known(variables):
            variable.assign(ops.copy(self._y[slot_key(variable)]))
        self._at_evaluation_point.assign(0.0)

    def _known(self, variables):
        return [v for v in variables if slot_key(v) in self._z]

    def finalize_variable_values(self, var_list: list[keras.Variable]) -> None:
        """Called by `fit` at its end: leaves x, the average, in the model."""
        super().finalize_variable_values(var_list)
        self.move_to_evaluation_point(var_list)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            weight_decay=self.schedule_free_weight_decay,
            warmup_steps=self.warmup_steps,
            r=self.r,
            weight_lr_power=self.weight_lr_power,
            learning_rate_multiplier=float(ops.convert_to_numpy(self._multiplier)),
        )
        return config
