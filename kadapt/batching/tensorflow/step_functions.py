"""Steps traced to run on every replica of a `tf.distribute` strategy.

The one-step function (`replica_step_function`) and the two halves of a
step that recovers from running out of memory on several replicas
(`two_step_functions`), each a `tf.function` with the model's compile
settings. `kadapt.batching.tensorflow.recovery` trains with them and
`kadapt.batching.tensorflow.multi_worker` evaluates with them.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf


def replica_step_function(model: keras.Model, step: Callable) -> Callable:
    """`step` (a model's `train_step` or `test_step`) run on every replica, traced
    unless the model runs eagerly; returns the first replica's outputs."""
    strategy = model.distribute_strategy

    def one_step(data):
        outputs = strategy.run(step, args=(data,))
        # Metric results are synchronized across replicas: any replica's
        # values are the global ones.
        return tf.nest.map_structure(
            lambda value: strategy.experimental_local_results(value)[0], outputs
        )

    return _traced(model, one_step)


def _traced(model, function):
    """`function` as a `tf.function` with the model's compile settings, or as it is when the model runs eagerly."""
    if model.run_eagerly:
        return function
    return tf.function(tf.autograph.experimental.do_not_convert(function), reduce_retracing=True,
                       jit_compile=model.jit_compile)


def rows_unknown(data):
    """`data`'s structure with each dense tensor of rank >= 1 replaced by a
    `tf.TensorSpec` of its shape with the first (row) dimension unknown; other
    leaves (`None`, sparse and ragged tensors, Python values) as they are."""

    def spec(value):
        if isinstance(value, tf.Tensor) and value.shape.rank:
            return tf.TensorSpec([None, *value.shape[1:]], value.dtype)
        return value

    return tf.nest.map_structure(spec, data)


def traces(function):
    """How often `function` was traced: 0 for none or one that runs eagerly."""
    count = getattr(function, "experimental_get_tracing_count", None)
    return 0 if count is None else count()


def two_step_functions(model: keras.Model) -> tuple[Callable, Callable]:
    """`(compute, finish)`: the model's `compute_step` on every replica, and
    its `finish_step` on those outputs (returning the first replica's
    metrics), each traced unless the model runs eagerly."""
    strategy = model.distribute_strategy

    def compute(data):
        return strategy.run(model.compute_step, args=(data,))

    def finish_replica(*outputs):
        # Copies made here carry this replica's device: the all-reduce finds no destination
        # for a function's inputs as they are ("destinations can not be empty").
        return model.finish_step(*tf.nest.map_structure(tf.identity, outputs))

    def finish(outputs):
        results = strategy.run(finish_replica, args=outputs)
        return tf.nest.map_structure(lambda value: strategy.experimental_local_results(value)[0], results)

    return _traced(model, compute), _traced(model, finish)
