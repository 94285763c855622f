"""`WarmStates`: the range test's steps below the run's starting rate, kept as its warm-up.

The range test (`kadapt.find_learning_rate`) trains the model one step per
rate from 1e-7 upward and then puts the state back: ~90-100 steps of a
720-940-step run undone. Yet the sweep's steps up to a rate `r` are an
exponential warm-up to `r`: had the run trained them itself, at those rates,
it would be in that state. With `RangeTestStart(warmup=True)` the state the
sweep left below the rate the run starts from is kept, and those steps are
the run's own training (in `iterations`), not undone; only the sweep above it
is. Off by default: every step before `fit` counts toward the budget either
way, so it adds no step at the live rate, and on the held-out task-seeds it
harmed more well-set runs than it spared (docs/meta-model.md).

The rate the run starts from is known only after the sweep (the judge's
candidates are the live rate, the suggestion and between: never below both),
so the state is kept at a ladder of rates: every half decade below the live
rate down to 1000x below it (mis-set rates are 30-1000x off), then every
decade to the sweep's start (a diverging rate's suggestion may lie 3000x
below it): at most twelve host copies of the weights and slots, beside the
test's own, each the state after the sweep's last step at or below its rung.
The run goes on from the latest of them whose step's rate is at or below
`min(live, suggestion)` and after which the sweep ran a step without stopping
(the state was not the one that blew up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras
import numpy as np

from kadapt.batching.training_state import host_snapshot
from kadapt.batching.training_state import restore
from kadapt.batching.training_state import state_variables

RUNG = math.sqrt(10.0)  # kept states every half decade below the live rate
RUNGS = 7  # down to RUNG ** 6 = 1000x below it (mis-set rates are 30-1000x off)
FAR_RUNGS = 5  # then every decade, down to 1e8x below it (the sweep's eight decades)


class WarmStates:
    """The states a range-test sweep left at a ladder of rates below the live rate.

    Pass `on_step` to `kadapt.find_learning_rate(..., on_step=...)`; after the
    test, `warmup(model, rate)` puts the model in the state the sweep left
    after its last kept step at a rate at or below `rate`.

    Args:
        model: The compiled `keras.Model` the test runs on.
        rates: Sequence of floats. The sweep's rates, one a step
            (`kadapt.range_test.curve.sweep_rates`).
        live: Float. The rate the optimizer applies now; no state is kept
            where it is not a positive finite rate.

    Example:

    ```python
    warm = WarmStates(model, curve.sweep_rates(1e-7, 10.0, 100), live=0.01)
    result = kadapt.find_learning_rate(model, x, y, num_steps=100, on_step=warm.on_step)
    steps, rate = warm.warmup(model, min(0.01, result.suggestion))  # steps kept, the last one's rate
    ```
    """

    def __init__(self, model: keras.Model, rates: Sequence[float], live: float) -> None:
        self.model = model
        self.rates = np.asarray(rates, dtype=float)
        self.iterations = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        usable = math.isfinite(live) and live > 0
        near = [live / RUNG**index for index in range(RUNGS)]
        far = [near[-1] / 10.0**index for index in range(1, FAR_RUNGS + 1)]
        rungs = near + far if usable else []
        indexes = (int(np.searchsorted(self.rates, rung, side="right")) - 1 for rung in rungs)
        self.keep_at = {index for index in indexes if index >= 0}
        self.states: dict[int, list] = {}
        self.steps_seen = 0

    def on_step(self, step: int, rate: float, loss: float) -> None:
        """Keeps the model's state after `step` where it is a rung; counts the steps run."""
        self.steps_seen = step + 1
        if step in self.keep_at:
            self.states[step] = host_snapshot(_trained_variables(self.model))

    def warmup(self, model: keras.Model, rate: float) -> tuple[int, float | None]:
        """Puts `model` in the latest kept state whose step's rate is at or below `rate`, and returns
        the steps it holds and that rate; `(0, None)`, the model untouched, where none is.

        A state is usable only where the sweep ran on after it without stopping at the next step
        (that step's loss is the state's, and it did not diverge)."""
        stopped_early = self.steps_seen < len(self.rates)
        last_checked = self.steps_seen - 2 - int(stopped_early)
        usable = [step for step in self.states if step <= last_checked and self.rates[step] <= rate]
        if not usable or not math.isfinite(rate):
            return 0, None
        step = max(usable)
        restore(self.states[step])
        model.optimizer.iterations.assign(self.iterations + step + 1)
        return step + 1, float(self.rates[step])


def _trained_variables(model):
    """What a step changes, less the metrics (fit counts its own) and the optimizer's scalars:
    the rate, its multiplier, the momentum and `iterations` are the run's, not the sweep's."""
    metrics = {id(v) for v in model.metrics_variables}
    optimizer = {id(v) for v in model.optimizer.variables if len(v.shape) == 0}
    return [v for v in state_variables(model) if id(v) not in metrics and id(v) not in optimizer]
