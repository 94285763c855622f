"""Snapshots of a model's training state, to undo trial or failed steps."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np


def state_variables(model: keras.Model, include_weights: bool = True,
                    include_slots: bool = True) -> list[keras.Variable]:
    """The variables a training step may change.

    Model variables (weights, BatchNorm statistics, RNG seed states), metric
    variables and optimizer variables. `include_weights=False` keeps only the
    model's non-trainable variables; `include_slots=False` keeps only scalar
    optimizer variables (iterations, loss scale), not the per-weight slots.
    """
    variables = list(model.variables if include_weights else model.non_trainable_variables)
    variables += list(model.metrics_variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        variables += [v for v in optimizer.variables if include_slots or len(v.shape) == 0]
    unique = {id(v): v for v in variables}
    return list(unique.values())


def snapshot(variables: list[keras.Variable]) -> list[tuple[keras.Variable, Any]]:
    """Copies of the variables' current values (device tensors, no host sync)."""
    return [(v, keras.ops.copy(v.value)) for v in variables]


def host_snapshot(variables: list[keras.Variable]) -> list[tuple[keras.Variable, Any]]:
    """Copies of the variables' current values in host memory (NumPy arrays).

    The probe's snapshot of all weights and optimizer slots: a device copy
    would sit in every trial's measured peak, and in no training step's. On
    the CPU `numpy()` may share the tensor's buffer, which TensorFlow's
    allocator still counts: hence a copy the allocator does not hold."""
    return [(v, np.array(v.numpy(), copy=True)) for v in variables]


def restore(saved: list[tuple[keras.Variable, Any]]) -> None:
    for variable, value in saved:
        variable.assign(value)
