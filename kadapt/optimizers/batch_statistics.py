"""`recompute_batch_statistics`: BatchNorm moving statistics of the weights now in the model."""

from __future__ import annotations

import itertools
from typing import Any, Iterable

import keras

from kadapt.layer_walk import reachable_layers
from kadapt.validation import check_non_negative_int


def recompute_batch_statistics(model: keras.Model, batches: Iterable[Any], steps: int = 50) -> int:
    """Replaces BatchNorm moving statistics by their mean over training-mode passes.

    With a Schedule-Free optimizer the moving statistics gathered during
    `fit` are those of y, the gradient point, while the model after `fit`
    holds x. The reference (`schedulefree` README) runs ~50 training-mode
    forward passes at x before evaluating; Keras' BatchNorm momentum (0.99)
    would keep most of the old statistics over 50 passes, so here pass i
    (from 0) uses momentum i / (i + 1): the result is the plain mean of the
    passes' batch statistics (PreciseBN), whatever the old ones were. The
    weights are not changed, and the layers' momentum is restored.

    Call it after `fit` (the model then holds x), before `evaluate`,
    `predict` or `save`.

    Args:
        model: `keras.Model`, built.
        batches: Iterable of input batches, or of `(x, y, ...)` tuples whose
            first item is the input (a `tf.data.Dataset`, a list of arrays).
        steps: Non-negative int. At most this many batches are run. Defaults to `50`.

    Returns:
        The number of forward passes run: 0 for a model without BatchNorm.

    Example:

    ```python
    model.fit(x, y, batch_size=64, epochs=5)  # ScheduleFreeAdamW: the model holds x
    batches = [x[i:i + 64] for i in range(0, 64 * 50, 64)]
    kadapt.optimizers.recompute_batch_statistics(model, batches)
    model.evaluate(x_test, y_test)
    ```
    """
    steps = check_non_negative_int(steps, "steps")
    norms = [layer for layer in reachable_layers(model)
             if isinstance(layer, keras.layers.BatchNormalization)]
    if not norms:
        return 0
    momenta = [layer.momentum for layer in norms]
    passes = 0
    try:
        for batch in itertools.islice(batches, steps):
            for layer in norms:
                layer.momentum = passes / (passes + 1)
            model(batch[0] if isinstance(batch, tuple) else batch, training=True)
            passes += 1
    finally:
        for layer, momentum in zip(norms, momenta):
            layer.momentum = momentum
    return passes
