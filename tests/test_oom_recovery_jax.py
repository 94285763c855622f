"""Out-of-memory recovery on JAX: shrink, retry the same batch from the same state."""

import jax
import keras
import numpy as np
import pytest

import kadapt
from helpers import max_relative_difference
from kadapt.batching.out_of_memory import is_out_of_memory

pytestmark = pytest.mark.backends("jax")

XLA_OUT_OF_MEMORY = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."


class OutOfMemoryAbove(keras.layers.Layer):
    """Identity layer whose training step raises JAX's out-of-memory error
    when it sees more than `rows` rows: while the step is traced (`when =
    "trace"`, as XLA's buffer assignment refuses a step too large for the
    device before anything runs), or while it runs (`"run"`: a host callback
    fails mid-step, after the step was handed its state, as an allocation
    failing at run time does)."""

    def __init__(self, rows, when="trace", **kwargs):
        super().__init__(**kwargs)
        self.rows, self.when = rows, when

    def call(self, inputs, training=None):
        if not training or inputs.shape[0] <= self.rows:  # not while Keras builds the model
            return inputs
        if self.when == "trace":
            raise jax.errors.JaxRuntimeError(XLA_OUT_OF_MEMORY)

        def fail():
            raise MemoryError(XLA_OUT_OF_MEMORY)

        return inputs + jax.pure_callback(fail, jax.ShapeDtypeStruct((), inputs.dtype))


def _model(rows_that_fit, batch_norm=False, when="trace"):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((5,))]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    if rows_that_fit is not None:
        layers.append(OutOfMemoryAbove(rows_that_fit, when))
    layers += [keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse", metrics=["mae"])
    return model


def _fit(model, epochs=2):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 5)).astype("float32"), rng.normal(size=(32, 3)).astype("float32")
    return model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False)


def test_jax_forms_of_running_out_of_memory():
    assert is_out_of_memory(jax.errors.JaxRuntimeError(XLA_OUT_OF_MEMORY))
    assert is_out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: Resource exhausted: no room for the workspace"))
    assert not is_out_of_memory(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes do not match"))
    assert not is_out_of_memory(RuntimeError(XLA_OUT_OF_MEMORY))  # not JAX's


@pytest.mark.parametrize("when", ["trace", "run"])
def test_recovers_and_ends_with_the_full_batch_weights(when):
    # "run": the failed step had the state; it was not donated, so the retry still has it.
    plain = _model(None)
    plain_history = _fit(plain)
    accumulated = kadapt.accumulate(_model(6, when=when), 8)
    history = _fit(accumulated)
    assert accumulated.oom_events == ((0, 8, 6),)  # 0.75 x 8 = 6 fits
    assert accumulated.micro_batch_size == 6
    assert int(keras.ops.convert_to_numpy(accumulated.optimizer.iterations)) == 4  # no step lost or doubled
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5
    np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["mae"], plain_history.history["mae"], rtol=1e-5)


def test_a_failed_attempt_leaves_no_batch_norm_update_behind():
    # 16 rows of 8 run as 6 + 6 + 4: the BatchNorm statistics of a plain run of the same
    # micro-batches from the start (no attempt at 8 left behind).
    accumulated = kadapt.accumulate(_model(6, batch_norm=True), 8)
    _fit(accumulated, epochs=1)
    reference = kadapt.accumulate(_model(None, batch_norm=True), 6)
    _fit(reference, epochs=1)
    assert accumulated.oom_events == ((0, 8, 6),)
    for got, want in zip(accumulated.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_retries_are_capped_with_a_clear_error():
    accumulated = kadapt.accumulate(_model(2), 8, max_oom_retries=1)
    with pytest.raises(kadapt.OutOfMemoryError, match=r"micro_batch_size=6 after 1 retries.*RESOURCE_EXHAUSTED"):
        _fit(accumulated, epochs=1)
    assert accumulated.oom_events == ((0, 8, 6),)


def test_recovery_off_raises_the_original_error():
    accumulated = kadapt.accumulate(_model(6), 8, max_oom_retries=0)
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
        _fit(accumulated, epochs=1)
    assert accumulated.oom_events == ()


def test_measure_noise_is_refused_on_jax():
    with pytest.raises(ValueError, match=r"TensorFlow backend only for now.*backend='jax'"):
        kadapt.accumulate(_model(None), 8, measure_noise=True)
