"""When to consult the meta-model: rules over the current and recent losses.

`Trigger.update(loss)` takes one observation of the monitored loss and returns
the reason to act now, or `None`:

- `"divergence"`: the loss is NaN/Inf or above `explode_factor` × the lowest
  running median (of `patience` + 1 losses) seen so far: a median, so one
  lucky low mini-batch loss does not make ordinary noise look like an
  explosion; the lowest, so a run that blew up and stays high is caught too.
- `"plateau"`: the best has not improved by `min_delta` (relative) for
  `patience` observations.
- `"oscillation"`: the last `patience` + 1 differences alternate in sign and
  the net change is smaller than the swings.
- `"slow_progress"`: it improves, but by less than `slow_fraction` of the loss
  over `patience` observations.
- `"scheduled"` (only with `consult_every`): none of the above, but
  `consult_every` observations have passed since the last adjustment (or the
  start). The records the meta-model learns from branch at fixed points of a
  run, whatever its losses do; a run whose rate is far too low improves
  steadily and never looks "slow" to the rule above.

After an adjustment it waits `cooldown` observations before it fires again,
except for divergence, which always fires.
"""

from __future__ import annotations

import math
import statistics

from kadapt.validation import check_non_negative_int
from kadapt.validation import check_range


class Trigger:
    """Decides from a loss history when an adjustment is called for.

    Args:
        patience: Int >= 2. Observations a plateau, oscillation or slow trend
            must last. Defaults to `3`.
        cooldown: Int >= 0. Observations to wait after an adjustment.
            Defaults to `2`.
        min_delta: Float >= 0. Relative improvement that counts. Defaults to `1e-3`.
        slow_fraction: Float >= 0. Improvement over `patience` observations
            below which progress is "slow". Defaults to `0.15`.
        explode_factor: Float > 1. Defaults to `3.0`.
        consult_every: Int >= 1 or `None`. Fire `"scheduled"` after this many
            observations without an adjustment; `None`: only the rules.
            Defaults to `None`.

    Example:

    ```python
    trigger = Trigger(patience=3)
    reasons = [trigger.update(loss) for loss in [1.0, 1.0, 1.0, 1.0]]
    # [None, None, None, "plateau"]
    ```
    """

    def __init__(self, patience: int = 3, cooldown: int = 2, min_delta: float = 1e-3, slow_fraction: float = 0.15,
                 explode_factor: float = 3.0, consult_every: int | None = None) -> None:
        check_range("patience", patience, low=2, integer=True)
        check_non_negative_int(cooldown, "cooldown")
        check_range("min_delta", min_delta, low=0.0)
        check_range("slow_fraction", slow_fraction, low=0.0)
        check_range("explode_factor", explode_factor, low=1.0, low_open=True)
        if consult_every is not None:
            check_range("consult_every", consult_every, low=1, integer=True)
        self.consult_every = None if consult_every is None else int(consult_every)
        self.patience, self.cooldown, self.min_delta = int(patience), int(cooldown), min_delta
        self.slow_fraction, self.explode_factor = slow_fraction, explode_factor
        self.losses = []
        self._recent = []
        self.best_median = math.inf
        self.best = math.inf
        self.since_best = 0
        self.wait = 0

    def update(self, loss: float) -> str | None:
        """Adds one observation; returns the trigger name or `None`."""
        loss = float(loss)
        if not math.isfinite(loss) or loss > self.explode_factor * self.best_median:
            return "divergence"
        self._recent = self._recent[-self.patience:] + [loss]
        self.best_median = min(self.best_median, float(statistics.median(self._recent)))
        self.losses.append(loss)
        if loss < self.best * (1 - self.min_delta):
            self.best, self.since_best = loss, 0
        else:
            self.since_best += 1
        if self.wait > 0:
            self.wait -= 1
            return None
        return self._trend()

    def seed(self, loss: float) -> None:
        """Sets the reference for "exploded" before the first observation (e.g. the
        first mini-batch's loss, measured at the initial weights)."""
        if math.isfinite(loss):
            self.best_median = min(self.best_median, float(loss))

    def rebaseline(self, loss: float) -> None:
        """After a rollback to a state whose loss was `loss`: that state is not "exploded"."""
        if math.isfinite(loss):
            self.best_median = max(self.best_median, float(loss))
        self._recent = []

    def adjusted(self) -> None:
        """Call after an adjustment: restarts the patience and the cooldown."""
        self.wait, self.since_best = self.cooldown, 0
        self.losses = self.losses[-1:]

    def get_state(self) -> dict:
        """The loss history the trigger decides from, as JSON values (for a resume)."""
        return {"losses": [float(v) for v in self.losses], "recent": [float(v) for v in self._recent],
                "best_median": float(self.best_median), "best": float(self.best),
                "since_best": int(self.since_best), "wait": int(self.wait)}

    def set_state(self, state: dict) -> None:
        """Restores what `get_state` returned."""
        self.losses, self._recent = [float(v) for v in state["losses"]], [float(v) for v in state["recent"]]
        self.best_median, self.best = float(state["best_median"]), float(state["best"])
        self.since_best, self.wait = int(state["since_best"]), int(state["wait"])

    # Plain Python on a few floats: it runs at every observation, where NumPy's per-call
    # cost (np.median, np.diff) was ~0.1 ms of the adjuster's overhead.
    def _trend(self):
        if self.since_best >= self.patience:
            return "plateau"
        if len(self.losses) > self.patience:
            recent = self.losses[-(self.patience + 1):]
            steps = [later - earlier for earlier, later in zip(recent, recent[1:])]
            alternating = all(step * previous < 0 for previous, step in zip(steps, steps[1:]))
            if alternating and abs(recent[-1] - recent[0]) < max(abs(step) for step in steps):
                return "oscillation"
            if 0 < recent[0] - recent[-1] < self.slow_fraction * recent[0]:
                return "slow_progress"
        if self.consult_every is not None and len(self.losses) > self.consult_every:
            return "scheduled"
        return None
