"""`DeadRunRule`: recognises a run left at chance or blown up, from its epoch losses.

Two signatures, checked at every epoch end from the first:

- **diverged**: a loss is not finite, or the epoch's training loss is at
  least `jump` (10) times the lowest training loss seen so far, or its
  monitored loss as many times the lowest monitored one (the first batch's
  loss, at the initial weights, counts as both). Each against its own: a
  network that learns a small table's training rows far better than it
  validates has a validation loss many times its training loss and has not
  diverged. A loss an order of magnitude
  up is a step that left the basin, not noise: on scikit-learn's raw wine
  the recipe's SGD took the first epoch's mean loss from ~1.1 to ~6,400.
  Not the constant predictor's loss: on raw rows a network's first loss
  can be 30x chance (wine, Adam) and still fall.
- **at_chance**: the monitored loss (validation, else training) is at or
  above the constant predictor's (`kadapt.meta.chance_loss`, less
  `tolerance` of it) at two epochs in a row, the second no more than
  `tolerance` below the first, and the epoch's training loss is at or above
  the constant predictor's on the training rows too. A network whose units
  died outputs a constant and sits exactly there on both; a run that is
  only slow to start (a warmup) is above chance after its first epoch too,
  but falls epoch after epoch (measured on four tables:
  benchmarks/README.md#table_recipe), hence the second epoch and the fall.
  A network that learns its training rows while its validation loss stays
  at chance is not dead: its target holds little a network can carry to new
  rows (a noisy regression: on the public table `fair`, a rollback to the
  initial weights at a tenth of the rate, three times, ended at 1.38x the
  test MSE of the careful user's network, benchmarks/README.md#public_tables).

The rule is pure: the state (`RunHealth`) goes in and comes out; the caller
(`kadapt.meta.DeadRunRescue`) acts on the trigger. At most
`max_actions` triggers are returned; after that every epoch is judged healthy
(the run goes on as it is).
"""

from __future__ import annotations

import dataclasses
import math

from kadapt.validation import check_range

AT_CHANCE, DIVERGED = "at_chance", "diverged"


@dataclasses.dataclass(frozen=True)
class RunHealth:
    """What the rule remembers between epochs.

    Args:
        lowest_loss: Float. The lowest training loss seen (`inf` until one is).
        previous: Float or `None`. The last epoch's monitored loss, when it was at chance.
        actions: Int. The triggers returned so far.
        lowest_monitored: Float. The lowest monitored loss seen (`inf` until one is).
    """

    lowest_loss: float = math.inf
    previous: float | None = None
    actions: int = 0
    lowest_monitored: float = math.inf


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The rule's answer: `trigger` (`"at_chance"`, `"diverged"` or `None`: healthy), why, and the new state."""

    trigger: str | None
    reason: str
    state: RunHealth


class DeadRunRule:
    """Recognises a run at chance or diverged (see the module's docstring).

    Args:
        chance_loss: Float > 0. The constant predictor's loss in the monitored
            loss's terms (`kadapt.meta.live.chance_loss.chance_loss`,
            `regression_chance_loss`); `math.inf` turns the at-chance
            signature off (the chance level is unknown), leaving divergence.
        training_chance_loss: Float > 0 or `None`. The constant predictor's
            loss on the training rows, where the monitored loss is another
            split's. Defaults to `None`: `chance_loss`.
        tolerance: Float in [0, 1). How near chance counts as at chance, and
            the least relative fall that counts as learning. Defaults to `0.02`.
        jump: Float > 1. How many times its lowest a training loss must be
            to count as diverged. Defaults to `10.0`.
        max_actions: Int >= 0. The most triggers a run gets. Defaults to `3`.
        rate_factor: Float in (0, 1). What an action multiplies the rate by
            where no range test sets it, and the least cut after a
            divergence. Defaults to `0.1`.

    Example:

    >>> rule = DeadRunRule(chance_loss=1.0986)
    >>> state = rule.start(initial_loss=1.2)
    >>> rule.judge(state, loss=6369.0, monitored=1.0986).trigger
    'diverged'
    """

    def __init__(self, chance_loss: float, tolerance: float = 0.02, jump: float = 10.0, max_actions: int = 3,
                 rate_factor: float = 0.1, training_chance_loss: float | None = None):
        check_range("chance_loss", chance_loss, low=0.0, low_open=True)
        if training_chance_loss is not None:
            check_range("training_chance_loss", training_chance_loss, low=0.0, low_open=True)
        self.training_chance_loss = float(chance_loss if training_chance_loss is None else training_chance_loss)
        check_range("tolerance", tolerance, low=0.0, high=1.0, high_open=True)
        check_range("jump", jump, low=1.0, low_open=True)
        check_range("max_actions", max_actions, low=0, integer=True)
        self.chance_loss, self.tolerance, self.jump = float(chance_loss), float(tolerance), float(jump)
        check_range("rate_factor", rate_factor, low=0.0, high=1.0, low_open=True, high_open=True)
        self.max_actions, self.rate_factor = int(max_actions), float(rate_factor)

    def start(self, initial_loss: float = math.inf) -> RunHealth:
        """The state before the first epoch: `initial_loss` is the first batch's training loss."""
        lowest = initial_loss if math.isfinite(initial_loss) else math.inf
        return RunHealth(lowest_loss=lowest, lowest_monitored=lowest)

    def judge(self, state: RunHealth, loss: float, monitored: float) -> Verdict:
        """The verdict on an epoch with training loss `loss` and monitored loss `monitored`."""
        trigger, reason = self._signature(state, loss, monitored)
        if trigger is not None and state.actions >= self.max_actions:
            trigger, reason = None, f"{reason}; no action left (max_actions={self.max_actions})"
        at_chance = math.isfinite(monitored) and monitored >= self._chance_floor()
        healthy = trigger != DIVERGED  # a diverged epoch's losses are not a level to return to
        following = RunHealth(min(state.lowest_loss, loss) if healthy else state.lowest_loss,
                              monitored if at_chance else None, state.actions + (trigger is not None),
                              min(state.lowest_monitored, monitored) if healthy else state.lowest_monitored)
        return Verdict(trigger, reason, following)

    def restarted(self, state: RunHealth, restored_loss: float) -> RunHealth:
        """The state after a rollback to a point whose training loss was `restored_loss`; the
        lowest monitored loss stays what the run reached."""
        lowest = restored_loss if math.isfinite(restored_loss) else state.lowest_loss
        return RunHealth(lowest_loss=lowest, previous=None, actions=state.actions,
                         lowest_monitored=state.lowest_monitored)

    def _signature(self, state, loss, monitored):
        if not (math.isfinite(loss) and math.isfinite(monitored)):
            return DIVERGED, f"a loss is not finite (loss {loss}, monitored {monitored})"
        for kind, value, lowest in (("training", loss, state.lowest_loss),
                                    ("monitored", monitored, state.lowest_monitored)):
            if value >= self.jump * lowest:
                return DIVERGED, (f"the {kind} loss {value:.4g} is {value / lowest:.3g}x the lowest {kind} loss "
                                  f"seen ({lowest:.4g}); diverged at >= {self.jump:g}x")
        stayed = state.previous is not None and monitored > state.previous * (1.0 - self.tolerance)
        learning = loss < self.training_chance_loss * (1.0 - self.tolerance)
        if monitored >= self._chance_floor() and stayed and learning:
            return None, (f"the monitored loss {monitored:.4g} stayed at the constant predictor's "
                          f"{self.chance_loss:.4g}, but the training loss {loss:.4g} is below its "
                          f"{self.training_chance_loss:.4g} on the training rows: it learns them, it is not dead")
        if monitored >= self._chance_floor() and stayed:
            return AT_CHANCE, (f"the monitored loss {monitored:.4g} stayed at or above the constant "
                               f"predictor's {self.chance_loss:.4g} (previous epoch {state.previous:.4g})")
        return None, "healthy"

    def _chance_floor(self):
        return self.chance_loss * (1.0 - self.tolerance)

    def get_config(self) -> dict:
        return {"chance_loss": self.chance_loss, "tolerance": self.tolerance, "jump": self.jump,
                "max_actions": self.max_actions, "rate_factor": self.rate_factor,
                "training_chance_loss": self.training_chance_loss}
