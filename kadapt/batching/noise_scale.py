"""The gradient noise scale B_simple = tr(Sigma) / |G|^2, from micro-batches.

McCandlish et al. (2018), "An Empirical Model of Large-Batch Training". A step
of k micro-batches of n_i rows (N rows in all) gives k micro-batch mean
gradients g_i and the logical batch's mean gradient g_B. With
a = mean_i |g_i|^2, b = |g_B|^2, u = mean_i 1/n_i and v = 1/N,

    E[a] = |G|^2 + tr(Sigma) * u,    E[b] = |G|^2 + tr(Sigma) * v,

so   tr(Sigma) ~ (a - b) / (u - v)   and   |G|^2 ~ (b u - a v) / (u - v).

For equal sizes m (u = 1/m, v = 1/(k m)) these are the paper's
m k (a - b) / (k - 1) and (k b - a) / (k - 1). Both estimates are noisy and
|G|^2 can come out negative, so B_simple is a ratio of exponential moving
averages, EMA[tr(Sigma)] / EMA[|G|^2], never an average of ratios.

Adam does not step along the gradient but along P g, P the per-entry
preconditioner sqrt(1 - beta_2^t) / (sqrt(v) + epsilon) of its second moment
v. Its critical batch follows the noise of P g, so with an Adam-family
optimizer the norms are taken of P g: B = tr(P Sigma P) / |P G|^2, the
preconditioned noise scale of Pollux (Qiao et al. 2021). P is that of the
optimizer's state before the step; the first step (v = 0) is not measured.
How it compares with the plain B_simple on the Fashion-MNIST MLP of
`benchmarks/accumulation/noise_scale.py`: benchmarks/README.md#noise_scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from kadapt._compat import adam_second_moments
from kadapt.optimizers.adam import Adam as _KadaptAdam
from kadapt.optimizers.live_variables import slot_key
from kadapt.validation import check_range


def squared_preconditioner(optimizer: keras.optimizers.Optimizer,
                           variables: Sequence[keras.Variable]) -> list[tf.Tensor] | None:
    """P^2 per variable for an Adam-family optimizer (Keras `Adam`, `AdamW`,
    `kadapt.optimizers.Adam`), as float32 tensors, or `None` for any other
    optimizer (plain gradients). See the module docstring."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    if isinstance(optimizer, _KadaptAdam):
        seconds = [optimizer._second[slot_key(v)] for v in variables]
    elif isinstance(optimizer, keras.optimizers.Adam):
        seconds = adam_second_moments(optimizer, variables)
    else:
        return None
    steps = tf.cast(optimizer.iterations, tf.float32)
    correction = 1.0 - tf.pow(tf.cast(optimizer.beta_2, tf.float32), steps)
    return [correction / tf.square(tf.sqrt(tf.cast(v, tf.float32)) + optimizer.epsilon) for v in seconds]


@keras.saving.register_keras_serializable(package="kadapt")
class NoiseScale(keras.metrics.Metric):
    """Smoothed gradient noise scale, in samples; reported as `noise_scale`.

    Keras resets metrics at the start of every epoch; this one keeps its
    averages across epochs (a noise scale changes slowly, and a restart would
    throw the smoothing away). `clear()` starts it over.

    Args:
        decay: Float in [0, 1). Weight of the past in each average. Defaults
            to `0.99` (a horizon of about 100 steps). It is read when the train
            step is traced: set `model.noise_scale.decay` before the first `fit`.
        name: String. Defaults to `"noise_scale"`.
    """

    def __init__(self, decay: float = 0.99, name: str = "noise_scale", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        check_range("decay", decay, low=0.0, high=1.0, high_open=True)
        self.decay = float(decay)
        # Under tf.distribute every replica folds in the same global statistics
        # (`_across_replicas`): a replica's copy is the value ("mean" of equals).
        average = dict(shape=(), initializer="zeros", aggregation="mean")
        self.trace = self.add_variable(name="trace", **average)
        self.squared_norm = self.add_variable(name="squared_norm", **average)
        # For the standard error of the |G|^2 average: the EMA of its square,
        # and the sums of the EMA's weights and of their squares.
        self.squared_norm_square = self.add_variable(name="squared_norm_square", **average)
        self.weights_sum = self.add_variable(name="weights_sum", **average)
        self.weights_square_sum = self.add_variable(name="weights_square_sum", **average)

    def update_state(self, a: Any, b: Any, u: Any, v: Any, measured: Any = True) -> None:
        """Folds in one step's a, b, u, v (see the module docstring); a step
        with `measured` false, or with one micro-batch, is left out."""
        a, b, u, v = (tf.cast(t, tf.float32) for t in (a, b, u, v))
        spread = u - v
        valid = tf.logical_and(spread > 0, measured)  # at least two micro-batches
        spread = tf.where(valid, spread, 1.0)
        trace = (a - b) / spread
        squared_norm = (b * u - a * v) / spread
        keep = tf.where(valid, self.decay, 1.0)
        self.trace.assign(keep * self.trace + (1 - keep) * trace)
        self.squared_norm.assign(keep * self.squared_norm + (1 - keep) * squared_norm)
        self.squared_norm_square.assign(keep * self.squared_norm_square + (1 - keep) * tf.square(squared_norm))
        self.weights_sum.assign(keep * self.weights_sum + (1 - keep))
        self.weights_square_sum.assign(tf.square(keep) * self.weights_square_sum + tf.square(1 - keep))

    def result(self) -> tf.Tensor:
        # The EMAs' bias corrections are equal and cancel in the ratio.
        return tf.math.divide_no_nan(self.trace, self.squared_norm)

    def squared_norm_error(self) -> tf.Tensor:
        """The standard error of `squared_norm`, in its units: the spread of
        the steps' |G|^2 estimates (weighted as in the EMA, with the
        reliability-weights correction) times the root of the EMA's sum of
        squared weights. 0 before two measured steps. An average within a few
        errors of 0 has not resolved the gradient."""
        total, squares = self.weights_sum, self.weights_square_sum
        mean = tf.math.divide_no_nan(self.squared_norm, total)
        spread = tf.maximum(tf.math.divide_no_nan(self.squared_norm_square, total) - tf.square(mean), 0.0)
        effective = 1.0 - tf.math.divide_no_nan(squares, tf.square(total))  # 0 after one step
        return tf.sqrt(tf.math.divide_no_nan(spread, effective) * squares)

    def reset_state(self) -> None:
        pass  # kept across epochs; see the class docstring

    def clear(self) -> None:
        for variable in self.variables:
            variable.assign(0.0)

    def get_config(self) -> dict[str, Any]:
        return {"decay": self.decay, "name": self.name}
