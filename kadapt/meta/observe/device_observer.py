"""`DeviceObserver`: the `MetaAdjuster`'s observation reduced where the weights are.

Read from the host, an observation copies every weight and optimizer slot out
(the update features and the rollback point share the read) and reduces the
update there with NumPy: its cost grows with the model, 25-35 ms an observation
for a 5.8M-weight MLP on a 2-core CPU, and on a GPU the copy crosses PCIe.
Here one compiled call reduces the update on the device and returns four sums
(`kadapt.meta.features.UpdateSums`) with the rates; the weights of the last
observation and its update stay in device variables, and a rollback point is a
second call that copies the state into one of two device buffers. Nothing of
the size of the model crosses to the host unless a rollback happens.

Measured on a 2-core CPU inside `fit`, every 10 steps (benchmarks/README.md#meta_adjust),
an observation with its rollback copy costs more on the device than read to
the host for small models (each TensorFlow op's fixed cost: 2.4 against 2.0 ms
at 0.27M weights) and less for large ones (3.0 against 3.6 ms at 0.67M, 5.6
against 8.1 ms at 1.86M, 15 against 25 ms at 5.8M): so on a CPU the adjuster
observes on the device from `DEVICE_FROM` trainable weights, and on an
accelerator always (the host read is a device-to-host copy of every weight and
slot there; not measured, no GPU lent). XLA-compiling these calls made them
slower on the CPU (86 against 14 ms at 5.8M, outside `fit`). On JAX a jitted
reduction and copies of the state's arrays do the same; on its CPU they cost
more than the host read at every size measured (67 against 23 ms at 5.8M, 0.86
against 0.31 ms at 55k, outside `fit`), so there only an accelerator observes
on the device. Observing inside the train step itself was measured and dropped
(docs/meta-model.md#what-the-callback-does).

It costs device memory: two copies of the model's variables and of the
optimizer's that a rollback restores, and two of the trainable weights.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

import keras
import numpy as np

from kadapt._compat import learning_rate_as_set
from kadapt.meta.model.features import UpdateSums
from kadapt.meta.observe.host_reads import distributed
from kadapt.meta.observe.host_reads import rate_reader
from kadapt.meta.observe.host_reads import read_rates
from kadapt.meta.observe.rollback import NOT_ROLLED_BACK
from kadapt.meta.observe.rollback import rolled_back

SLOTS = 2  # the rollback points `last_good` and `pending`
DEVICE_FROM = 500_000  # trainable weights from which a CPU observes on the device (in `fit`: 0.27M slower, 0.67M faster)
# Backends whose CPU observes on the device from DEVICE_FROM weights: JAX's jitted copies cost more
# than its host read at every size measured.
CPU_BACKENDS = ("tensorflow",)
MEMORY_SHARE = 0.25  # of what an accelerator had left at the run's peak so far, the most the copies may take
# model -> its observer: a later `fit` of the same model reuses the copies and the traced functions.
_observers = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class DeviceReading:
    """An observation reduced on the device.

    Args:
        sums: `kadapt.meta.features.UpdateSums`.
        scheduled_rate: Float. `optimizer.learning_rate` now.
        learning_rate: Float. The rate the next step applies (with the live multiplier).
        momentum: Float. Momentum or `beta_1`; `0.0` when absent.
    """

    sums: UpdateSums
    scheduled_rate: float
    learning_rate: float
    momentum: float


class DeviceObserver:
    """Reduces a model's observation on its device and keeps its rollback points there.

    Call `observe()` at each observation, then `snapshot(slot)` where the
    state becomes a rollback point (`free_slot` names a buffer no held point
    is in); `buffered(slot)` gives a point's host copies.

    Args:
        model: A compiled `keras.Model` on TensorFlow or JAX, its optimizer built.

    Example:

    ```python
    observer = DeviceObserver(model)
    reading = observer.observe()        # reading.sums: the update features' sums
    observer.snapshot(0)                # the state now, in buffer 0
    weights, slots = observer.buffered(0)
    ```
    """

    def __init__(self, model: keras.Model) -> None:
        optimizer = model.optimizer
        # No reference to the model: it keys the cache of observers (`_observers`), which must not keep it alive.
        self.optimizer, self._model_variables = optimizer, len(model.variables)
        # The schedule is traced into the TensorFlow call: another one set on the optimizer needs a new observer.
        self._schedule = id(learning_rate_as_set(optimizer))
        self.kept = _kept(model)
        self._kept_optimizer = [v.name not in NOT_ROLLED_BACK for v in optimizer.variables]
        copies = _TensorFlowCopies if keras.backend.backend() == "tensorflow" else _JaxCopies
        self._copies = copies(list(model.trainable_variables), self.kept, optimizer)
        self.had_previous = self.had_update = False

    @classmethod
    def attach(cls, model: keras.Model) -> DeviceObserver | None:
        """A `DeviceObserver` for `model` where it observes more cheaply than the host reads and its
        copies fit; `None` otherwise (the adjuster then reads on the host): variables a
        distribution spreads over devices (each holds its own copy), a CPU model under `DEVICE_FROM`
        trainable weights on TensorFlow (on JAX: any model on a CPU), or copies over
        `MEMORY_SHARE` of the memory an accelerator had left at its peak so far. The adjuster
        attaches at the run's first observation, after steps ran:
        their peak is what the copies must leave room for (a micro-batch sized to the memory
        budget fills most of it)."""
        if not model.trainable_variables or _distributed(model):
            return None
        observer = _observers.get(model)
        if observer is not None and observer.matches(model):
            observer.had_previous = observer.had_update = False  # a new run: no update before its first observation
            return observer
        device = _device(model)
        if device is None:
            weights = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
            pays = keras.backend.backend() in CPU_BACKENDS and weights >= DEVICE_FROM
        else:  # the copies it holds already count as used memory
            pays = _copies_bytes(model) <= MEMORY_SHARE * _free_bytes(device)
        if not pays:
            return None
        _observers[model] = observer = cls(model)
        return observer

    def matches(self, model: keras.Model) -> bool:
        """Whether this observer copies exactly `model`'s variables and its optimizer's."""
        kept = _kept(model)
        return (model.optimizer is self.optimizer and len(kept) == len(self.kept)
                and id(learning_rate_as_set(model.optimizer)) == self._schedule
                and all(a is b for a, b in zip(kept, self.kept)))

    def observe(self) -> DeviceReading:
        """The sums of the update since the last finite observation, and the rates, from one call."""
        values, rates = self._copies.observe()
        square, update_square, update_dot, finite = (float(v) for v in values)
        finite = bool(finite)
        sums = UpdateSums(square, finite, update_square if self.had_previous else None,
                          update_dot if self.had_update else None)
        if finite:  # the device kept these weights and this update
            self.had_update, self.had_previous = self.had_previous, True
        return DeviceReading(sums, *rates)

    def snapshot(self, slot: int) -> None:
        """Copies the model's state (its variables and the optimizer's a rollback restores) into `slot`."""
        self._copies.snapshot(slot)

    @staticmethod
    def free_slot(held: set[int]) -> int:
        """A buffer none of `held` (the slots of the points still held) is."""
        return min(set(range(SLOTS)) - set(held))

    def buffered(self, slot: int) -> tuple[list, list]:
        """Host copies of buffer `slot`: `(model variables, optimizer variables)`, the latter with
        `None` for those a rollback leaves alone (a `kadapt.meta.observe.rollback.RollbackPoint`'s lists)."""
        values = iter(self._copies.buffered(slot))
        weights = [next(values) for _ in range(self._model_variables)]
        return weights, [next(values) if kept else None for kept in self._kept_optimizer]

    def previous_on_host(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The weights of the last finite observation and its update, flattened (`None` where none)."""
        weights, update = self._copies.previous()
        return (weights if self.had_previous else None, update if self.had_update else None)

    def set_previous(self, weights: np.ndarray | None, update: np.ndarray | None) -> None:
        """Puts back what `previous_on_host` returned (a resumed run's)."""
        self._copies.set_previous(weights, update)
        self.had_previous, self.had_update = weights is not None, update is not None


class _TensorFlowCopies:
    """The device's part on TensorFlow: compiled calls over `tf.Variable` copies (not XLA: slower on a CPU)."""

    def __init__(self, trainable, kept, optimizer):
        import tensorflow as tf

        self.trainable, self.kept = trainable, kept
        size = sum(int(np.prod(v.shape)) for v in trainable)
        self._last_weights = tf.Variable(tf.zeros(size, "float32"), trainable=False)
        self._last_update = tf.Variable(tf.zeros(size, "float32"), trainable=False)
        self.buffers = [[tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in kept]
                        for _ in range(SLOTS)]
        graph_rates, self._host_rates = rate_reader(optimizer)
        self._observe = tf.function(lambda: self._sums(graph_rates), autograph=False).get_concrete_function()
        # Traced now, at the run's first observation, not at the first use of each buffer: the
        # observations after it are the ones the cost watch (`ObservationCost`) takes the median of.
        self._snapshots = [tf.function(lambda slot=slot: self._copy(slot), autograph=False).get_concrete_function()
                           for slot in range(SLOTS)]

    def observe(self):
        values = self._observe().numpy()
        return values[:4], self._host_rates(values[4:])

    def snapshot(self, slot):
        self._snapshots[slot]()

    def buffered(self, slot):
        return [np.array(buffer.numpy()) for buffer in self.buffers[slot]]

    def previous(self):
        return self._last_weights.numpy(), self._last_update.numpy()

    def set_previous(self, weights, update):
        for variable, value in ((self._last_weights, weights), (self._last_update, update)):
            if value is not None:
                variable.assign(np.asarray(value, "float32").ravel())

    def _sums(self, graph_rates):
        import tensorflow as tf

        weights = tf.concat([tf.reshape(tf.cast(v.value, "float32"), [-1]) for v in self.trainable], 0)
        update = weights - self._last_weights
        square = tf.reduce_sum(tf.square(weights))
        finite = tf.reduce_all(tf.math.is_finite(weights))
        sums = tf.stack([square, tf.reduce_sum(tf.square(update)), tf.reduce_sum(update * self._last_update),
                         tf.cast(finite, "float32")])
        with tf.control_dependencies([sums]):
            kept = tf.cond(finite, lambda: self._keep(weights, update), lambda: tf.constant(False))
        with tf.control_dependencies([kept]):
            return tf.concat([tf.cast(sums, "float64"), graph_rates()], 0)

    def _keep(self, weights, update):
        """After a finite observation: its weights, and its update (meaningful once a previous
        observation was kept; `DeviceObserver.observe` tracks which)."""
        import tensorflow as tf

        self._last_update.assign(update)
        self._last_weights.assign(weights)
        return tf.constant(True)

    def _copy(self, slot):
        for buffer, variable in zip(self.buffers[slot], self.kept):
            buffer.assign(variable.value)


class _JaxCopies:
    """The device's part on JAX: one jitted reduction, and arrays that are copies of the state.

    Keras' JAX trainer donates its state to each step, so a snapshot holds copies of the
    variables' arrays, made (and waited for) before the next step runs.
    """

    def __init__(self, trainable, kept, optimizer):
        import jax
        import jax.numpy as jnp

        self.trainable, self.kept, self.optimizer = trainable, kept, optimizer
        size = sum(int(np.prod(v.shape)) for v in trainable)
        self._last_weights, self._last_update = jnp.zeros(size, "float32"), jnp.zeros(size, "float32")
        self.buffers = [None] * SLOTS
        self._sums = jax.jit(_jax_sums)

    def observe(self):
        sums, self._last_weights, self._last_update = self._sums(
            [v.value for v in self.trainable], self._last_weights, self._last_update)
        return np.asarray(sums, "float64"), read_rates(self.optimizer)

    def snapshot(self, slot):
        import jax
        import jax.numpy as jnp

        self.buffers[slot] = jax.block_until_ready([jnp.array(v.value, copy=True) for v in self.kept])

    def buffered(self, slot):
        import jax

        return [np.array(value) for value in jax.device_get(self.buffers[slot])]

    def previous(self):
        return np.array(self._last_weights), np.array(self._last_update)

    def set_previous(self, weights, update):
        import jax.numpy as jnp

        if weights is not None:
            self._last_weights = jnp.asarray(np.asarray(weights, "float32").ravel())
        if update is not None:
            self._last_update = jnp.asarray(np.asarray(update, "float32").ravel())


def _jax_sums(trainable, previous, previous_update):
    """`(sums, previous, previous update)`: the four sums, and the weights and update kept where
    the weights are finite (else the last finite ones)."""
    import jax.numpy as jnp

    weights = jnp.concatenate([jnp.ravel(w).astype("float32") for w in trainable])
    update = weights - previous
    finite = jnp.all(jnp.isfinite(weights))
    sums = jnp.stack([jnp.sum(weights * weights), jnp.sum(update * update), jnp.sum(update * previous_update),
                      finite.astype("float32")])
    return sums, jnp.where(finite, weights, previous), jnp.where(finite, update, previous_update)


def _distributed(model):
    """A model whose variables a distribution spreads over several devices (a `tf.distribute`
    strategy, a `keras.distribution` on JAX), or another backend: the host reads it."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return distributed(model.variables)
    if backend == "jax":
        return any(len(getattr(v.value, "devices", lambda: ())()) > 1 for v in model.trainable_variables)
    return True


def _device(model):
    """The accelerator the trainable weights live on (`"GPU:0"`), or `None` on a CPU."""
    value = model.trainable_variables[0].value
    if keras.backend.backend() == "jax":
        (device,) = value.devices()
        return None if device.platform == "cpu" else device
    import tensorflow as tf

    name = tf.DeviceSpec.from_string(value.device)
    return None if name.device_type in (None, "CPU") else f"{name.device_type}:{name.device_index or 0}"


def _kept(model):
    """What a rollback point holds: the model's variables and the optimizer's it restores."""
    return [*model.variables, *rolled_back(model.optimizer)]


def _copies_bytes(model):
    weights = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return SLOTS * sum(_bytes(v) for v in _kept(model)) + 2 * 4 * weights


def _bytes(variable):
    return int(np.prod(variable.shape)) * np.dtype(keras.backend.standardize_dtype(variable.dtype)).itemsize


def _free_bytes(device):
    """The memory `device` had left at its peak: its limit less the most the backend held since
    the statistics were last reset; `inf` where unknown."""
    if keras.backend.backend() == "jax":
        stats = device.memory_stats() or {}
        limit, used = stats.get("bytes_limit"), stats.get("peak_bytes_in_use", stats.get("bytes_in_use"))
        return math.inf if not limit or used is None else max(int(limit) - int(used), 0)
    import tensorflow as tf

    from kadapt._compat import tensorflow_device_memory_limits

    limit = next((bytes_ for name, bytes_ in tensorflow_device_memory_limits().items()
                  if name.endswith(f"device:{device}")), None)
    if limit is None:
        return math.inf
    try:
        used = tf.config.experimental.get_memory_info(device)["peak"]
    except (ValueError, RuntimeError):
        return math.inf
    return max(limit - used, 0)
