"""`HighRateCheck`: a rate too high that still trains, read from a branch at a tenth of it.

A run whose rate is 10-100x above the one that trains best may not diverge:
its loss falls for an epoch or two, then stays high and noisy, and no trigger
fires on a run that trains (issue 65: a regression at SGD 0.2 ends at 1.26x
the grid-best). The evidence read here is the noise floor such a rate holds
the loss on. At the check's epoch ends (the 2nd and 4th), from a snapshot, the
run at its live rate and at a tenth of it each train the same batches (one
epoch's steps, at most `share` of the budget, none under `MIN_STEPS`;
`kadapt.meta.start.branch_trials.branch_scores`) and are scored on held rows,
the lower branch with the optimizer's slots zeroed (Keras' SGD keeps its
velocity scaled by the rate: carried over, it drove the lower branch above the
live one's held loss, measured). A check reads the rate too high where

    held(a tenth of the rate) < ratio x held(live rate)

and the run moves where `agree` checks in a row read so. A lower rate gains a
little on a short branch (the short-horizon bias), a well-set one by some
percent. On the development seeds (docs/meta-model.md) the reading fell under
0.7 on 6 of 9 too-high runs that train (0.34-0.63; circles, friedman) and read
0.72-1.34 on 16 well-set ones, the adding GRU's aside (0.45-1.25, three of six
under 0.7 once): one reading moves 3 of 22 well-set runs, two in a row 1.

The move is the policy's first early cut (`AdjustmentRunner.cut_too_high`):
from the initial state where the run kept most of its starting loss, judged
(`RestartTrial`) where it kept less, else from the lower branch's end. Where
the rate is kept, the run goes on from the live branch's end: those steps are
its own, and the other branch's are charged to the budget.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras

from kadapt.batching.training_state import restore
from kadapt.meta.live.restart_trial import count_rows
from kadapt.meta.live.restart_trial import rounded
from kadapt.meta.observe import rollback
from kadapt.meta.start.branch_trials import BranchScores
from kadapt.meta.start.branch_trials import branch_scores
from kadapt.meta.start.range_test_start import split_batches
from kadapt.optimizers.live_rate import live_rate_of
from kadapt.optimizers.live_rate import set_learning_rate_multiplier
from kadapt.range_test.batches import DEFAULT_BATCH_SIZE
from kadapt.validation import check_range

CHECK_EPOCHS = (2, 4)  # the epoch ends (epochs done) the check runs at: "within the first few epochs"
FACTOR = 0.1  # the lower branch's rate over the live one: the policy's largest cut, which a move applies
RATIO = 0.7  # the branch's held loss must be below this times the live rate's
AGREE = 2  # checks in a row that must read so: one reading moved well-set GRUs on the development seeds
SHARE = 0.05  # of the budget, at most, each branch trains
HELD_ROWS = 256  # the rows both branches are scored on
MIN_STEPS = 10  # shorter branches read noise (iris, 4 steps an epoch: well-set runs moved, held out)


@dataclasses.dataclass(frozen=True)
class HighRateReading:
    """One check's outcome: each branch's `steps`, the held loss at the snapshot (`start`), after
    the live rate's branch (`live`) and after the lower rate's (`lower`; `inf` where one diverged),
    whether the lower one read below `ratio` times the live one (`below`) and whether the run
    moved (`moved`)."""

    steps: int
    start: float
    live: float
    lower: float
    below: bool
    moved: bool

    def detail(self) -> dict[str, Any]:
        """The check as the decision log writes it."""
        return {"steps": self.steps, "held_loss_start": rounded(self.start), "held_loss_live": rounded(self.live),
                "held_loss_lower": rounded(self.lower), "below": self.below, "moved": self.moved}


class HighRateCheck:
    """The rows and the rule a `MetaAdjuster` reads a too-high rate that trains from (module docstring).

    Args:
        x: Array, or a list or dict of arrays: training inputs (or a sample).
        y: Array (or a structure of arrays): the targets.
        batch_size: Positive int: the fit's. Defaults to 32.
        seed: Int or `None`. The shuffling of the rows. Defaults to `None`.
        epochs: Tuple of positive ints. The epoch ends (epochs done) the check
            runs at, where nothing else changed the rate. Defaults to `(2, 4)`.
        ratio: Float in (0, 1]. A check reads the rate too high where the
            lower branch's held loss ends below `ratio` times the live
            branch's. Defaults to `0.7`.
        agree: Int in [1, len(epochs)]. The run moves at a check where it and
            the `agree - 1` checks before it read the rate too high. Defaults to `2`.
        share: Float in (0, 0.5]. The most of the budget each branch trains.
            Defaults to `0.05`.

    Example:

    ```python
    check = kadapt.meta.HighRateCheck(x_train, y_train, batch_size=64)
    model.fit(x_train, y_train, batch_size=64, epochs=20, validation_split=0.2,
              callbacks=[kadapt.MetaAdjuster(high_rate=check)])
    ```
    """

    def __init__(self, x: Any, y: Any, batch_size: int | None = None, seed: int | None = None,
                 epochs: tuple[int, ...] = CHECK_EPOCHS, ratio: float = RATIO, agree: int = AGREE,
                 share: float = SHARE) -> None:
        rows = count_rows("x", x)
        if count_rows("y", y) != rows:
            raise ValueError(f"Arguments `x` and `y` must hold as many rows. Received: {rows} and {count_rows('y', y)}")
        if rows < 2:
            raise ValueError(f"Argument `x` must hold at least 2 rows (one held). Received: {rows}")
        if batch_size is not None:
            check_range("batch_size", batch_size, low=1, integer=True)
        if not isinstance(epochs, (tuple, list)) or not epochs or not all(
                isinstance(e, int) and not isinstance(e, bool) and e >= 1 for e in epochs):
            raise ValueError("Argument `epochs` must be a non-empty tuple of positive ints. "
                             f"Received: epochs={epochs!r}")
        check_range("ratio", ratio, low=0.0, high=1.0, low_open=True)
        check_range("agree", agree, low=1, high=len(epochs), integer=True)
        check_range("share", share, low=0.0, high=0.5, low_open=True)
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size or DEFAULT_BATCH_SIZE, seed
        self.epochs, self.ratio, self.agree, self.share = tuple(epochs), float(ratio), int(agree), float(share)

    def num_steps(self, steps_per_epoch: int | None, total_steps: int | None) -> int:
        """Each branch's steps: one epoch's, at most `share` of the budget (when known); 0 (no
        check) where that is under `MIN_STEPS`."""
        steps = steps_per_epoch or total_steps or 0
        steps = min(steps, int(self.share * total_steps)) if total_steps else steps
        return steps if steps >= MIN_STEPS else 0

    def read(self, model: keras.Model, steps: int) -> BranchScores:
        """Both branches from the model's state now (restored after them): `scores` keyed by the
        multiplier each trained at, the live one first; `ends` the state each left."""
        live = float(keras.ops.convert_to_numpy(live_rate_of(model)))
        start = rollback.take(model)

        def set_rate(rate):
            set_learning_rate_multiplier(model.optimizer, rate)
            if rate != live:  # a velocity built at the live rate would carry the lower branch on at it
                rollback.restore(model, start, restart_momentum=True)

        return branch_scores(model, [live, live * FACTOR], set_rate, *self.batches(steps), keep_ends=True)

    def batches(self, steps: int) -> tuple[Any, list]:
        """`steps` training batches (the same for both branches) and the held ones, of `(x, y)`."""
        return split_batches(self.x, self.y, self.batch_size, steps, -(-HELD_ROWS // self.batch_size), self.seed)

    def below(self, scores: BranchScores) -> bool:
        """Whether the lower branch ended clearly below the live one (`ratio`)."""
        live, lower = scores.scores.values()
        return math.isfinite(lower) and lower < self.ratio * live

    def run(self, model: keras.Model, steps: int, below_before: int = 0) -> tuple[HighRateReading, Any]:
        """Reads both branches; the rule moves where this reading and the `agree - 1` before it
        (`below_before`: the checks in a row before this one that read below) read below. Where it
        keeps the rate, the model is left at the live branch's end (as it came where that branch
        did not finish). Returns the reading and, where it moves, the lower branch's end state
        (what `kadapt.batching.training_state.restore` takes), the model left as it came."""
        scores = self.read(model, steps)
        below = self.below(scores)
        moved = below and below_before + 1 >= self.agree
        live_rate, lower_rate = scores.scores
        if not moved and live_rate in scores.ends:
            restore(scores.ends[live_rate])
        live, lower = scores.scores.values()
        reading = HighRateReading(steps, scores.start, live, lower, below, moved)
        return reading, scores.ends.get(lower_rate) if moved else None

    def get_config(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "seed": self.seed, "epochs": self.epochs, "ratio": self.ratio,
                "agree": self.agree, "share": self.share}

