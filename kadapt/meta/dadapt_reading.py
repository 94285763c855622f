"""A D-Adaptation reading of the learning rate: SGD with D-Adaptation run from the model's state.

D-Adaptation (Defazio & Mishchenko 2023; the `dadaptation` package's
`DAdaptSGD`, `lr=1`) runs SGD in its dual-averaging form and estimates
D = ||x0 - x*|| from the steps it took, with lambda_k = d_k / ||g_0||:

    s_{k+1} = s_k + lambda_k g_k
    d_hat   = (||s_{k+1}||^2 - sum_i lambda_i^2 ||g_i||^2) / ||s_{k+1}||
            = 2 sum_i lambda_i <g_i, s_i> / ||s_{k+1}||
    d_{k+1} = max(d_k, min(d_hat, growth_rate * d_k))
    z_{k+1} = x0 - s_{k+1};   x_{k+1} = beta x_k + (1 - beta) z_{k+1}

For a convex loss and beta = 0, d_hat / 2 <= D (the paper's bound:
sum_i lambda_i (f(x_i) - f*) >= 0 gives sum_i lambda_i <g_i, s_i> <=
<s_{k+1}, x0 - x*>); the package steps with twice it. The averaging
x_{k+1} - x_k = beta (x_k - x_{k-1}) - (1 - beta) lambda_k g_k is the
heavy ball of `keras.optimizers.SGD(momentum=beta)` at the rate
(1 - beta) lambda_k, so the reading for the task's optimizer, after K
steps, is

    rate = (1 - beta) d_K / ||g_0||

(docs/meta-model.md derives it). The gradients are the task's own steps:
each step trains one batch with momentum 0 at the rate 1 (so it moves the
weights by minus the gradient, BatchNorm statistics and all, as a step
does), and the weights are then set to x_{k+1}, held in float64 on the host.
The model's state is put back afterwards.

`DAdaptation` is the estimate on gradients alone (NumPy, no Keras);
`read_dadapt_rate` runs it on a model.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from kadapt.batching.training_state import host_snapshot
from kadapt.batching.training_state import restore
from kadapt.batching.training_state import state_variables
from kadapt.optimizers.live_variables import current_momentum
from kadapt.optimizers.sgd import SGD
from kadapt.range_test import curve
from kadapt.range_test.rate_control import swept_rate
from kadapt.validation import check_range

D0 = 1e-6  # the package's initial estimate of D
GRADIENT_RATE = 1.0  # a step at this rate, momentum 0, moves the weights by minus the gradient


class DAdaptation:
    """D-Adaptation's estimate of the distance to the solution, fed one gradient at a time.

    Args:
        x0: Array. The point the run starts from (flattened).
        momentum: Float in [0, 1). The averaging's beta. Defaults to `0.0`.
        d0: Positive float. The first estimate of D. Defaults to `1e-6`.
        growth_rate: Float >= 1. The most d grows by per step. Defaults to `inf`.

    Example:

    ```python
    estimate = DAdaptation(np.zeros(2))
    x = estimate.x
    for _ in range(50):
        x = estimate.step(2 * (x - np.array([3.0, 4.0])))   # the gradient of ||x - (3, 4)||^2
    estimate.d   # 4.34 after 50 steps; the distance ||x0 - x*|| is 5
    ```
    """

    def __init__(self, x0: Any, momentum: float = 0.0, d0: float = D0, growth_rate: float = math.inf) -> None:
        check_range("momentum", momentum, low=0.0, high=1.0, high_open=True)
        check_range("d0", d0, low=0.0, low_open=True)
        check_range("growth_rate", growth_rate, low=1.0)
        self.x0 = np.asarray(x0, np.float64).ravel()
        self.x, self.s = self.x0.copy(), np.zeros_like(self.x0)
        self.momentum, self.d, self.growth_rate = float(momentum), float(d0), float(growth_rate)
        self.gradient_norm = None  # ||g_0||
        self.weighted_squares = 0.0  # sum_i lambda_i^2 ||g_i||^2
        self.lower_bound = 0.0  # the latest d_hat / 2: <= D for a convex loss and momentum 0
        self.steps = 0

    @property
    def step_size(self) -> float:
        """lambda_k = d_k / ||g_0||: the step the next gradient is taken with (`nan` before the first)."""
        return math.nan if not self.gradient_norm else self.d / self.gradient_norm

    def step(self, gradient: Any) -> np.ndarray:
        """Takes the gradient at `self.x`; returns the next point, x_{k+1}.

        Raises:
            ValueError: the first gradient is zero or not finite (no scale to read).
        """
        g = np.asarray(gradient, np.float64).ravel()
        squares = float(g @ g)
        if self.gradient_norm is None:
            if not (math.isfinite(squares) and squares > 0):
                raise ValueError(f"The first gradient must be finite and non-zero to scale D-Adaptation's "
                                 f"steps. Received: a gradient of squared norm {squares}")
            self.gradient_norm = math.sqrt(squares)
        size = self.step_size
        self.s += size * g
        self.weighted_squares += size * size * squares
        s_norm = float(np.linalg.norm(self.s))
        if s_norm > 0:
            d_hat = (s_norm * s_norm - self.weighted_squares) / s_norm
            self.lower_bound = d_hat / 2
            self.d = max(self.d, min(d_hat, self.growth_rate * self.d))
        self.x = self.momentum * self.x + (1 - self.momentum) * (self.x0 - self.s)
        self.steps += 1
        return self.x

    def rate(self) -> float:
        """The heavy-ball SGD rate this is, at the task's momentum: (1 - beta) d / ||g_0||."""
        return (1 - self.momentum) * self.step_size


@dataclasses.dataclass(frozen=True)
class DAdaptReading:
    """What `read_dadapt_rate` found.

    Args:
        suggestion: Float. The rate for the optimizer, (1 - momentum) d / ||g_0||.
        steps_run: Int. Steps trained (and undone).
        d: Float. The estimate of D at the end.
        gradient_norm: Float. ||g_0||, the first gradient's norm.
        losses: Tuple of floats. Each step's training loss.
        diverged: Bool. Whether the loss diverged (the reading is the estimate before it did).
    """

    suggestion: float
    steps_run: int
    d: float
    gradient_norm: float
    losses: tuple
    diverged: bool


def read_dadapt_rate(model: keras.Model, batches: Iterator[tuple], num_steps: int,
                     divergence: float = 4.0) -> DAdaptReading:
    """Runs SGD with D-Adaptation on `model` for `num_steps` batches and reads its rate; the model is
    left as it was.

    Like the range test, it stops where the loss (smoothed as `kadapt.range_test.curve`
    smooths a sweep of `num_steps`) exceeds `divergence` times its best, or is not finite: d
    keeps growing as a diverging run travels, so the reading is the estimate before that step.

    Args:
        model: A compiled, built `keras.Model` whose optimizer steps as SGD
            (`kadapt.optimizers.SGD`, or `keras.optimizers.SGD` without momentum).
        batches: Iterator of `(x, y)` or `(x, y, sample_weight)`: at least `num_steps`.
        num_steps: Int >= 1.
        divergence: Float > 1. Defaults to `4.0` (`kadapt.find_learning_rate`'s).

    Returns:
        A `DAdaptReading`.

    Raises:
        TypeError: the optimizer does not step as SGD.
        ValueError: the data ran out, or the first step's loss or gradient was not finite or zero.

    Example:

    ```python
    reading = read_dadapt_rate(model, iter([(x[:32], y[:32])] * 50), num_steps=50)
    model.optimizer.learning_rate = reading.suggestion
    ```
    """
    check_range("num_steps", num_steps, low=1, integer=True)
    check_range("divergence", divergence, low=1.0, low_open=True)
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)  # a LossScaleOptimizer's
    momentum = _check_sgd(optimizer)
    batches = _built(model, optimizer, batches)  # so that the snapshot holds what the first step builds
    trainable = list(model.trainable_variables)
    saved = host_snapshot(state_variables(model))
    weights = _flat(trainable)  # as the device holds them: the step's difference is taken in their precision
    estimate = DAdaptation(weights, momentum)
    losses, taken, watch = [], 0, _Divergence(curve.sweep_smoothing(num_steps), divergence)
    try:
        if momentum:
            optimizer.momentum = 0.0
        with swept_rate(model, GRADIENT_RATE, GRADIENT_RATE, num_steps) as set_rate:
            for taken, batch in enumerate(itertools.islice(batches, num_steps), start=1):
                set_rate(GRADIENT_RATE)
                loss = float(model.train_on_batch(*batch, return_dict=True)["loss"])
                gradient = (weights - _flat(trainable)) / GRADIENT_RATE
                if watch.diverged(loss) or not np.isfinite(gradient).all():
                    break
                losses.append(loss)
                weights = _assign(trainable, estimate.step(gradient))
    finally:
        restore(saved)
    if taken < num_steps and len(losses) == taken:
        raise ValueError(f"Argument `batches` must hold at least num_steps={num_steps} batches: it ran out "
                         f"after {taken}.")
    if not losses:
        raise ValueError("D-Adaptation's first step gave a non-finite loss or gradient: no rate to read.")
    return DAdaptReading(estimate.rate(), len(losses), estimate.d, estimate.gradient_norm, tuple(losses),
                         diverged=len(losses) < num_steps)


class _Divergence:
    """The range test's stop: the debiased moving average of the loss above `factor` times its best."""

    def __init__(self, beta, factor):
        self.beta, self.factor, self.average, self.best, self.steps = beta, factor, 0.0, math.inf, 0

    def diverged(self, loss):
        self.steps += 1
        self.average = self.beta * self.average + (1 - self.beta) * loss
        smoothed = self.average / (1 - self.beta ** self.steps)
        self.best = min(self.best, smoothed)
        return not math.isfinite(smoothed) or smoothed > self.factor * self.best


def _check_sgd(optimizer):
    """The optimizer's momentum, which must be a live variable where it is not 0."""
    momentum = current_momentum(optimizer)
    if not isinstance(optimizer, (SGD, keras.optimizers.SGD)):
        raise TypeError("A D-Adaptation reading needs an SGD optimizer (kadapt.optimizers.SGD). "
                        f"Received: optimizer={type(optimizer).__name__}")
    if momentum and not isinstance(optimizer, SGD):
        raise TypeError("A D-Adaptation reading needs momentum it can set to 0 for a step: use "
                        f"kadapt.optimizers.SGD. Received: keras.optimizers.SGD(momentum={momentum})")
    return momentum


def _built(model, optimizer, batches):
    first = next(batches, None)
    if first is None:
        raise ValueError("Argument `batches` must hold at least one batch. Received: an empty iterator")
    if not model.built:
        model(first[0])
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return itertools.chain([first], batches)


def _flat(variables):
    return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in variables])


def _assign(variables, flat):
    """Assigns `flat` to the variables; returns what they hold (in their dtype), flattened."""
    offset, held = 0, []
    for variable in variables:
        size = int(np.prod(variable.shape))
        value = flat[offset:offset + size].reshape(variable.shape).astype(variable.dtype)
        variable.assign(value)
        held.append(value.astype(np.float64).ravel())
        offset += size
    return np.concatenate(held)
