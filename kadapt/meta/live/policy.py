"""`AdjustmentPolicy`: what the `MetaAdjuster` does at one observation, decided apart from doing it.

The policy sees only numbers: the feature window, the learning rate applied
now, the trigger's reason (`kadapt.meta.Trigger.update`), whether the schedule
is annealing and whether this is the run's last observation. It returns a
frozen `Adjustment` — roll back or not, which action of
`kadapt.meta.actions.ACTIONS`, whether the trigger's patience restarts — and
its next `PolicyState`. The callback executes that choice on the model; the
policy touches no variable, so it is tested on hand-made windows with a stub
predictor, as KerasTuner tests an oracle without a tuner.

The rules:

- divergence: roll back; only learning-rate cuts are allowed, the largest
  one if the last divergence was at most `patience` calm observations ago
  (and then the optimizer's per-weight slots restart too); raises stay below
  half the rate that diverged from then on (the ceiling);
- plateau, slow progress, oscillation or a scheduled consultation while the
  schedule anneals: left to the schedule, whose slowdown is on purpose;
- the last observation: nothing is adjusted (no later step would feel it),
  but a divergence is still rolled back;
- otherwise the predictor's best allowed action, kept unless its predicted
  gain over keeping reaches `min_gain`, or `min_cut_gain` for a learning-rate
  cut, or `follow_gain` for a raise where the last change of the rate was a
  raise and no divergence came since (`kadapt.meta.model.meta_model.choose_from`);
  a momentum action that would set the momentum the window's last row shows
  is not on the menu (it is keep under another name);
- the run's first change of the rate, where it is a cut the trigger asked
  for on a stall (`STALLS`: not a divergence, not a scheduled consultation)
  within the first `restart_within` of the budget, and the watched loss is
  still at least `restart_above` times the run's starting loss: the run
  starts again from its initial state at the cut rate (`Adjustment.restart`).
  A rate that high from the first step can leave a network that a cut no
  longer brings back (units dead, outputs saturated), and a run stalled near
  its starting loss has little to lose by starting again;
- such a first early cut where the run has learned more (the watched loss
  between `trial_above` and `restart_above` of its starting loss), or one a
  scheduled consultation chose: a restart to be judged
  (`Adjustment.restart_trial`): the runner trains a branch from the initial
  state at the cut rate and restarts only where it beats the run
  (`kadapt.meta.live.restart_trial`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.meta_model import FOLLOW_GAIN
from kadapt.meta.model.meta_model import MIN_CUT_GAIN
from kadapt.meta.model.meta_model import MIN_GAIN
from kadapt.meta.model.meta_model import choose_from
from kadapt.meta.model.meta_model import predicted_differences
from kadapt.meta.model.numpy_forward import numpy_forward
from kadapt.validation import check_range

_MOMENTUM = FEATURE_NAMES.index("momentum")  # the window's column of the momentum applied, unscaled
_BUDGET = FEATURE_NAMES.index("budget_used")
RESTART_WITHIN = 0.3  # the share of the budget within which a first cut may start the run again
RESTART_ABOVE = 0.75  # ... where the watched loss is still at least this share of the starting loss
TRIAL_ABOVE = 0.4  # ... and judged by a branch from the start down to this share, or on a scheduled consultation
LEFT_TO_SCHEDULE = ("plateau", "slow_progress", "oscillation", "scheduled")
STALLS = ("plateau", "slow_progress", "oscillation")  # the reasons a restart may follow
JUDGED = (*STALLS, "scheduled")  # the reasons a judged restart may follow
_LARGEST_CUT = np.array([a.get("learning_rate_multiplier") == min(
    b.get("learning_rate_multiplier", 1.0) for b in action_lib.ACTIONS) for a in action_lib.ACTIONS])


@dataclasses.dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between observations.

    Args:
        ceiling: Float. Raises may not take the learning rate above it (half
            the lowest rate that diverged). Defaults to `inf`.
        since_divergence: Int or `None`. Calm observations since the last
            divergence was decided on; `None` before any. Defaults to `None`.
        rate_changed: Bool. Whether the learning rate has been changed in
            this run. Defaults to `False`.
        raised: Bool. Whether the last change of the learning rate was a
            raise, with no divergence since. Defaults to `False`.
    """

    ceiling: float = math.inf
    since_divergence: int | None = None
    rate_changed: bool = False
    raised: bool = False


@dataclasses.dataclass(frozen=True)
class Adjustment:
    """The policy's choice at one observation.

    Args:
        reason: String or `None`. The trigger's reason.
        action: Int. Index into `ACTIONS` to apply (`KEEP`: nothing).
        gain: Float. The predicted gain of the best allowed action over keeping.
        considered: Int. That action (the same as `action` unless it abstained).
        rollback: Bool. Restore the last good state first.
        restart_momentum: Bool. With the rollback, zero the optimizer's slots.
        consulted: Bool. The predictor chose: a decision to log.
        restart_trigger: Bool. Tell the trigger an adjustment was made.
        restart: Bool. Before applying `action`, go back to the run's
            initial state, the optimizer's slots zeroed (the step count and
            the schedule go on).
        restart_trial: Bool. Restart as `restart` does only where a branch
            from the initial state at the new rate beats the run
            (`kadapt.meta.live.restart_trial`); else apply `action` here.
    """

    reason: str | None = None
    action: int = action_lib.KEEP
    gain: float = 0.0
    considered: int = action_lib.KEEP
    rollback: bool = False
    restart_momentum: bool = False
    consulted: bool = False
    restart_trigger: bool = False
    restart: bool = False
    restart_trial: bool = False

    @property
    def abstained(self) -> bool:
        """Whether an action was considered but its predicted gain fell short."""
        return self.action != self.considered

    @property
    def logged(self) -> bool:
        """Whether this observation goes to the decision log."""
        return self.consulted or self.rollback

    @property
    def text(self) -> str:
        """What was done, e.g. `"lr x0.3"`, `"keep (considered lr x3)"`, `"rollback (training ends)"`."""
        if not self.consulted:
            return "rollback (training ends)" if self.rollback else "keep"
        text = action_lib.describe(action_lib.ACTIONS[self.action])
        if self.abstained:
            text += f" (considered {action_lib.describe(action_lib.ACTIONS[self.considered])})"
        if self.restart:
            text += ", from the start"
        return text


def model_predictor(meta_model) -> Callable[[np.ndarray], np.ndarray]:
    """`window -> score differences to keep` of a loaded meta-model (one window at a time):
    its forward pass in NumPy where `numpy_forward` can compute it (under a millisecond, where
    an eager Keras call of the default GRU took ~0.1 s), else the Keras call. Reads the
    weights now."""
    forward = numpy_forward(meta_model)
    if forward is None:
        return lambda window: predicted_differences(meta_model, window[None])[0]

    def predict(window):
        predicted = forward(window[None])[0]
        return predicted - predicted[action_lib.KEEP]

    return predict


class AdjustmentPolicy:
    """Decides, from one observation's numbers, what the adjuster does.

    Args:
        predict: Callable. `window -> array of len(ACTIONS)`: each action's
            predicted score difference to keeping (lower is better), e.g.
            `model_predictor(meta_model)`.
        allowed: Bool array of len(ACTIONS). What the optimizer can take
            (`kadapt.meta.actions.allowed_mask`). Defaults to all.
        min_gain: Float >= 0. The predicted gain an action needs to be
            applied. Defaults to `MIN_GAIN`.
        patience: Int >= 0. A divergence within this many calm observations
            of the last is "repeated". Defaults to `3` (the trigger's).
        min_cut_gain: Float >= 0. The predicted gain a learning-rate cut
            needs (never more than `min_gain`). Defaults to `MIN_CUT_GAIN`.
        restart_within: Float in [0, 1]. The share of the budget within
            which the run's first rate change, a cut on a stall, starts the
            run again from its initial state where it has kept most of its
            starting loss (`restart_above`); `0` never. Defaults to
            `RESTART_WITHIN` (0.3).
        restart_above: Float > 0. The watched loss over the starting loss
            from which such a cut starts again. Defaults to `RESTART_ABOVE` (0.75).
        trial_above: Float > 0. The watched loss over the starting loss from
            which a first early cut below `restart_above` (or on a scheduled
            consultation) asks for a judged restart (`Adjustment.restart_trial`);
            at or above `restart_above`: never. Defaults to `TRIAL_ABOVE` (0.4).
        follow_gain: Float >= 0. The predicted gain a raise needs where the
            last change of the rate was a raise and no divergence came since
            (never more than `min_gain`). Defaults to `FOLLOW_GAIN` (0.005).

    Example:

    ```python
    policy = AdjustmentPolicy(lambda window: np.array([0.5, -0.3, 0, 1, 1, 1, 1]))
    adjustment, state = policy.decide(PolicyState(), window, "plateau", learning_rate=0.1)
    adjustment.text  # "lr x0.3"
    ```
    """

    def __init__(self, predict: Callable[[np.ndarray], np.ndarray], allowed: np.ndarray | None = None,
                 min_gain: float = MIN_GAIN, patience: int = 3, min_cut_gain: float = MIN_CUT_GAIN,
                 restart_within: float = RESTART_WITHIN, restart_above: float = RESTART_ABOVE,
                 follow_gain: float = FOLLOW_GAIN, trial_above: float = TRIAL_ABOVE) -> None:
        if not callable(predict):
            raise TypeError(f"Argument `predict` must be a callable `window -> score differences`, e.g. "
                            f"model_predictor(meta_model). Received: predict={predict!r}")
        self.allowed = _check_allowed(allowed)
        check_range("min_gain", min_gain, low=0.0)
        check_range("patience", patience, low=0, integer=True)
        check_range("min_cut_gain", min_cut_gain, low=0.0)
        check_range("restart_within", restart_within, low=0.0, high=1.0)
        check_range("restart_above", restart_above, low=0.0, low_open=True)
        check_range("follow_gain", follow_gain, low=0.0)
        check_range("trial_above", trial_above, low=0.0, low_open=True)
        self.predict, self.min_gain, self.patience = predict, float(min_gain), int(patience)
        self.min_cut_gain = min(float(min_cut_gain), self.min_gain)
        self.restart_within, self.restart_above = float(restart_within), float(restart_above)
        self.follow_gain = min(float(follow_gain), self.min_gain)
        self.trial_above = float(trial_above)

    def decide(self, state: PolicyState, window: np.ndarray, reason: str | None, learning_rate: float,
               annealing: bool = False, final: bool = False, suggestion: float | None = None,
               loss_ratio: float | None = None) -> tuple[Adjustment, PolicyState]:
        """The `Adjustment` at this observation and the state after it; `suggestion` is a
        range test's rate (the moves to it are allowed only with one), `loss_ratio` the
        watched loss over the run's starting loss (`None`: not known, no restart)."""
        if reason is None:
            calm = None if state.since_divergence is None else state.since_divergence + 1
            return Adjustment(), dataclasses.replace(state, since_divergence=calm)
        divergence = reason == "divergence"
        repeated = divergence and self.repeated_divergence(state)
        if reason in LEFT_TO_SCHEDULE and annealing:
            return Adjustment(reason, restart_trigger=True), state
        if final:
            return Adjustment(reason, rollback=divergence, restart_momentum=repeated), state
        factors = action_lib.rate_factors(learning_rate, suggestion)
        allowed, state = self._allowed(state, divergence, repeated, learning_rate, factors)
        allowed &= action_lib.changes_momentum(float(window[-1, _MOMENTUM]))
        raise_needs = self.follow_gain if state.raised else self.min_gain  # NaN factors are not allowed
        needed = np.where(factors < 1.0, self.min_cut_gain, np.where(factors > 1.0, raise_needs, self.min_gain))
        choice = choose_from(np.asarray(self.predict(window), "float64"), allowed, needed)
        factor = factors[choice.action]
        early_first_cut = (factor < 1.0 and not state.rate_changed and loss_ratio is not None
                           and 0.0 < float(window[-1, _BUDGET]) <= self.restart_within)
        restart = early_first_cut and reason in STALLS and loss_ratio >= self.restart_above
        trial = early_first_cut and not restart and reason in JUDGED and loss_ratio >= self.trial_above
        if factor != 1.0:
            state = dataclasses.replace(state, rate_changed=True, raised=bool(factor > 1.0))
        return Adjustment(reason, choice.action, choice.gain, choice.considered, rollback=divergence,
                          restart_momentum=repeated, consulted=True, restart_trigger=True, restart=restart,
                          restart_trial=trial), state

    def repeated_divergence(self, state: PolicyState) -> bool:
        """Whether a divergence now follows the last one within `patience` calm observations."""
        return state.since_divergence is not None and state.since_divergence <= self.patience

    def _allowed(self, state, divergence, repeated, learning_rate, factors):
        allowed = self.allowed & ~np.isnan(factors)
        if divergence:
            state = dataclasses.replace(state, ceiling=min(state.ceiling, learning_rate / 2), since_divergence=0,
                                        raised=False)
            return allowed & (_LARGEST_CUT if repeated else factors < 1.0), state
        too_high = (factors > 1) & (factors * learning_rate > state.ceiling)
        return allowed & ~too_high, state


def _check_allowed(allowed):
    if allowed is None:
        return np.ones(len(action_lib.ACTIONS), bool)
    mask = np.asarray(allowed)
    if mask.dtype != bool or mask.shape != (len(action_lib.ACTIONS),):
        raise ValueError(f"Argument `allowed` must be a bool array of shape ({len(action_lib.ACTIONS)},), one "
                         f"per action of kadapt.meta.actions.ACTIONS. Received: allowed={allowed!r}")
    return mask
