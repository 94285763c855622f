"""Host copies of many variables at once: one dispatch instead of one per variable.

The `MetaAdjuster` reads every weight at each observation (the update
features) and every weight and optimizer slot at each rollback point. Read one
by one, each read is an eager TensorFlow op of its own (~0.1-0.3 ms on a CPU,
about 16 of them for a small MLP with Adam): at an observation every 10 steps
that was most of the adjuster's overhead. On TensorFlow one `tf.function`
per variable list returns all the values in one call; on JAX the values are
arrays already, fetched with one `jax.device_get`. A function call has a
fixed cost of its own: measured on a 2-core CPU (TensorFlow 2.21, idle), 64x64
variables read one by one took 0.43 / 0.81 / 1.27 / 4.32 ms for 8 / 16 / 32 /
64 of them, in one call 0.46 / 0.48 / 0.68 / 0.99 ms; so short lists are read
one by one.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import keras
import numpy as np

from kadapt._compat import learning_rate_as_set
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum

_CACHED_READERS = 8  # variable lists whose reader is kept (a fit has one or two)
_BATCHED_FROM = 12  # variables; below, reading them one by one costs less than a function call
_readers: collections.OrderedDict = collections.OrderedDict()


def read_to_host(variables: Sequence[keras.Variable]) -> list[np.ndarray]:
    """NumPy copies of `variables`' current values, in order.

    Example:

    ```python
    weights = read_to_host(model.trainable_variables)
    ```
    """
    variables = list(variables)
    if not variables:
        return []
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return [np.array(value) for value in jax.device_get([v.value for v in variables])]
    if backend != "tensorflow" or len(variables) < _BATCHED_FROM or distributed(variables):
        return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]
    # A copy: on the CPU `numpy()` may share the tensor's buffer with TensorFlow.
    return [np.array(value) for value in _reader(variables)()]


@dataclasses.dataclass(frozen=True)
class ModelReading:
    """Host copies of a model's variables and its optimizer's, with the rates, read at one moment.

    Args:
        variables: List of arrays, one per `model.variables`.
        optimizer: List of arrays, one per `model.optimizer.variables`.
        scheduled_rate: Float. `optimizer.learning_rate` now: the schedule's
            value at the step, or the float rate.
        learning_rate: Float. The rate the next step applies: `scheduled_rate`
            times the live multiplier (`applied_learning_rate`).
        momentum: Float. Momentum or `beta_1`; `0.0` when absent (`current_momentum`).
    """

    variables: list
    optimizer: list
    scheduled_rate: float
    learning_rate: float
    momentum: float


def read_model(model: keras.Model, compiled: bool = True) -> ModelReading:
    """`model`'s variables, its optimizer's and its rates, read to the host in one call.

    Args:
        model: A compiled `keras.Model` whose optimizer is built.
        compiled: Bool. On TensorFlow, read in one compiled call; `False`
            reads as `read_to_host` and the rate functions do. A compiled call
            runs its ops on TensorFlow's inter-op threads, which at the start
            of `fit` the input pipeline fills: measured on 2 shared cores, the
            call took 10-20 ms there against ~2 ms for the eager reads, and
            ~0.5 ms against ~1.5 ms once training runs. Defaults to `True`.

    Example:

    ```python
    reading = read_model(model)
    reading.learning_rate  # what applied_learning_rate(model.optimizer) returns
    ```
    """
    optimizer = model.optimizer
    variables = [*model.variables, *optimizer.variables]
    if not compiled or keras.backend.backend() != "tensorflow" or distributed(variables):
        values, rates = read_to_host(variables), read_rates(optimizer)
    else:
        values, rates = _model_reader(model, variables)()
    count = len(model.variables)
    return ModelReading(values[:count], values[count:], *rates)


def read_rates(optimizer: keras.optimizers.Optimizer) -> tuple[float, float, float]:
    """`(scheduled rate, applied rate, momentum)` of `optimizer` now, read one by one."""
    scheduled = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    return scheduled, applied_learning_rate(optimizer), current_momentum(optimizer)


def _model_reader(model, variables):
    """A function returning (host copies of `variables`, (scheduled rate, applied rate, momentum))
    from one `tf.function` call. A multiplier or momentum held as a float (a stock Keras
    optimizer's `momentum`) is read on the host at each call, as `current_momentum` reads it."""
    optimizer = model.optimizer
    # The schedule is traced into the function: a new one set on the optimizer needs a new reader.
    key = ("model", id(optimizer), id(learning_rate_as_set(optimizer)), *(id(v) for v in variables))
    entry = _readers.get(key)
    if entry is None:
        import tensorflow as tf

        graph_rates, host_rates = rate_reader(optimizer)

        def read():
            return [tf.identity(v.value) for v in variables], graph_rates()

        # The concrete function: calling it skips the tf.function's argument binding (~0.1 ms a call).
        function = tf.function(read, autograph=False).get_concrete_function()

        def reading():
            values, rates = function()
            # A copy: on the CPU `numpy()` may share the tensor's buffer with TensorFlow.
            return [np.array(v) for v in values], host_rates(rates.numpy())

        entry = (reading, variables)
        _cache(key, entry)
    _readers.move_to_end(key)
    return entry[0]


def rate_reader(optimizer: keras.optimizers.Optimizer) -> tuple:
    """`(graph_rates, host_rates)` for `optimizer` on TensorFlow.

    `graph_rates()`, called inside a `tf.function`, gives the scheduled rate
    and the live multiplier and momentum held in variables as one float64
    vector; `host_rates(vector)` turns its value into `(scheduled rate,
    applied rate, momentum)`, reading a multiplier or momentum held as a float
    (a stock Keras optimizer's `momentum`) on the host, as `current_momentum`
    reads it. The schedule is traced in: a new one set on the optimizer needs
    a new reader.
    """
    import tensorflow as tf

    multiplier = getattr(optimizer, "learning_rate_multiplier", None)
    momentum = _momentum(optimizer)
    in_graph = [isinstance(value, keras.Variable) for value in (multiplier, momentum)]

    def graph_rates():
        rates = [optimizer.learning_rate] + [v.value for v, graph in zip((multiplier, momentum), in_graph) if graph]
        return tf.stack([tf.cast(r, "float64") for r in rates])

    def host_rates(vector):
        read = iter(float(r) for r in vector)
        scheduled = next(read)
        scale, momentum_now = [next(read) if graph else _host_float(value, default)
                               for value, graph, default in zip((multiplier, momentum), in_graph, (1.0, 0.0))]
        return scheduled, scheduled * scale, momentum_now

    return graph_rates, host_rates


def _momentum(optimizer):
    """What `current_momentum` reads: `momentum`, else `beta_1`, else `None`."""
    for name in ("momentum", "beta_1"):
        value = getattr(optimizer, name, None)
        if value is not None:
            return value
    return None


def _host_float(value, default):
    return default if value is None else float(keras.ops.convert_to_numpy(value))


def _cache(key, entry):
    _readers[key] = entry
    if len(_readers) > _CACHED_READERS:
        _readers.popitem(last=False)


def _reader(variables):
    key = tuple(id(v) for v in variables)
    reader = _readers.get(key)
    if reader is None:
        import tensorflow as tf

        reader = (tf.function(lambda: [tf.identity(v.value) for v in variables], autograph=False), variables)
        _cache(key, reader)
    _readers.move_to_end(key)
    return reader[0]


def distributed(variables: Sequence[keras.Variable]) -> bool:
    """Whether `variables` are a `tf.distribute` strategy's (TensorFlow): read one by one, as their owner reads them."""
    import tensorflow as tf

    return any(isinstance(getattr(v, "value", None), tf.distribute.DistributedValues) for v in variables)
