"""Keeps BatchNormalization's moving-statistics horizon per logical step.

Inside an accumulating step every micro-batch updates the moving statistics
once, so k micro-batches would shorten the averaging horizon k times. Using
momentum alpha ** (1 / k) per micro-batch decays the old statistics by exactly
alpha per logical step, as a full-batch step would.
"""

import contextlib

import keras
import tensorflow as tf


def batch_norm_layers(layer):
    """Returns every `BatchNormalization` layer reachable from `layer`."""
    found, seen, stack = [], set(), [layer]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, keras.layers.BatchNormalization):
            found.append(current)
        stack.extend(_children(current))
    return found


def _children(layer):
    if isinstance(layer, keras.Model):
        return list(layer.layers)
    children = []
    for value in vars(layer).values():
        if isinstance(value, keras.layers.Layer):
            children.append(value)
        elif isinstance(value, (list, tuple)):
            children.extend(v for v in value if isinstance(v, keras.layers.Layer))
    return children


@contextlib.contextmanager
def per_logical_step_momentum(layers, num_micro_batches):
    """Sets each layer's momentum to `momentum ** (1 / num_micro_batches)`.

    Used while tracing the accumulating step: the traced graph computes the
    momentum from the (dynamic) number of micro-batches. The Python values are
    restored on exit, so the layers' configs never change.
    """
    original = [layer.momentum for layer in layers]
    exponent = 1.0 / tf.cast(num_micro_batches, tf.float32)
    try:
        for layer, momentum in zip(layers, original):
            layer.momentum = tf.pow(tf.constant(momentum, tf.float32), exponent)
        yield
    finally:
        for layer, momentum in zip(layers, original):
            layer.momentum = momentum
