"""`RangeTestStart`: the learning-rate range test the `MetaAdjuster` runs before the first step.

The meta-model sees the run only once it runs: from a rate one to three
decades off it needs several raises or cuts (each after its trigger's
patience) to come near a good rate. The range test (`kadapt.find_learning_rate`)
sees the loss over eight decades of rate in ~100 steps. So the adjuster runs
it once, from the model's state before the first step (the test puts that
state back), and moves the live rate to the suggestion where the two are more
than `factor` apart; from there the meta-model adjusts as before.

The sweep's smoothing follows its length (`curve.sweep_smoothing`): a run's
budget may leave the test only a few dozen steps, where fastai's beta 0.98
lags the whole sweep.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from kadapt.range_test import curve
from kadapt.range_test.batches import DEFAULT_BATCH_SIZE
from kadapt.validation import check_range

MIN_STEPS = 10  # kadapt.range_test.find's, which loads TensorFlow: imported where the test runs
BUDGET_SHARE = 0.5  # at most half the run's steps go to the test: at least half trains


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

    Args:
        x: Arrays (with `y`), or a dataset or generator of batches, as `fit`
            takes them: the training data (or a sample of it).
        y: Targets, with arrays only. Defaults to `None`.
        batch_size: Positive int, with arrays only; use the fit's. Defaults to 32.
        max_steps: Int >= 10. The most steps the test runs. Defaults to `100`.
        factor: Float > 1. The live rate moves to the suggestion only when it
            is more than `factor` times above or below it. Defaults to `3.0`.
        rule: `"valley"`, `"steepest"` or `"minimum/10"` (see
            `kadapt.find_learning_rate`). Defaults to `"valley"`.
        seed: Int or `None`. The shuffling of array rows. Defaults to `None`.

    Example:

    ```python
    start = kadapt.meta.RangeTestStart(x_train, y_train, batch_size=64)
    model.fit(x_train, y_train, batch_size=64, epochs=20, validation_split=0.2,
              callbacks=[kadapt.MetaAdjuster(range_test=start)])
    ```
    """

    def __init__(self, x: Any, y: Any = None, batch_size: int | None = None, max_steps: int = 100,
                 factor: float = 3.0, rule: str = "valley", seed: int | None = None) -> None:
        check_range("max_steps", max_steps, low=MIN_STEPS, integer=True)
        check_range("factor", factor, low=1.0, low_open=True)
        if rule not in curve.RULES:
            raise ValueError(f"Argument `rule` must be one of {sorted(curve.RULES)}. Received: rule={rule!r}")
        if batch_size is not None:
            check_range("batch_size", batch_size, low=1, integer=True)
        self.x, self.y, self.batch_size = x, y, batch_size
        self.max_steps, self.factor, self.rule, self.seed = max_steps, float(factor), rule, seed

    def num_steps(self, budget: int | None) -> int | None:
        """Steps of the test for a run of `budget` steps (`None`: unknown); `None` if there is no room."""
        steps = self.max_steps if budget is None else min(self.max_steps, int(budget * BUDGET_SHARE))
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

    def choose(self, learning_rate: float, suggestion: float) -> float | None:
        """The rate to move to: `suggestion` when more than `factor` off `learning_rate`, else `None`."""
        if not math.isfinite(learning_rate) or learning_rate <= 0:
            return suggestion
        off = max(learning_rate / suggestion, suggestion / learning_rate)
        return suggestion if off > self.factor else None


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
