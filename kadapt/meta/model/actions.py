"""The adjustments the meta-model chooses between, and how they reach an optimizer.

An action multiplies the learning rate (in both directions: Keras'
`ReduceLROnPlateau` can only lower it), sets the momentum (`beta_1` for
Adam), or sets the rate to a multiple of a learning-rate range test's
suggestion (only where a test gave one: `allowed_mask(..., suggestion)`), so
"move to the rate that works" is one step however far away it is. Index 2
keeps everything as it is. Learning-rate changes go through the
optimizer's live `learning_rate_multiplier` when it has one (kadapt's `SGD` and
`Adam`; this also works under a schedule), else through a float
`learning_rate`. Momentum changes need a live-momentum kadapt optimizer.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from kadapt._compat import learning_rate_as_set
from kadapt.optimizers.live_rate import learning_rate_multiplier
from kadapt.optimizers.live_rate import set_learning_rate_multiplier
from kadapt.optimizers.live_variables import applied_learning_rate

ACTIONS = (
    {"learning_rate_multiplier": 0.1},
    {"learning_rate_multiplier": 0.3},
    {},
    {"learning_rate_multiplier": 3.0},
    {"learning_rate_multiplier": 10.0},
    {"momentum": 0.5},
    {"momentum": 0.95},
    {"learning_rate_to_suggestion": 1.0},
    {"learning_rate_to_suggestion": 3.0},
)
KEEP = 2
MAX_CHANGE = 1e4
MOMENTUM_ACTIONS = tuple(i for i, action in enumerate(ACTIONS) if "momentum" in action)
SUGGESTION_ACTIONS = tuple(i for i, action in enumerate(ACTIONS) if "learning_rate_to_suggestion" in action)
SAME_RATE = 3 ** 0.5  # a move to the suggestion smaller than halfway to x3 / x0.3 is no move
SAME_MOMENTUM = 1e-3  # a momentum action this close to the momentum applied now changes nothing
RATE_ACTIONS = tuple(i for i, action in enumerate(ACTIONS)
                     if "learning_rate_multiplier" in action or "learning_rate_to_suggestion" in action)


def describe(action: dict[str, float]) -> str:
    """A short text for logs, e.g. `"lr x0.3"` or `"momentum 0.95"` or `"keep"`."""
    parts = []
    if "learning_rate_multiplier" in action:
        parts.append(f"lr x{action['learning_rate_multiplier']:g}")
    if "learning_rate_to_suggestion" in action:
        share = action["learning_rate_to_suggestion"]
        parts.append("lr to the range test's suggestion" + ("" if share == 1 else f" x{share:g}"))
    if "momentum" in action:
        parts.append(f"momentum {action['momentum']:g}")
    return ", ".join(parts) or "keep"


def has_live_momentum(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether `optimizer.momentum` is a variable the compiled step reads."""
    return isinstance(getattr(optimizer, "momentum", None), keras.Variable)


def can_adjust_learning_rate(optimizer: keras.optimizers.Optimizer) -> bool:
    """A live multiplier, or a float learning rate that Keras lets us set."""
    if learning_rate_multiplier(optimizer) is not None:
        return True
    return not isinstance(learning_rate_as_set(optimizer), keras.optimizers.schedules.LearningRateSchedule)


def optimizer_mask(optimizer: keras.optimizers.Optimizer) -> np.ndarray:
    """Boolean mask over `ACTIONS`: what this optimizer can take live, a
    suggestion given (`AdjustmentPolicy` masks the moves to it when there is none)."""
    mask = np.ones(len(ACTIONS), bool)
    if not has_live_momentum(optimizer):
        mask[list(MOMENTUM_ACTIONS)] = False
    if not can_adjust_learning_rate(optimizer):
        mask[list(RATE_ACTIONS)] = False
    return mask


def allowed_mask(optimizer: keras.optimizers.Optimizer, suggestion: float | None = None) -> np.ndarray:
    """Boolean mask over `ACTIONS`: what this optimizer can take live; the moves
    to a range test's suggestion only with a usable `suggestion`."""
    mask = optimizer_mask(optimizer)
    if not usable_suggestion(suggestion):
        mask[list(SUGGESTION_ACTIONS)] = False
        return mask
    return mask & ~np.isnan(rate_factors(applied_learning_rate(optimizer), suggestion))


def usable_suggestion(suggestion: float | None) -> bool:
    """Whether a range test's suggestion is a positive finite rate."""
    return suggestion is not None and math.isfinite(float(suggestion)) and float(suggestion) > 0


def rate_factors(learning_rate: float, suggestion: float | None = None) -> np.ndarray:
    """The factor each action multiplies the applied `learning_rate` by now
    (1 for keep and momentum). NaN marks a move to a suggestion that is not on
    the menu: without a suggestion, or where it would change the rate by less
    than `SAME_RATE` either way (it would be "keep" under another name)."""
    factors = np.array([action.get("learning_rate_multiplier", 1.0) for action in ACTIONS])
    for index in SUGGESTION_ACTIONS:
        usable = usable_suggestion(suggestion) and learning_rate > 0
        factor = ACTIONS[index]["learning_rate_to_suggestion"] * float(suggestion) / learning_rate if usable else 1.0
        factors[index] = factor if max(factor, 1 / factor) >= SAME_RATE else math.nan
    return factors


def changes_momentum(momentum: float) -> np.ndarray:
    """Boolean mask over `ACTIONS`: `False` for a momentum action that would set the momentum
    applied now (`momentum`, as `current_momentum` reads it): keep under another name. On the
    evaluation tasks the meta-model rated "momentum 0.95" 0.2-0.4 above keeping at a momentum
    of 0.95 already, and a too-low rate was left there instead of raised."""
    mask = np.ones(len(ACTIONS), bool)
    for index in MOMENTUM_ACTIONS:
        mask[index] = not abs(ACTIONS[index]["momentum"] - float(momentum)) < SAME_MOMENTUM
    return mask


def apply(optimizer: keras.optimizers.Optimizer, action: dict[str, float],
          initial_learning_rate: float | None = None, suggestion: float | None = None) -> None:
    """Applies one action to a live optimizer.

    The learning rate stays within `MAX_CHANGE` times (either way) of
    `initial_learning_rate` (for a live multiplier: of a multiplier of 1), so
    repeated cuts cannot drive it to zero nor repeated raises to overflow. A
    move to the range test's suggestion needs `suggestion`; under a schedule
    it sets the multiplier so that the rate applied now is the target, and the
    schedule keeps its shape from there.
    """
    if "learning_rate_to_suggestion" in action:
        if not usable_suggestion(suggestion):
            raise ValueError(f"Action {describe(action)!r} needs a range test's suggestion, a positive rate. "
                             f"Received: suggestion={suggestion!r}. Allow it only with one (allowed_mask).")
        target = action["learning_rate_to_suggestion"] * float(suggestion)
        action = {**action, "learning_rate_multiplier": target / applied_learning_rate(optimizer)}
    if "learning_rate_multiplier" in action:
        factor = action["learning_rate_multiplier"]
        multiplier = learning_rate_multiplier(optimizer)
        if multiplier is not None:
            current = float(keras.ops.convert_to_numpy(multiplier))
            set_learning_rate_multiplier(optimizer, _bounded(current * factor, 1.0))
        else:
            current = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
            reference = current if initial_learning_rate is None else initial_learning_rate
            optimizer.learning_rate = _bounded(current * factor, reference)
    if "momentum" in action:
        optimizer.momentum = action["momentum"]


def _bounded(value, reference):
    return min(max(value, reference / MAX_CHANGE), reference * MAX_CHANGE)
