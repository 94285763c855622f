"""Keeps BatchNormalization's moving-statistics horizon per logical step.

Inside an accumulating step every micro-batch updates the moving statistics
once, so k micro-batches would shorten the averaging horizon k times. Using
momentum alpha ** (1 / k) per micro-batch decays the old statistics by exactly
alpha per logical step, as a full-batch step would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import keras
from keras import ops

from kadapt.layer_walk import reachable_layers


def batch_norm_layers(layer: keras.layers.Layer) -> list[keras.layers.BatchNormalization]:
    """Returns every `BatchNormalization` layer reachable from `layer`."""
    return [found for found in reachable_layers(layer) if isinstance(found, keras.layers.BatchNormalization)]


@contextlib.contextmanager
def per_logical_step_momentum(layers: Sequence[keras.layers.BatchNormalization],
                              num_micro_batches: Any) -> Iterator[None]:
    """Sets each layer's momentum to `momentum ** (1 / num_micro_batches)`.

    Used while tracing the accumulating step. `num_micro_batches` is a Python
    int where it is static (JAX: the shapes fix it), and the momentum a Python
    float; or a tensor (TensorFlow's dynamic count), and the traced graph
    computes the momentum. The Python values are restored on exit, so the
    layers' configs never change.
    """
    original = [layer.momentum for layer in layers]
    try:
        for layer, momentum in zip(layers, original):
            layer.momentum = _per_micro_batch(momentum, num_micro_batches)
        yield
    finally:
        for layer, momentum in zip(layers, original):
            layer.momentum = momentum


def _per_micro_batch(momentum, num_micro_batches):
    if isinstance(num_micro_batches, int):
        return momentum ** (1.0 / num_micro_batches)
    exponent = 1.0 / ops.cast(num_micro_batches, "float32")
    return ops.power(ops.convert_to_tensor(momentum, "float32"), exponent)
