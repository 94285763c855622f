"""`RangeTestStart`: the learning-rate range test the `MetaAdjuster` runs before the first step.

The meta-model sees the run only once it runs: from a rate one to three
decades off it needs several raises or cuts (each after its trigger's
patience) to come near a good rate. The range test (`kadapt.find_learning_rate`)
sees the loss over eight decades of rate in ~100 steps. So the adjuster runs
it once, from the model's state before the first step (the test puts that
state back). The suggestion is then judged by the run (`judge="branches"`,
`kadapt.meta.start.start_judge`): a few steps at the live rate, the suggestion and
rates near it, each from the same snapshot, scored on held batches, and the
live rate kept unless one is clearly better. `judge="always"` moves the live
rate to the suggestion wherever the two are more than `factor` apart, as the
first version did; on held-out tasks that moved well-set rates as readily as
mis-set ones. From there the meta-model adjusts as before.

The sweep's smoothing follows its length (`curve.sweep_smoothing`): a run's
budget may leave the test only a few dozen steps, where fastai's beta 0.98
lags the whole sweep.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from kadapt.meta.start.start_judge import BRANCH_SHARE
from kadapt.meta.start.start_judge import StartJudge
from kadapt.range_test import curve
from kadapt.range_test.batches import DEFAULT_BATCH_SIZE
from kadapt.validation import check_range

MIN_STEPS = 10  # kadapt.range_test.find's, which loads TensorFlow: imported where the test runs
BUDGET_SHARE = 0.5  # at most half the run's steps go to the test (and branches): at least half trains
TEST_SHARE = BUDGET_SHARE - BRANCH_SHARE  # the judged test's most; shorter sweeps read worse (benchmarks/README)
JUDGES = ("branches", "always")
HELD_SHARE = 0.25  # of the rows, at most, held out of the branches' training to score them


class RangeTestStart:
    """The range test a `MetaAdjuster` runs before the first step, and its rule.

    Keras gives a callback no access to the data `fit` trains on, so the
    test's data is given here. Arrays are drawn in shuffled batches, epoch
    after epoch, for as many steps as the test takes; a `tf.data.Dataset`,
    `keras.utils.PyDataset` or generator must hold that many batches.

    The test runs `min(max_steps, budget // 2)` steps (the budget: `epochs x
    steps per epoch` of the fit), its rate rising from 1e-7 to 10 (fastai's
    range), the loss smoothed over half the sweep, the rate read off with
    `rule`. Its steps are charged to the run: the adjuster counts them as
    steps trained and ends `fit` once the two together reach the budget.

    With `judge="branches"` (the default) the suggestion is judged before it
    is applied: from a snapshot, the live rate, the suggestion and their
    geometric mean each train up to 10 steps on the same batches and are
    scored by the loss on held batches (rows none of them trained on); the
    live rate moves only to a candidate that lowers the held loss more than
    twice as much (`kadapt.meta.start.start_judge.StartJudge`). The test then takes
    at most 30% of the budget and the branches 20%. With `continue_branch`
    (the default) the run goes on from the end of the chosen rate's branch
    (the live rate's where it is kept): those steps are the run's own
    training, and only the test's and the other branches' steps are charged.

    Args:
        x: Arrays (with `y`), or a dataset or generator of batches, as `fit`
            takes them: the training data (or a sample of it).
        y: Targets, with arrays only. Defaults to `None`.
        batch_size: Positive int, with arrays only; use the fit's. Defaults to 32.
        max_steps: Int >= 10. The most steps the test runs. Defaults to `100`.
        factor: Float > 1. With `judge="always"`, the live rate moves to the
            suggestion only when it is more than `factor` times above or
            below it. Defaults to `3.0`.
        rule: `"valley"`, `"steepest"` or `"minimum/10"` (see
            `kadapt.find_learning_rate`). Defaults to `"valley"`.
        seed: Int or `None`. The shuffling of array rows. Defaults to `None`.
        judge: `"branches"`, `"always"` or a `kadapt.meta.start.start_judge.StartJudge`
            (`"branches"` is `StartJudge()`). Defaults to `"branches"`.
        continue_branch: Bool. With a judge of branches, whether the run goes
            on from the chosen rate's branch (`True`) or from the state before
            the branches, all their steps charged (`False`). Defaults to `True`.

    Example:

    ```python
    start = kadapt.meta.RangeTestStart(x_train, y_train, batch_size=64)
    model.fit(x_train, y_train, batch_size=64, epochs=20, validation_split=0.2,
              callbacks=[kadapt.MetaAdjuster(range_test=start)])
    ```
    """

    def __init__(self, x: Any, y: Any = None, batch_size: int | None = None, max_steps: int = 100,
                 factor: float = 3.0, rule: str = "valley", seed: int | None = None,
                 judge: str | StartJudge = "branches", continue_branch: bool = True) -> None:
        check_range("max_steps", max_steps, low=MIN_STEPS, integer=True)
        check_range("factor", factor, low=1.0, low_open=True)
        if rule not in curve.RULES:
            raise ValueError(f"Argument `rule` must be one of {sorted(curve.RULES)}. Received: rule={rule!r}")
        if batch_size is not None:
            check_range("batch_size", batch_size, low=1, integer=True)
        self.x, self.y, self.batch_size = x, y, batch_size
        self.max_steps, self.factor, self.rule, self.seed = max_steps, float(factor), rule, seed
        self.judge = _check_judge(judge)
        if not isinstance(continue_branch, bool):
            raise TypeError("Argument `continue_branch` must be True or False. "
                            f"Received: continue_branch={continue_branch!r}")
        self.continue_branch = continue_branch

    def num_steps(self, budget: int | None) -> int | None:
        """Steps of the test for a run of `budget` steps (`None`: unknown); `None` if there is no room."""
        share = TEST_SHARE if self.judge is not None else BUDGET_SHARE
        steps = self.max_steps if budget is None else min(self.max_steps, int(budget * share))
        return steps if steps >= MIN_STEPS else None

    def run(self, model: keras.Model, num_steps: int) -> Any:
        """`kadapt.find_learning_rate` on `model` for `num_steps`; the model is left as it was.

        Raises:
            ValueError: the curve gives no rate (it never fell, or diverged
                too early), or the data ran out.
        """
        from kadapt.range_test.find import find_learning_rate

        x, y, batch_size = self.x, self.y, self.batch_size
        if _is_arrays(x):
            x, y, batch_size = _endless_batches(x, y, batch_size or DEFAULT_BATCH_SIZE, self.seed), None, None
        return find_learning_rate(model, x, y, batch_size=batch_size, num_steps=num_steps,
                                  smoothing=curve.sweep_smoothing(num_steps), rule=self.rule)

    def branch_batches(self, num_train: int, num_held: int) -> tuple[Sequence, list]:
        """`num_train` batches for every branch to train on and up to `num_held` to score it on,
        as sequences of `(x, y)`; with arrays, the held batches are rows the training batches never
        draw (at most a quarter of them). A dataset or generator gives its next batches, the held
        ones first.

        Raises:
            ValueError: the data ran out.
        """
        if _is_arrays(self.x):
            return split_batches(self.x, self.y, self.batch_size or DEFAULT_BATCH_SIZE, num_train, num_held,
                                  self.seed)
        from kadapt.range_test.batches import batches

        iterator, _ = batches(self.x, None, None, shuffle=False)
        taken = [(x, y) for _, (x, y, _) in zip(range(num_held + num_train), iterator)]
        if len(taken) < num_held + num_train:
            raise ValueError(f"Argument `x` ran out after {len(taken)} batches: the branches need "
                             f"{num_held + num_train} more after the range test's.")
        return taken[num_held:], taken[:num_held]

    def choose(self, learning_rate: float, suggestion: float) -> float | None:
        """`judge="always"`'s rule: `suggestion` when more than `factor` off `learning_rate`, else `None`."""
        if not math.isfinite(learning_rate) or learning_rate <= 0:
            return suggestion
        off = max(learning_rate / suggestion, suggestion / learning_rate)
        return suggestion if off > self.factor else None


def _check_judge(judge):
    if isinstance(judge, StartJudge):
        return judge
    if judge not in JUDGES:
        raise ValueError(f"Argument `judge` must be one of {list(JUDGES)} or a "
                         "kadapt.meta.start.start_judge.StartJudge. "
                         f"Received: judge={judge!r}")
    return StartJudge() if judge == "branches" else None


def _is_arrays(x):
    leaves = keras.tree.flatten(x) if isinstance(x, (list, tuple, dict)) else [x]
    return bool(leaves) and all(hasattr(leaf, "shape") and hasattr(leaf, "__array__") for leaf in leaves)


def _endless_batches(x, y, batch_size, seed) -> Iterator[tuple]:
    """Shuffled batches of `(x, y)`, one pass over the rows after another."""
    rng = np.random.default_rng(seed)
    rows = len(keras.tree.flatten(x)[0])

    def take(data, index):
        return None if data is None else keras.tree.map_structure(lambda a: np.asarray(a)[index], data)

    while True:
        order = rng.permutation(rows)
        for start in range(0, rows, batch_size):
            index = order[start:start + batch_size]
            yield take(x, index), take(y, index)


def split_batches(x: Any, y: Any, batch_size: int, num_train: int, num_held: int,
                  seed: int | None) -> tuple[Sequence, list]:
    """`num_train` training batches and up to `num_held` held ones, of `(x, y)` arrays: the held
    (a list) from the first rows of one shuffle (at most a quarter of them), the training
    batches (a sequence, each taken when read) from the rest, repeated as often as needed;
    `num_held=0` holds none out."""
    rows = len(keras.tree.flatten(x)[0])
    order = np.random.default_rng(None if seed is None else [seed, 1]).permutation(rows)
    held_rows = max(1, min(num_held * batch_size, int(rows * HELD_SHARE))) if num_held else 0
    held, rest = order[:held_rows], order[held_rows:]
    if not len(rest):
        raise ValueError(f"Argument `x` must hold at least 2 rows for the branches (one held). Received: {rows}")

    def take(index):
        return tuple(None if data is None else keras.tree.map_structure(lambda a: np.asarray(a)[index], data)
                     for data in (x, y))

    held_batches = [take(held[start:start + batch_size]) for start in range(0, held_rows, batch_size)]
    train_index = np.resize(rest, num_train * batch_size)  # the rest, repeated as often as needed
    return _Batches(take, train_index, batch_size), held_batches


class _Batches(Sequence):
    """Batches of rows taken when read: a restart trial's may span a tenth of the budget."""

    def __init__(self, take, index, batch_size):
        self._take, self._index, self._batch_size = take, index, batch_size

    def __len__(self):
        return -(-len(self._index) // self._batch_size)

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._take(self._index[i * self._batch_size:(i + 1) * self._batch_size])
