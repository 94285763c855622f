"""`find_learning_rate`: the learning-rate range test (Smith 2017) for a Keras model."""

from __future__ import annotations

import itertools
import math
from typing import Any

import keras
import numpy as np

from kadapt.batching.training_state import host_snapshot
from kadapt.batching.training_state import restore
from kadapt.batching.training_state import state_variables
from kadapt.range_test import curve
from kadapt.range_test.batches import batches
from kadapt.range_test.rate_control import swept_rate
from kadapt.range_test.result import RangeTestResult
from kadapt.validation import check_range

MIN_STEPS = 10  # a rule reads what is left after num_steps // 10 + 5 points are dropped


def find_learning_rate(model: keras.Model, x: Any, y: Any = None, *, batch_size: int | None = None,
                       start: float = 1e-7, stop: float = 10.0, num_steps: int = 100,
                       smoothing: float = 0.98, divergence: float = 4.0, rule: str = "valley",
                       shuffle: bool = True) -> RangeTestResult:
    """Runs a learning-rate range test and suggests a rate.

    Trains the compiled model for up to `num_steps` steps, one batch each,
    from its current state, the rate rising exponentially from `start` to
    `stop`; smooths the loss (a debiased moving average) and stops early
    once the smoothed loss exceeds `divergence` times its best or a loss is
    not finite; reads a rate off the smoothed curve with `rule`
    (`kadapt.range_test.curve` states the rules and their sources: fastai's
    `lr_find` and Lightning's `Tuner.lr_find`). Then it puts back the model's
    weights, BatchNorm statistics, optimizer slots, `iterations`, rate and
    metric variables: the model is as before.

    With a `LearningRateSchedule` as the optimizer's rate, the test applies
    constant rates (the schedule is swapped out during the test and back
    after it): the suggestion is a rate for the schedule's peak. An
    accumulating model (`kadapt.accumulate`) takes each batch as one logical
    step of micro-batches.

    Args:
        model: A compiled `keras.Model`.
        x: Arrays (with `y`), a `tf.data.Dataset`, a `keras.utils.PyDataset`
            or a generator of batches, as `fit` takes them. It must hold at
            least `num_steps` batches.
        y: Targets, with arrays only. Defaults to `None`.
        batch_size: Positive int, with arrays only. Defaults to 32.
        start: Positive float. The first rate. Defaults to `1e-7`.
        stop: Float above `start`. The last rate. Defaults to `10.0`.
        num_steps: Int >= 10. Steps (and rates) of the sweep. Defaults to `100`.
        smoothing: Float in [0, 1). The moving average's beta. Defaults to `0.98`.
        divergence: Float > 1. Stop once the smoothed loss exceeds this many
            times its best. Defaults to `4.0`.
        rule: `"valley"` (fastai's default), `"steepest"` (Lightning's) or
            `"minimum/10"` (fastai's `minimum`). Defaults to `"valley"`.
        shuffle: Bool. Whether array rows are drawn in a random order.
            Defaults to `True`.

    Returns:
        A `kadapt.RangeTestResult`.

    Raises:
        ValueError: an uncompiled model, too few batches, a bad range, an
            unknown rule, or a curve no rate can be read off (it never falls).

    Example:

    ```python
    result = kadapt.find_learning_rate(model, x_train, y_train, batch_size=128)
    print(result.suggestion)
    model.optimizer.learning_rate = result.suggestion
    model.fit(x_train, y_train, batch_size=128, epochs=5)
    ```
    """
    _check_arguments(model, start, stop, num_steps, smoothing, divergence, rule)
    iterator, count = batches(x, y, batch_size, shuffle)
    _check_count(count, num_steps, x, batch_size)
    first = next(iterator, None)
    if first is None:
        raise ValueError(f"Argument `x` must hold at least one batch. Received: x={type(x).__name__} with none")
    _prepare(model, first)
    rates = curve.sweep_rates(start, stop, num_steps)
    saved = host_snapshot(state_variables(model))
    try:
        with swept_rate(model, start, stop, num_steps) as set_rate:
            losses, diverged = _sweep(model, itertools.chain([first], iterator), rates, set_rate,
                                      smoothing, divergence)
    finally:
        restore(saved)
    if len(losses) < num_steps and not diverged:
        raise ValueError(
            f"Argument `x` must hold at least num_steps={num_steps} batches: it ran out after "
            f"{len(losses)}. Pass num_steps={len(losses)} (at least {MIN_STEPS}) or more batches."
        )
    return _result(rates[:len(losses)], np.array(losses), smoothing, rule, num_steps, diverged)


def _sweep(model, data, rates, set_rate, smoothing, divergence):
    """Trains one step per rate; returns the losses and whether it diverged."""
    losses, average, best = [], 0.0, math.inf
    for step, (batch_x, batch_y, sample_weight) in zip(range(len(rates)), data):
        set_rate(float(rates[step]))
        logs = model.train_on_batch(batch_x, batch_y, sample_weight=sample_weight, return_dict=True)
        loss = float(logs["loss"])
        losses.append(loss)
        average = smoothing * average + (1.0 - smoothing) * loss
        smoothed = average / (1.0 - smoothing ** (step + 1))
        best = min(best, smoothed)
        if not math.isfinite(smoothed) or smoothed > divergence * best:
            return losses, True
    return losses, False


def _result(rates, losses, smoothing, rule, num_steps, diverged):
    smoothed = curve.smooth(losses, smoothing)
    suggestion, index = curve.suggest(rates, smoothed, rule, num_steps)
    return RangeTestResult(
        rates=tuple(map(float, rates)), losses=tuple(map(float, losses)),
        smoothed_losses=tuple(map(float, smoothed)), suggestion=suggestion, suggestion_index=index,
        rule=rule, steps_run=len(losses), diverged=diverged,
    )


def _prepare(model, first):
    """Builds what the first step would build, so that the snapshot holds it."""
    batch_x, batch_y, sample_weight = first
    if getattr(model, "micro_batch_size", None) == "auto":
        # An accumulating model probes its micro-batch in its first `fit`;
        # the range test runs before it.
        from kadapt.batching.auto_micro_batch import resolve_auto_micro_batch

        rows = len(keras.tree.flatten(batch_x)[0])
        resolve_auto_micro_batch(model, batch_x, batch_y, rows, sample_weight)
    if not model.built:
        model(batch_x)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def _check_arguments(model, start, stop, num_steps, smoothing, divergence, rule):
    if not isinstance(model, keras.Model) or not model.compiled:
        raise ValueError(
            "Argument `model` must be a compiled `keras.Model` (the range test trains it with its own "
            "optimizer and loss): call `model.compile(optimizer=..., loss=...)` first. "
            f"Received: model={getattr(model, 'name', model)!r}, which is not compiled."
        )
    check_range("start", start, low=0.0, low_open=True)
    check_range("stop", stop, low=0.0, low_open=True)
    if not start < stop:
        raise ValueError(f"Argument `stop` must be above `start`. Received: start={start!r}, stop={stop!r}")
    check_range("num_steps", num_steps, low=MIN_STEPS, integer=True)
    check_range("smoothing", smoothing, low=0.0, high=1.0, high_open=True)
    check_range("divergence", divergence, low=1.0, low_open=True)
    if rule not in curve.RULES:
        raise ValueError(f"Argument `rule` must be one of {sorted(curve.RULES)}. Received: rule={rule!r}")


def _check_count(count, num_steps, x, batch_size):
    if count is None or count >= num_steps:
        return
    raise ValueError(
        f"Argument `x` must hold at least num_steps={num_steps} batches (one per step of the sweep). "
        f"Received: x with {count} batches. Pass num_steps={count} (at least {MIN_STEPS}), "
        f"{_more_batches(x, num_steps)}."
    )


def _more_batches(x, num_steps):
    if not hasattr(x, "cardinality") and not isinstance(x, keras.utils.PyDataset):
        rows = len(keras.tree.flatten(x)[0])
        smaller = f"batch_size={rows // num_steps} or less, " if rows >= num_steps else ""
        return f"{smaller}or more rows"
    return "or batches that repeat (e.g. `dataset.repeat()`)"
