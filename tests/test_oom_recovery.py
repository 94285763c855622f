"""A real out-of-memory error mid-run: shrink, restore, retry the same batch."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from kadapt.batching.tensorflow import recovery
from helpers import OutOfMemoryAbove
from helpers import OutOfMemoryOnReplicaAbove
from helpers import max_relative_difference


def _model(rows_that_fit, batch_norm=False, seed=0, jit_compile="auto", allocates=False):
    """`allocates`: a real allocation fails, after TensorFlow's allocator has
    retried it for 10 s; else the same error is raised at once in the step by
    replica 0 (outside a strategy, the one replica)."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((5,))]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    if rows_that_fit is not None:
        layers.append(OutOfMemoryAbove(rows_that_fit) if allocates
                      else OutOfMemoryOnReplicaAbove(rows_that_fit, 0))
    layers += [keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse", metrics=["mae"],
                  jit_compile=jit_compile)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 5)).astype("float32"), rng.normal(size=(32, 3)).astype("float32")


def _fit(model, epochs=2):
    x, y = _data()
    return model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False)


def test_recovers_and_ends_with_the_full_batch_weights():
    plain = _model(None)
    plain_history = _fit(plain)
    # The one real allocation failure of this module: it costs 10 s.
    accumulated = kadapt.accumulate(_model(6, allocates=True), 8)
    history = _fit(accumulated)
    # 8 rows explode at step 0; 0.75 x 8 = 6 fits.
    assert accumulated.oom_events == ((0, 8, 6),)
    assert accumulated.micro_batch_size == 6
    assert int(accumulated.optimizer.iterations) == 4  # no step lost or doubled
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5
    np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["mae"], plain_history.history["mae"], rtol=1e-5)


@pytest.mark.parametrize("max_oom_retries", [0, 3])
def test_a_fit_with_a_short_last_batch_traces_the_step_once(max_oom_retries, tmp_path):
    # 32 rows in batches of 12: 12, 12, 8. Keras traces its step once for the dataset's
    # spec (rows unknown); the accumulating step, fed each batch as a tensor, did twice.
    accumulated = kadapt.accumulate(_model(None), 4, max_oom_retries=max_oom_retries)
    x, y = _data()
    accumulated.fit(x, y, batch_size=12, epochs=2, verbose=0, shuffle=False)
    assert accumulated.train_function.compiles == 1
    assert int(accumulated.optimizer.iterations) == 6
    # Another model built, saved and loaded in the process does not make the next fit trace again.
    other = _model(None)
    other.save(tmp_path / "other.keras")
    keras.saving.load_model(tmp_path / "other.keras")
    accumulated.fit(x, y, batch_size=12, epochs=1, verbose=0, shuffle=False)
    assert accumulated.train_function.compiles == 1
    assert int(accumulated.optimizer.iterations) == 9


def _count_network_builds(monkeypatch):
    """A list that grows by one each time a trace builds a micro-batch's forward and backward pass."""
    from kadapt.batching.tensorflow.train_step import TensorFlowAccumulation

    builds, micro_step = [], TensorFlowAccumulation._micro_step
    monkeypatch.setattr(TensorFlowAccumulation, "_micro_step",
                        lambda self, *args: builds.append(1) or micro_step(self, *args))
    return builds


def test_batches_of_one_micro_batch_build_the_network_once_in_the_trace(monkeypatch):
    # kadapt train's plan where the logical batch fits (1 micro-batch of 256): the loop over
    # further micro-batches and the short last one never run, and were two more builds.
    builds = _count_network_builds(monkeypatch)
    plain, accumulated = _model(None, batch_norm=True), kadapt.accumulate(_model(None, batch_norm=True), 12)
    x, y = _data()
    for model in (plain, accumulated):
        model.fit(x, y, batch_size=12, epochs=2, verbose=0, shuffle=False)  # 12, 12, 8 rows
    assert (accumulated.train_function.compiles, len(builds)) == (1, 1)
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5


def test_a_larger_batch_after_one_micro_batch_ones_traces_the_step_of_any_batch(monkeypatch):
    builds = _count_network_builds(monkeypatch)
    plain, accumulated = _model(None), kadapt.accumulate(_model(None), 8)
    x, y = _data()
    for model in (plain, accumulated):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)  # 2 micro-batches each
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)  # the step of any batch still
    assert (accumulated.train_function.compiles, len(builds)) == (2, 1 + 3)
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5


def test_under_xla_the_same_batch_is_retried_smaller_and_ends_exact(monkeypatch):
    # On a GPU Keras compiles the step with XLA. A real XLA allocation failure
    # cannot be had on the CPU (the process aborts), so the step of 8 rows
    # raises XLA's message before it runs; the retry traces and compiles a
    # step of 6 rows with XLA.
    traced = recovery.RecoveringTrainFunction._step_function

    class OutOfMemoryStep:
        def __init__(self, step):
            self.get_concrete_function = step.get_concrete_function  # traced, never run

        def __call__(self, data):
            raise tf.errors.ResourceExhaustedError(None, None, "Out of memory while trying to allocate 1.00GiB.")

    def step_function(self, data):
        step = traced(self, data)
        return step if self.model.micro_batch_size <= 6 else OutOfMemoryStep(step)

    monkeypatch.setattr(recovery.RecoveringTrainFunction, "_step_function", step_function)
    plain = _model(None, jit_compile=True)
    _fit(plain)
    accumulated = kadapt.accumulate(_model(None, jit_compile=True), 8)
    _fit(accumulated)
    assert accumulated.oom_events == ((0, 8, 6),)
    assert accumulated.jit_compile and int(accumulated.optimizer.iterations) == 4
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5


def test_failed_attempts_leave_no_batch_norm_update_behind():
    # BatchNorm sees micro-batches; the oracle is a run that used micro-batches
    # of 6 from the start. Any update left by the failed attempt (8 rows
    # passed BatchNorm before exploding) would show.
    recovered = kadapt.accumulate(_model(6, batch_norm=True), 8)
    _fit(recovered)
    reference = kadapt.accumulate(_model(6, batch_norm=True), 6)
    _fit(reference)
    assert recovered.oom_events
    for a, b in zip(reference.get_weights(), recovered.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_still_out_of_memory_at_one_row_raises_a_clear_error():
    model = kadapt.accumulate(_model(0), 2)
    with pytest.raises(kadapt.OutOfMemoryError, match=r"ran out of memory with micro_batch_size=1 after 1 retries"):
        _fit(model, epochs=1)
    assert int(model.optimizer.iterations) == 0
    assert model.oom_events == ((0, 2, 1),)


def test_retries_are_capped():
    model = kadapt.accumulate(_model(0), 64, max_oom_retries=1)
    with pytest.raises(kadapt.OutOfMemoryError, match=r"micro_batch_size=48 after 1 retries \(max_oom_retries=1\)"):
        model.fit(*_data(), batch_size=32, verbose=0)


def test_recovery_off_raises_the_original_error():
    model = kadapt.accumulate(_model(5), 8, max_oom_retries=0)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        _fit(model, epochs=1)


def test_bad_retry_count():
    with pytest.raises(ValueError, match=r"`max_oom_retries` must be an int >= 0. Received: max_oom_retries=-1"):
        kadapt.accumulate(_model(None), 4, max_oom_retries=-1)


def test_mirrored_replicas_all_retry_smaller_when_one_runs_out_of_memory(mirrored_strategy):
    # 16 rows per step, 8 per replica; only the first replica runs out of memory at 8.
    # BatchNorm sees micro-batches, so the weights show which size each replica used:
    # the oracle is a run at 6 from the start.
    with mirrored_strategy.scope():
        recovered = kadapt.accumulate(_model(6, batch_norm=True), 8)
        reference = kadapt.accumulate(_model(6, batch_norm=True), 6)
    history = _fit(recovered, epochs=1)
    reference_history = _fit(reference, epochs=1)
    assert recovered.oom_events == ((0, 8, 6),)
    assert int(recovered.optimizer.iterations.numpy()) == 2
    assert max_relative_difference(reference.get_weights(), recovered.get_weights()) <= 1e-6
    np.testing.assert_allclose(history.history["loss"], reference_history.history["loss"], rtol=1e-6)
