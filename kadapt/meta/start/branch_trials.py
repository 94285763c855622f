"""Branch trials: a few steps at each of several rates from one snapshot, scored on held batches.

Every candidate starts from the same state and trains on the same batches
(common random numbers make the candidates comparable); the score is the mean
loss on batches none of them trained on. The snapshot is every variable a step
changes (weights, BatchNorm statistics, optimizer slots, `iterations`, the
rate and its multiplier, metric variables), copied to the host and assigned
back after the last branch: the model leaves as it came, bit for bit.

With `keep_ends`, the state a branch left is kept too (on the host, metric
variables aside), so a run may go on from it instead of losing the branch's
steps: the first rate's (the live one) and the best-scoring other's, the only
two a judge that picks by score can choose; at most two copies beside the
snapshot.
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
    """The held loss at the snapshot (`start`) and after each rate's branch (`scores`, `inf` where it
    diverged); with `keep_ends`, the host state some branches left (`ends`: rate -> what
    `kadapt.batching.training_state.restore` takes)."""

    start: float
    scores: dict
    ends: dict = dataclasses.field(default_factory=dict)


def branch_scores(model: keras.Model, rates: Sequence[float], set_rate: Callable[[float], None],
                  train_batches: Sequence[tuple], held_batches: Sequence[tuple],
                  keep_ends: bool = False) -> BranchScores:
    """The held loss from the model's state, and after training `train_batches` at each rate.

    `set_rate(rate)` makes the optimizer apply `rate` (it is called after the
    snapshot is restored, so it may change the rate's variables). A branch
    whose training loss turns non-finite stops and scores `inf`. The model
    leaves in the snapshot's state; with `keep_ends`, `ends` holds the state
    (every variable a step changes but the metrics') that the first rate's
    branch and the lowest-scoring other's left, where finite: restoring one
    is having trained those steps.

    Example:

    ```python
    trials = branch_scores(model, [1e-3, 1e-2], set_rate, train_batches=[(x1, y1)], held_batches=[(x2, y2)])
    trials.scores[1e-2] - trials.start   # how far ten steps at 0.01 moved the held loss
    ```
    """
    variables = state_variables(model)
    saved = host_snapshot(variables)
    metrics = {id(v) for v in model.metrics_variables}
    trained = [v for v in variables if id(v) not in metrics]  # fit resets and counts its own metrics
    scores, ends = {}, {}
    try:
        start = held_loss(model, held_batches)
        for index, rate in enumerate(rates):
            restore(saved)
            set_rate(rate)
            trains = train(model, train_batches)
            end = host_snapshot(trained) if keep_ends and trains else None
            scores[rate] = held_loss(model, held_batches) if trains else math.inf
            if end is None or not math.isfinite(scores[rate]):
                continue
            others = [r for r in ends if r != rates[0]]
            if index == 0:
                ends[rate] = end
            elif not others or scores[rate] < scores[others[0]]:
                ends = {r: e for r, e in ends.items() if r == rates[0]} | {rate: end}
    finally:
        restore(saved)
    return BranchScores(start, scores, ends)


def train(model: keras.Model, batches: Sequence[tuple]) -> bool:
    """Trains `batches` one step each; `False` once a step's loss is not finite (the rest untrained)."""
    for x, y in batches:
        loss = float(model.train_on_batch(x, y, return_dict=True)["loss"])
        if not math.isfinite(loss):
            return False
    return True


def held_loss(model: keras.Model, batches: Sequence[tuple]) -> float:
    """The mean loss over `batches` (`inf` where it is not finite)."""
    losses = [float(model.test_on_batch(x, y, return_dict=True)["loss"]) for x, y in batches]
    mean = sum(losses) / len(losses)
    return mean if math.isfinite(mean) else math.inf
