"""Every form of out-of-memory TensorFlow raises: recognized, recovered from, and nothing else."""

import functools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from helpers import max_relative_difference
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.out_of_memory import is_out_of_memory
from kadapt.batching.tensorflow import probe as trial_probe

# (class, message) as TensorFlow 2.21 raises them (sources in kadapt/batching/out_of_memory.py).
OUT_OF_MEMORY = [
    (tf.errors.ResourceExhaustedError, "OOM when allocating tensor with shape[8,4096,4096] and type float on "
                                       "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"),
    (tf.errors.ResourceExhaustedError, "Out of memory while trying to allocate 68852648264 bytes."),
    (tf.errors.InternalError, "Failed copying input tensor from /job:localhost/replica:0/task:0/device:CPU:0 to "
                              "/job:localhost/replica:0/task:0/device:GPU:0 in order to run _EagerConst: "
                              "Dst tensor is not initialized."),
    (tf.errors.UnknownError, "Failed to get convolution algorithm. This is probably because cuDNN failed to "
                             "initialize, so try looking to see if a warning log message was printed above."),
    (tf.errors.UnknownError, "Failed to get convolution execution plan. This is probably because cuDNN failed "
                             "to initialize, so try looking to see if a warning log message was printed above."),
    (tf.errors.InternalError, "Attempting to perform BLAS operation using StreamExecutor without BLAS support"),
    (tf.errors.NotFoundError, "No algorithm worked!  Profiling failure on CUDNN engine eng1{}: "
                              "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 80.01MiB."),
    (tf.errors.InternalError, "Failed to load in-memory CUBIN: CUDA_ERROR_OUT_OF_MEMORY: out of memory"),
    (tf.errors.InternalError, "All algorithms tried for custom-call(__cudnn$convForward) failed. "
                              "Profiling failure on cuDNN engine eng2{k2=4,k3=0}: CUDNN_STATUS_ALLOC_FAILED"),
    (tf.errors.InternalError, "cuBLAS call failed: CUBLAS_STATUS_ALLOC_FAILED"),
]

# The same classes, for something else.
NOT_OUT_OF_MEMORY = [
    (tf.errors.InternalError, "Blas xGEMM launch failed"),
    (tf.errors.UnknownError, "JIT compilation failed."),
    (tf.errors.NotFoundError, "No algorithm worked!"),
    (tf.errors.FailedPreconditionError, "DNN library initialization failed. Look at the errors above for more "
                                        "details."),
    (tf.errors.InvalidArgumentError, "Incompatible shapes: [8,3] vs. [8,4]"),
]


def _form_id(form):
    return f"{form[0].__name__}:{form[1][:40]}"


@pytest.mark.parametrize("kind, message", OUT_OF_MEMORY, ids=[_form_id(f) for f in OUT_OF_MEMORY])
def test_each_form_is_out_of_memory(kind, message):
    assert is_out_of_memory(kind(None, None, message))


@pytest.mark.parametrize("kind, message", NOT_OUT_OF_MEMORY, ids=[_form_id(f) for f in NOT_OUT_OF_MEMORY])
def test_the_same_classes_for_something_else_are_not(kind, message):
    assert not is_out_of_memory(kind(None, None, message))


def test_python_memory_errors_are_not_the_devices():
    assert not is_out_of_memory(MemoryError("host"))


class RaiseAbove(keras.layers.Layer):
    """Identity layer that raises `error` (when the model runs eagerly) on more than `rows` rows."""

    def __init__(self, rows, error, **kwargs):
        super().__init__(**kwargs)
        self.rows, self.error = rows, error

    def call(self, inputs):
        if inputs.shape[0] is not None and inputs.shape[0] > self.rows:
            raise self.error
        return inputs


def _model(rows_that_fit=None, error=None):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((5,))]
    if error is not None:
        layers.append(RaiseAbove(rows_that_fit, error))
    model = keras.Sequential(layers + [keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _batch():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 5)).astype("float32"), rng.normal(size=(8, 3)).astype("float32")


def _accumulating(error, rows_that_fit=6):
    model = kadapt.accumulate(_model(rows_that_fit, error), 8)
    model.run_eagerly = True  # the step runs in Python, so it can raise the exact error
    return model


@functools.cache
def _plain_keras_weights():
    """The oracle: plain Keras, one step on the whole batch."""
    plain = _model()
    plain.fit(*_batch(), batch_size=8, verbose=0)
    return plain.get_weights()


@pytest.mark.parametrize("kind, message", OUT_OF_MEMORY, ids=[_form_id(f) for f in OUT_OF_MEMORY])
def test_recovery_retries_the_same_batch_smaller_after_each_form(kind, message):
    model = _accumulating(kind(None, None, message))
    model.fit(*_batch(), batch_size=8, verbose=0)
    assert model.oom_events == ((0, 8, 6),)
    assert int(model.optimizer.iterations) == 1
    assert max_relative_difference(_plain_keras_weights(), model.get_weights()) <= 1e-6


@pytest.mark.parametrize("kind, message", NOT_OUT_OF_MEMORY[:3], ids=[_form_id(f) for f in NOT_OUT_OF_MEMORY[:3]])
def test_recovery_lets_anything_else_through_unchanged(kind, message):
    model = _accumulating(kind(None, None, message))
    # (Keras adds the layer's arguments to the message of an error raised in a layer.)
    with pytest.raises(kind, match=re.escape(message)) as raised:
        model.fit(*_batch(), batch_size=8, verbose=0)
    assert type(raised.value) is kind
    assert model.oom_events == ()
    assert int(model.optimizer.iterations) == 0


def test_the_last_error_is_named_when_no_size_fits():
    error = tf.errors.UnknownError(None, None, OUT_OF_MEMORY[3][1])
    model = _accumulating(error, rows_that_fit=0)
    model.max_oom_retries = 1
    message = ("ran out of memory with micro_batch_size=6 after 1 retries (max_oom_retries=1); the last error: "
               "UnknownError: Failed to get convolution algorithm. This is probably because cuDNN failed to "
               "initialize, so try looking to see if a warning log message was printed above (when no smaller "
               "micro-batch escapes it, the cuDNN or cuBLAS library may not match the installed CUDA instead")
    with pytest.raises(kadapt.OutOfMemoryError, match=re.escape(message)):
        model.fit(*_batch(), batch_size=8, verbose=0)


def _trial(error):
    """A probe trial of 4 rows per micro-batch (of 8 rows) where 4 rows raise `error`."""
    model = _accumulating(error, rows_that_fit=3)
    sample = _batch() + (None,)
    with trial_probe.leaves_no_trace(model, sample):
        return trial_probe.run_trial(model, sample, 4, MemoryBudget(2**30, "CPU:0", "test"))


def test_a_probe_trial_that_runs_out_of_memory_does_not_fit():
    trial = _trial(tf.errors.InternalError(None, None, "Dst tensor is not initialized."))
    assert (trial.micro_batch_size, trial.fits, trial.peak_bytes) == (4, False, None)


def test_a_probe_trial_lets_anything_else_through():
    with pytest.raises(tf.errors.InternalError, match="Blas xGEMM launch failed"):
        _trial(tf.errors.InternalError(None, None, "Blas xGEMM launch failed"))
