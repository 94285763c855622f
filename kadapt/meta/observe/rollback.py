"""Rollback points: the weights and optimizer state a diverged run returns to.

A point holds host copies of every model variable and of the optimizer's
variables except the channels the `MetaAdjuster` moves itself and the step
count: a rollback undoes what training did to the weights, while schedules,
the budget and the adjuster's own rate and momentum keep going forward.
`kadapt.batching.training_state` keeps device copies (and metric variables)
for undoing a probe's trial steps. The adjuster keeps its own: host copies
(`RollbackPoint`, from the read its observation is made of), or, where it
observes on the device (`kadapt.meta.observe.device_observer`), copies in a device
buffer (`BufferedPoint`), read to the host only to restore or save them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras
import numpy as np

from kadapt.meta.observe.host_reads import ModelReading
from kadapt.meta.observe.host_reads import read_model

# The live channels and the step count: not part of what a rollback undoes.
NOT_ROLLED_BACK = frozenset({"iteration", "learning_rate", "learning_rate_multiplier", "momentum", "beta_1"})


@dataclasses.dataclass(frozen=True)
class RollbackPoint:
    """Host copies of a model's state, with the watched value measured there.

    Args:
        weights: List of arrays, one per `model.variables`.
        optimizer: List, one per `model.optimizer.variables`: an array, or
            `None` for a variable a rollback leaves alone.
        value: Float. The monitored loss at this state (`inf` until known).
    """

    weights: list
    optimizer: list
    value: float = math.inf


@dataclasses.dataclass(frozen=True)
class BufferedPoint:
    """A rollback point held on the device: buffer `slot` of a `kadapt.meta.observe.device_observer.DeviceObserver`.

    Args:
        observer: The `DeviceObserver` whose buffer holds the state.
        slot: Int. The buffer.
        value: Float. The monitored loss at this state (`inf` until known).
    """

    observer: Any
    slot: int
    value: float = math.inf

    def on_host(self) -> RollbackPoint:
        """The same point as host copies."""
        return RollbackPoint(*self.observer.buffered(self.slot), self.value)


def rolled_back(optimizer: keras.optimizers.Optimizer) -> list:
    """The optimizer's variables a rollback restores: all but `NOT_ROLLED_BACK`."""
    return [v for v in optimizer.variables if v.name not in NOT_ROLLED_BACK]


def take(model: keras.Model, value: float = math.inf, reading: ModelReading | None = None) -> RollbackPoint:
    """The rollback point of `model` as it is now; from `reading` (`read_model(model)` now,
    e.g. the one an observation was made from) where given, else from a new one.

    Example:

    ```python
    point = take(model, value=0.7)
    model.fit(x, y)  # diverges
    restore(model, point)
    ```
    """
    reading = read_model(model) if reading is None else reading
    optimizer = [None if v.name in NOT_ROLLED_BACK else value
                 for v, value in zip(model.optimizer.variables, reading.optimizer, strict=True)]
    return RollbackPoint(list(reading.variables), optimizer, float(value))


def restore(model: keras.Model, point: RollbackPoint | BufferedPoint, restart_momentum: bool = False) -> None:
    """Assigns `point` back to `model`; `restart_momentum` zeroes the per-weight optimizer slots
    but those the optimizer names in `slots_kept_on_restart`.

    After a repeated divergence a velocity built at the diverging rate would
    carry the restored weights straight back out, hence the restart.
    """
    if isinstance(point, BufferedPoint):
        point = point.on_host()
    for variable, value in zip(model.variables, point.weights, strict=True):
        variable.assign(value)
    # Slots that are the optimizer's iterates, not a velocity (Schedule-Free's z, Prodigy's
    # initial weights), are restored, never zeroed: zeros there would be weights, not a restart.
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    kept = tuple(f"_{name}" for name in getattr(optimizer, "slots_kept_on_restart", ()))
    for variable, value in zip(model.optimizer.variables, point.optimizer, strict=True):
        if value is not None:
            zeroed = restart_momentum and value.ndim and not variable.name.endswith(kept)
            variable.assign(np.zeros_like(value) if zeroed else value)
    if restart_momentum and hasattr(optimizer, "slots_restarted"):
        optimizer.slots_restarted()  # kadapt's Adam family: the bias correction starts over


def to_state(point: RollbackPoint | BufferedPoint | None) -> dict | None:
    """`point` as arrays and JSON values (`kadapt.meta.live.adjuster_state`); `None` stays `None`."""
    if point is None:
        return None
    if isinstance(point, BufferedPoint):
        point = point.on_host()
    kept = [value is not None for value in point.optimizer]
    return {"weights": list(point.weights), "optimizer": [value for value in point.optimizer if value is not None],
            "kept": kept, "value": float(point.value)}


def from_state(state: dict | None, model: keras.Model) -> RollbackPoint | None:
    """The point `to_state` saved; a `ValueError` if its shapes are not `model`'s."""
    if state is None:
        return None
    values = iter(state["optimizer"])
    optimizer = [next(values) if kept else None for kept in state["kept"]]
    _check_shapes(state["weights"], model.variables, "model")
    _check_shapes(state["optimizer"], rolled_back(model.optimizer), "optimizer")
    return RollbackPoint(list(state["weights"]), optimizer, float(state["value"]))


def _check_shapes(values, variables, owner):
    shapes = [tuple(np.shape(value)) for value in values]
    expected = [tuple(variable.shape) for variable in variables]
    if shapes != expected:
        raise ValueError(f"The MetaAdjuster state holds {owner} variables of shapes {shapes[:4]}..., this "
                         f"{owner} has {expected[:4]}...: it was saved by another model. Start the run afresh.")
