"""The adjustments the meta-model chooses between, and how they reach an optimizer.

An action either multiplies the learning rate (in both directions: Keras'
`ReduceLROnPlateau` can only lower it) or sets the momentum (`beta_1` for
Adam). Index 2 keeps everything as it is. Learning-rate changes go through the
optimizer's live `learning_rate_multiplier` when it has one (kadapt's `SGD` and
`Adam`; this also works under a schedule), else through a float
`learning_rate`. Momentum changes need a live-momentum kadapt optimizer.
"""

from __future__ import annotations

import keras
import numpy as np

ACTIONS = (
    {"learning_rate_multiplier": 0.1},
    {"learning_rate_multiplier": 0.3},
    {},
    {"learning_rate_multiplier": 3.0},
    {"learning_rate_multiplier": 10.0},
    {"momentum": 0.5},
    {"momentum": 0.95},
)
KEEP = 2
MAX_CHANGE = 1e4
MOMENTUM_ACTIONS = tuple(i for i, action in enumerate(ACTIONS) if "momentum" in action)


def describe(action: dict[str, float]) -> str:
    """A short text for logs, e.g. `"lr x0.3"` or `"momentum 0.95"` or `"keep"`."""
    parts = []
    if "learning_rate_multiplier" in action:
        parts.append(f"lr x{action['learning_rate_multiplier']:g}")
    if "momentum" in action:
        parts.append(f"momentum {action['momentum']:g}")
    return ", ".join(parts) or "keep"


def has_live_momentum(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether `optimizer.momentum` is a variable the compiled step reads."""
    return isinstance(getattr(optimizer, "momentum", None), keras.Variable)


def can_adjust_learning_rate(optimizer: keras.optimizers.Optimizer) -> bool:
    """A live multiplier, or a float learning rate that Keras lets us set."""
    if hasattr(optimizer, "learning_rate_multiplier"):
        return True
    return not isinstance(
        getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule
    )


def allowed_mask(optimizer: keras.optimizers.Optimizer) -> np.ndarray:
    """Boolean mask over `ACTIONS`: what this optimizer can take live."""
    mask = np.ones(len(ACTIONS), bool)
    if not has_live_momentum(optimizer):
        mask[list(MOMENTUM_ACTIONS)] = False
    if not can_adjust_learning_rate(optimizer):
        mask[[i for i, a in enumerate(ACTIONS) if "learning_rate_multiplier" in a]] = False
    return mask


def apply(optimizer: keras.optimizers.Optimizer, action: dict[str, float],
          initial_learning_rate: float | None = None) -> None:
    """Applies one action to a live optimizer.

    The learning rate stays within `MAX_CHANGE` times (either way) of
    `initial_learning_rate` (for a live multiplier: of a multiplier of 1), so
    repeated cuts cannot drive it to zero nor repeated raises to overflow.
    """
    if "learning_rate_multiplier" in action:
        factor = action["learning_rate_multiplier"]
        if hasattr(optimizer, "learning_rate_multiplier"):
            current = float(keras.ops.convert_to_numpy(optimizer.learning_rate_multiplier))
            optimizer.learning_rate_multiplier = _bounded(current * factor, 1.0)
        else:
            current = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
            reference = current if initial_learning_rate is None else initial_learning_rate
            optimizer.learning_rate = _bounded(current * factor, reference)
    if "momentum" in action:
        optimizer.momentum = action["momentum"]


def _bounded(value, reference):
    return min(max(value, reference / MAX_CHANGE), reference * MAX_CHANGE)
