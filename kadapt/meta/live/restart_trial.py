"""`RestartTrial`: a restart judged by the run, for a too-high rate that learned a little.

A run's first early cut restarts it from its initial state where it has kept
most of its starting loss (`AdjustmentPolicy(restart_above=0.75)`). A run that
learned more before the cut (fashion_conv at 0.72, 19x the grid's best rate,
at 0.61-0.70 of its starting loss after 3 epochs of 20) has learned it at a
rate that settles far above the grid's best loss; a cut does not bring it back,
and a blind restart would throw away runs that were fine (the policy's notes).
So such a cut (the loss between `trial_above` and `restart_above` of the
start, or a cut a scheduled consultation chose) is judged: from the initial
state, its slots zeroed, a branch trains at the cut rate for as many steps as
the run has trained (at most `share` of the budget), and is scored on held
rows beside the run as it is now. Where the branch is lower, younger and
already ahead, the run goes on from the branch's end: the restart, with those
steps trained. Otherwise the run goes back to where it was and takes the cut
there; the branch's steps are charged to the budget.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import keras

from kadapt.batching.training_state import host_snapshot
from kadapt.batching.training_state import restore
from kadapt.batching.training_state import state_variables
from kadapt.meta.observe import rollback
from kadapt.meta.start.branch_trials import held_loss
from kadapt.meta.start.branch_trials import train
from kadapt.meta.start.range_test_start import split_batches
from kadapt.range_test.batches import DEFAULT_BATCH_SIZE
from kadapt.validation import check_range

TRIAL_SHARE = 0.1  # of the budget, at most, a branch trains (and is charged where the run keeps on)
HELD_ROWS = 256  # the rows a branch and the run are scored on


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """A restart trial's outcome: the branch's `steps`, the held loss of the run as it was
    (`held_now`) and at the branch's end (`held_branch`, `inf` where it diverged)."""

    steps: int
    held_now: float
    held_branch: float

    @property
    def taken(self) -> bool:
        """Whether the branch beat the run: the run goes on from the branch's end."""
        return self.held_branch < self.held_now

    def detail(self) -> dict[str, Any]:
        """The trial as the decision log writes it."""
        return {"steps": self.steps, "held_loss_now": rounded(self.held_now),
                "held_loss_restarted": rounded(self.held_branch), "taken": self.taken}


class RestartTrial:
    """The data a `MetaAdjuster` judges a restart on, and how long the branch trains.

    Keras gives a callback no access to the data `fit` trains on, so it is
    given here, as arrays. The branch trains shuffled batches of `x, y`; the
    run and the branch are scored on the first 256 rows of `validation_data`,
    or, without it, on up to 256 rows of `x` held out of the branch's batches
    (rows the run has trained on: the comparison then leans to the run).

    Args:
        x: Array, or a list or dict of arrays: the training inputs (or a sample).
        y: Array (or a structure of arrays): the targets.
        validation_data: Tuple `(x_val, y_val)` or `None`. Defaults to `None`.
        batch_size: Positive int: the fit's. Defaults to 32.
        seed: Int or `None`. The shuffling of the rows. Defaults to `None`.
        share: Float in (0, 1]. The most of the budget the branch trains.
            Defaults to `TRIAL_SHARE` (0.1).

    Example:

    ```python
    trial = kadapt.meta.RestartTrial(x_train, y_train, validation_data=(x_val, y_val), batch_size=64)
    model.fit(x_train, y_train, batch_size=64, epochs=20, validation_data=(x_val, y_val),
              callbacks=[kadapt.MetaAdjuster(restart_trial=trial)])
    ```
    """

    def __init__(self, x: Any, y: Any, validation_data: tuple | None = None, batch_size: int | None = None,
                 seed: int | None = None, share: float = TRIAL_SHARE) -> None:
        self.rows = count_rows("x", x)
        if count_rows("y", y) != self.rows:
            raise ValueError("Arguments `x` and `y` must hold as many rows. "
                             f"Received: {self.rows} and {count_rows('y', y)}")
        if self.rows < 2:
            raise ValueError(f"Argument `x` must hold at least 2 rows. Received: {self.rows}")
        if validation_data is not None:
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
                raise TypeError("Argument `validation_data` must be a tuple (x_val, y_val) of arrays or None. "
                                f"Received: validation_data={type(validation_data).__name__}")
            if count_rows("validation_data[0]", validation_data[0]) < 1:
                raise ValueError("Argument `validation_data` must hold at least one row, or be None.")
        if batch_size is not None:
            check_range("batch_size", batch_size, low=1, integer=True)
        check_range("share", share, low=0.0, high=1.0, low_open=True)
        self.x, self.y, self.validation_data = x, y, validation_data
        self.batch_size, self.seed, self.share = batch_size or DEFAULT_BATCH_SIZE, seed, float(share)

    def num_steps(self, steps_so_far: int, total_steps: int | None) -> int:
        """The branch's steps: the run's so far, at most `share` of the budget (when known), at least 1."""
        most = steps_so_far if total_steps is None else int(self.share * total_steps)
        return max(1, min(steps_so_far, most))

    def batches(self, num_train: int) -> tuple[Sequence, list]:
        """`num_train` training batches (each taken when read) and the held ones, of `(x, y)`."""
        held_batches = -(-HELD_ROWS // self.batch_size)
        if self.validation_data is None:
            return split_batches(self.x, self.y, self.batch_size, num_train, held_batches, self.seed)
        train_batches, _ = split_batches(self.x, self.y, self.batch_size, num_train, 0, self.seed)
        x_val, y_val = self.validation_data
        rows = min(HELD_ROWS, count_rows("validation_data[0]", x_val))

        def take(data, start):
            return keras.tree.map_structure(lambda a: a[start:min(start + self.batch_size, rows)], data)

        return train_batches, [(take(x_val, s), take(y_val, s)) for s in range(0, rows, self.batch_size)]

    def run(self, model: keras.Model, start: Any, apply_cut: Callable[[], None], steps_so_far: int,
            total_steps: int | None) -> TrialResult:
        """Trains the branch from `start` (a rollback point; slots zeroed) after `apply_cut()`, and
        scores it beside the model's state now. Where the branch wins (`TrialResult.taken`) the model
        is left at its end (metric variables as they were); else as it came, bit for bit."""
        steps = self.num_steps(steps_so_far, total_steps)
        train_batches, held_batches = self.batches(steps)
        metrics = host_snapshot(list(model.metrics_variables))  # fit counts its own
        saved = host_snapshot(state_variables(model))
        try:
            now = held_loss(model, held_batches)
            rollback.restore(model, start, restart_momentum=True)
            apply_cut()
            branch = held_loss(model, held_batches) if train(model, train_batches) else math.inf
            result = TrialResult(steps, now, branch)
        except BaseException:
            restore(saved)
            raise
        restore(metrics if result.taken else saved)
        return result


def count_rows(name: str, data: Any) -> int:
    """The rows of `data` (an array or a structure of arrays); a `TypeError` naming `name` otherwise."""
    leaves = keras.tree.flatten(data)
    if not leaves or not all(hasattr(leaf, "shape") and len(getattr(leaf, "shape", ())) for leaf in leaves):
        raise TypeError(f"Argument `{name}` must be an array or a list or dict of arrays (a dataset or "
                        f"generator cannot be replayed): pass the arrays, or a sample of them. "
                        f"Received: {type(data).__name__}")
    return int(leaves[0].shape[0])


def rounded(value: float) -> float | None:
    """`value` at 6 decimals for the decision log; `None` where it is not finite (JSON has no inf)."""
    return round(float(value), 6) if math.isfinite(value) else None
