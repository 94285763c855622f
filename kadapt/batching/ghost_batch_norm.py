"""Keeps BatchNormalization's moving-statistics horizon per logical step.

Inside an accumulating step every micro-batch updates the moving statistics
once, so k micro-batches would shorten the averaging horizon k times. Using
momentum alpha ** (1 / k) per micro-batch decays the old statistics by exactly
alpha per logical step, as a full-batch step would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import keras
import tensorflow as tf

from kadapt.batching.layer_walk import reachable_layers


def batch_norm_layers(layer: keras.layers.Layer) -> list[keras.layers.BatchNormalization]:
    """Returns every `BatchNormalization` layer reachable from `layer`."""
    return [found for found in reachable_layers(layer) if isinstance(found, keras.layers.BatchNormalization)]


@contextlib.contextmanager
def per_logical_step_momentum(layers: Sequence[keras.layers.BatchNormalization],
                              num_micro_batches: int | tf.Tensor) -> Iterator[None]:
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
