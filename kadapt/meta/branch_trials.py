"""Branch trials: a few steps at each of several rates from one snapshot, scored on held batches.

Every candidate starts from the same state and trains on the same batches
(common random numbers make the candidates comparable); the score is the mean
loss on batches none of them trained on. The snapshot is every variable a step
changes (weights, BatchNorm statistics, optimizer slots, `iterations`, the
rate and its multiplier, metric variables), copied to the host and assigned
back after the last branch: the model leaves as it came, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import keras

from kadapt.batching.training_state import host_snapshot
from kadapt.batching.training_state import restore
from kadapt.batching.training_state import state_variables


@dataclasses.dataclass(frozen=True)
class BranchScores:
    """The held loss at the snapshot (`start`) and after each rate's branch (`scores`, `inf` where it diverged)."""

    start: float
    scores: dict


def branch_scores(model: keras.Model, rates: Sequence[float], set_rate: Callable[[float], None],
                  train_batches: Sequence[tuple], held_batches: Sequence[tuple]) -> BranchScores:
    """The held loss from the model's state, and after training `train_batches` at each rate.

    `set_rate(rate)` makes the optimizer apply `rate` (it is called after the
    snapshot is restored, so it may change the rate's variables). A branch
    whose training loss turns non-finite stops and scores `inf`.

    Example:

    ```python
    trials = branch_scores(model, [1e-3, 1e-2], set_rate, train_batches=[(x1, y1)], held_batches=[(x2, y2)])
    trials.scores[1e-2] - trials.start   # how far ten steps at 0.01 moved the held loss
    ```
    """
    saved = host_snapshot(state_variables(model))
    scores = {}
    try:
        start = _held_loss(model, held_batches)
        for rate in rates:
            restore(saved)
            set_rate(rate)
            scores[rate] = _held_loss(model, held_batches) if _train(model, train_batches) else math.inf
    finally:
        restore(saved)
    return BranchScores(start, scores)


def _train(model, batches):
    for x, y in batches:
        loss = float(model.train_on_batch(x, y, return_dict=True)["loss"])
        if not math.isfinite(loss):
            return False
    return True


def _held_loss(model, batches):
    losses = [float(model.test_on_batch(x, y, return_dict=True)["loss"]) for x, y in batches]
    mean = sum(losses) / len(losses)
    return mean if math.isfinite(mean) else math.inf
