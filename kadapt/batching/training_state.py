"""Snapshots of a model's training state, to undo trial or failed steps."""

import tensorflow as tf


def state_variables(model, include_weights=True, include_slots=True):
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


def snapshot(variables):
    """Copies of the variables' current values (device tensors, no host sync)."""
    return [(v, tf.identity(v.value)) for v in variables]


def restore(saved):
    for variable, value in saved:
        variable.assign(value)
