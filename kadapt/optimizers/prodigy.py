"""Prodigy: Adam whose step size is estimated from the distance travelled."""

from __future__ import annotations

import collections
import math
from typing import Any

import keras
from keras import ops

from kadapt._compat import distributed_container
from kadapt.optimizers.live_variables import LearningRateMultiplier
from kadapt.optimizers.live_variables import RestartableMoments
from kadapt.optimizers.live_variables import reject_keras_accumulation
from kadapt.optimizers.live_variables import scalar_variable
from kadapt.optimizers.live_variables import slot_key
from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class Prodigy(RestartableMoments, LearningRateMultiplier, keras.optimizers.Optimizer):
    """Prodigy (Mishchenko & Defazio 2023; PyPI `prodigyopt` 1.1.2).

    Adam with step size d * learning_rate, where d, one scalar over all the
    variables, estimates the distance to the solution (D-Adaptation). With
    lr = learning_rate * learning_rate_multiplier and, at step t, dlr = d * lr
    (times sqrt(1 - beta_2^t) / (1 - beta_1^t) with `use_bias_correction`):

        m = beta_1 * m + d * (1 - beta_1) * g
        v = beta_2 * v + d^2 * (1 - beta_2) * g^2
        s = beta_3 * s + (d / d0) * dlr * g           (d, not dlr, with safeguard_warmup)
        numerator = beta_3 * numerator + (d / d0) * dlr * sum(g * (w0 - w))
        d_hat = d_coef * numerator / sum(|s|)
        d' = min(max(d_max, d_hat), d * growth_rate)   (max(d, d_hat) while d == d0)
        w -= dlr * m / (sqrt(v) + d' * epsilon)

    the sums over every variable, w0 the weights at the first step. With
    beta_1 = 0 no m is kept and the step is w -= dlr * d' * g / (sqrt(v) + d' * epsilon),
    with the d' just estimated, as prodigyopt's branch for beta1 = 0 steps. Weight
    decay is AdamW's (w -= weight_decay * dlr * w) if `decouple`, else L2
    added to g. A step whose sum(|s|) is 0 changes no weight and no d.

    Args:
        learning_rate: Float or `LearningRateSchedule`; multiplies the
            estimated step. Leave at 1. Defaults to `1.0`.
        beta_1: Float in [0, 1). Defaults to `0.9`.
        beta_2: Float in [0, 1). Defaults to `0.999`.
        beta_3: Float in [0, 1) or `None` for sqrt(beta_2). Defaults to `None`.
        epsilon: Positive float. Defaults to `1e-8`.
        weight_decay: Non-negative float. Defaults to `0.0`.
        decouple: Bool. AdamW-style weight decay. Defaults to `True`.
        use_bias_correction: Bool. Adam's bias correction. Defaults to `False`.
        safeguard_warmup: Bool. Leave lr out of s during warmup. Defaults to `False`.
        d0: Positive float. Initial estimate of d. Defaults to `1e-6`.
        d_coef: Positive float. Scales the estimate of d. Defaults to `1.0`.
        growth_rate: Float >= 1. Largest factor d grows by per step. Defaults to `inf`.
        learning_rate_multiplier: Positive float, a variable that live
            callbacks may change. Defaults to `1.0`.
        **kwargs: Passed to `keras.optimizers.Optimizer` (`clipnorm`, `name`, ...).

    Example:

    ```python
    model.compile(optimizer=kadapt.optimizers.Prodigy(safeguard_warmup=True,
                                                      use_bias_correction=True), loss="mse")
    ```
    """

    # The initial weights w0 and the accumulated s measure the distance travelled (what sets d):
    # a rollback's restart (`kadapt.meta.observe.rollback`) restores them; it zeroes the moments only.
    slots_kept_on_restart = ("initial", "s")

    def __init__(self, learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 1.0,
                 beta_1: float = 0.9, beta_2: float = 0.999, beta_3: float | None = None,
                 epsilon: float = 1e-8, weight_decay: float = 0.0, decouple: bool = True,
                 use_bias_correction: bool = False, safeguard_warmup: bool = False,
                 d0: float = 1e-6, d_coef: float = 1.0, growth_rate: float = math.inf,
                 learning_rate_multiplier: float = 1.0, name: str = "prodigy", **kwargs: Any) -> None:
        reject_keras_accumulation(kwargs)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        beta_3_or_default = math.sqrt(beta_2) if beta_3 is None else beta_3
        for arg, value in (("beta_1", beta_1), ("beta_2", beta_2), ("beta_3", beta_3_or_default)):
            check_range(arg, value, low=0.0, high=1.0, high_open=True)
        for arg, value in (("epsilon", epsilon), ("d0", d0), ("d_coef", d_coef)):
            check_range(arg, value, low=0.0, low_open=True)
        check_range("weight_decay", weight_decay, low=0.0)
        check_range("growth_rate", growth_rate, low=1.0)
        self.beta_1, self.beta_2, self.beta_3 = float(beta_1), float(beta_2), beta_3
        self.epsilon, self.prodigy_weight_decay = float(epsilon), float(weight_decay)
        self.decouple, self.use_bias_correction = bool(decouple), bool(use_bias_correction)
        self.safeguard_warmup = bool(safeguard_warmup)
        self.d0, self.d_coef, self.growth_rate = float(d0), float(d_coef), float(growth_rate)
        self._init_multiplier(learning_rate_multiplier)
        self._d = scalar_variable(self, "d", d0)
        self._d_max = scalar_variable(self, "d_max", d0)
        self._d_numerator = scalar_variable(self, "d_numerator", 0.0)

    @property
    def d(self) -> float:
        """The current estimate of d (the step is d * learning_rate)."""
        return float(ops.convert_to_numpy(self._d))

    def build(self, variables: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(variables)
        # Flags, not the variables: Keras' tracker would add the model's
        # variables in a list attribute to the optimizer's own.
        self._overwrites = [bool(getattr(v, "overwrite_with_gradient", False)) for v in variables]
        self._slots = {}
        for v in variables:
            self._slots[slot_key(v)] = tuple(
                self.add_variable_from_reference(v, name) for name in ("initial", "momentum", "velocity", "s")
            )
        self._init_moments_from()

    def apply(self, grads: list[Any], trainable_variables: list[keras.Variable] | None = None) -> None:
        """As `keras.optimizers.Optimizer.apply`. d is one scalar over all the
        variables, so `update_step` gathers them and steps all at the last one."""
        if trainable_variables is None:
            overwrites = self._overwrites
        else:
            overwrites = [getattr(v, "overwrite_with_gradient", False) for v in trainable_variables]
        self._expected = sum(g is not None and not o for g, o in zip(grads, overwrites))
        # A deque, not a list: untracked (see `build`).
        self._pending = collections.deque()
        super().apply(grads, trainable_variables)

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        # Under tf.distribute this runs once per variable and replica, with the
        # replica's component: each replica steps its own components.
        replica = _replica(variable)
        self._pending.append((replica, ops.cast(gradient, variable.dtype), variable))
        gathered = [(g, v) for r, g, v in self._pending if r == replica]
        if len(gathered) == self._expected:
            self._step_all(gathered, learning_rate)

    def _step_all(self, pending, learning_rate):
        d = ops.convert_to_tensor(self._d)
        dlr = d * self._multiplied(learning_rate, "float32") * self._bias_correction()
        numerator, denominator, moments = self._accumulate(pending, d, dlr)
        d_next, d_max = self._next_d(d, numerator, denominator)
        progressed = denominator > 0
        for (_, variable), (m, v) in zip(pending, moments):
            w = ops.convert_to_tensor(variable)
            rate = ops.cast(dlr, w.dtype)
            if not self.beta_1:  # m is g (see `_accumulate`)
                m = ops.cast(d_next, w.dtype) * m
            if self.prodigy_weight_decay and self.decouple:
                w = w - self.prodigy_weight_decay * rate * w
            w = w - rate * m / (ops.sqrt(v) + ops.cast(d_next * self.epsilon, w.dtype))
            self.assign(variable, ops.where(progressed, w, ops.convert_to_tensor(variable)))
        for state, value in ((self._d, d_next), (self._d_max, d_max), (self._d_numerator, numerator)):
            state.assign(ops.where(progressed, value, ops.convert_to_tensor(state)))

    def _bias_correction(self):
        if not self.use_bias_correction:
            return 1.0
        step = self.moments_step("float32")
        return ops.sqrt(1 - ops.power(self.beta_2, step)) / (1 - ops.power(self.beta_1, step))

    def _accumulate(self, pending, d, dlr):
        """Updates m, v, s of every variable; returns the numerator, sum(|s|) and (m, v).

        Each variable's terms are computed in its own dtype: w0 - w is a
        difference of nearly equal numbers while d is small. With beta_1 = 0
        m is not kept and g is returned in its place: prodigyopt's branch for
        beta1 = 0 steps with g times the d this step estimates, not the d before it.
        """
        beta_3 = math.sqrt(self.beta_2) if self.beta_3 is None else self.beta_3
        numerator = ops.convert_to_tensor(self._d_numerator) * beta_3
        denominator, moments = 0.0, []
        for gradient, variable in pending:
            slots = self._slots[slot_key(variable)]
            initial, m, v, s = (ops.convert_to_tensor(x) for x in slots)
            w = ops.convert_to_tensor(variable)
            # w0 is taken at the first step, as Keras' EMA starts: an initializer
            # reading the weights cannot be lifted out of an XLA step. The first step is
            # the one s is still zero at, not iteration 0: a rollback to the initial state
            # (`kadapt.meta.observe.rollback`) puts back the zeros while `iterations` counts on.
            initial = ops.where(ops.all(ops.equal(s, 0)), w, initial)
            if self.prodigy_weight_decay and not self.decouple:
                gradient = gradient + self.prodigy_weight_decay * w
            d_v, dlr_v, scale = (ops.cast(value, w.dtype) for value in (d, dlr, d / self.d0))
            numerator = numerator + ops.cast(scale * dlr_v * ops.sum(gradient * (initial - w)), "float32")
            if self.beta_1:
                m = self.beta_1 * m + d_v * (1 - self.beta_1) * gradient
            v_new = self.beta_2 * v + d_v * d_v * (1 - self.beta_2) * ops.square(gradient)
            s_new = beta_3 * s + scale * (d_v if self.safeguard_warmup else dlr_v) * gradient
            denominator = denominator + ops.cast(ops.sum(ops.abs(s_new)), "float32")
            for slot, value in zip(slots, (initial, m, v_new, s_new)):
                self.assign(slot, value)
            moments.append((m if self.beta_1 else gradient, v_new))
        return numerator, denominator, moments

    def _next_d(self, d, numerator, denominator):
        d_hat = self.d_coef * numerator / ops.where(denominator > 0, denominator, 1.0)
        d_start = ops.where(ops.equal(d, self.d0), ops.maximum(d, d_hat), d)
        d_max = ops.maximum(ops.convert_to_tensor(self._d_max), d_hat)
        return ops.minimum(d_max, d_start * self.growth_rate), d_max

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            beta_1=self.beta_1, beta_2=self.beta_2, beta_3=self.beta_3, epsilon=self.epsilon,
            weight_decay=self.prodigy_weight_decay, decouple=self.decouple,
            use_bias_correction=self.use_bias_correction, safeguard_warmup=self.safeguard_warmup,
            d0=self.d0, d_coef=self.d_coef, growth_rate=self.growth_rate,
            learning_rate_multiplier=float(ops.convert_to_numpy(self._multiplier)),
        )
        return config


def _replica(variable: Any) -> Any:
    """The device of a replica's component of a tf.distribute variable, else `None`."""
    distributed = distributed_container(variable) is not None or distributed_container(
        getattr(variable, "handle", None)) is not None
    return variable.device if distributed else None
