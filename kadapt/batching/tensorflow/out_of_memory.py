"""Whether a TensorFlow exception is a device running out of memory, in any form TensorFlow raises it.

`ResourceExhaustedError` is the plain form, but a GPU that runs out of memory
also raises other classes (read in TensorFlow's and XLA's sources and issues):

| Class | Message contains | Where |
|---|---|---|
| `ResourceExhaustedError` | anything (`"OOM when allocating tensor ..."`; under XLA `"Out of memory while trying to allocate N bytes."`) | BFC allocator; XLA's buffer allocation |
| `InternalError` | `"Dst tensor is not initialized"` | the host-to-device copy of an input whose destination could not be allocated (`gpu_util.cc`, `pluggable_device_util.cc`; tensorflow#7025, #21775) |
| `UnknownError` | `"Failed to get convolution algorithm"`, `"Failed to get convolution execution plan"` | cuDNN could not start, most often for want of memory outside TensorFlow's pool (`conv_ops*.cc`; tensorflow#24828, #36025) |
| `InternalError` | `"Attempting to perform BLAS operation using StreamExecutor without BLAS support"` | cuBLAS could not start (logged before it: `CUBLAS_STATUS_ALLOC_FAILED`; tensorflow#7072, #35887) |
| any `OpError` | `"RESOURCE_EXHAUSTED"`, `"OOM when allocating"`, `"Out of memory while trying to allocate"`, `"CUDA_ERROR_OUT_OF_MEMORY"`, `"CUBLAS_STATUS_ALLOC_FAILED"`, `"CUDNN_STATUS_ALLOC_FAILED"` | an out-of-memory status wrapped in another: `NotFoundError` "No algorithm worked!" over cuDNN autotuning's `"Profiling failure on CUDNN engine ...: RESOURCE_EXHAUSTED: Out of memory while trying to allocate ..."` (`autotune_conv_impl.h`); XLA's `"Failed to load in-memory CUBIN: CUDA_ERROR_OUT_OF_MEMORY"` (tensorflow#60607) |

The cuDNN and cuBLAS start-up messages are ambiguous: the same words follow
a library that does not match the installed CUDA. They are counted as out
of memory because that is what they mean on a working installation, and
because the cost of being wrong is bounded: recovery shrinks at most
`max_oom_retries` times, then raises `kadapt.OutOfMemoryError` naming the
original error, whose message points at the log line that says which.
XLA's `FailedPreconditionError` "DNN library initialization failed" names
no memory and is not counted. Anything else propagates unchanged.
"""

from __future__ import annotations

import tensorflow as tf

# (class, phrase): an error of that class whose message contains the phrase.
MESSAGE_FORMS = (
    (tf.errors.InternalError, "Dst tensor is not initialized"),
    (tf.errors.UnknownError, "Failed to get convolution algorithm"),
    (tf.errors.UnknownError, "Failed to get convolution execution plan"),
    (tf.errors.InternalError, "Attempting to perform BLAS operation using StreamExecutor without BLAS support"),
    (tf.errors.OpError, "RESOURCE_EXHAUSTED"),
    (tf.errors.OpError, "OOM when allocating"),
    (tf.errors.OpError, "Out of memory while trying to allocate"),
    (tf.errors.OpError, "CUDA_ERROR_OUT_OF_MEMORY"),
    (tf.errors.OpError, "CUBLAS_STATUS_ALLOC_FAILED"),
    (tf.errors.OpError, "CUDNN_STATUS_ALLOC_FAILED"),
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says a device ran out of memory (see the table above).

    Args:
        error: An exception.

    Returns:
        Bool.

    Example:

    ```python
    error = tf.errors.InternalError(None, None, "Dst tensor is not initialized.")
    assert is_out_of_memory(error)
    ```
    """
    if isinstance(error, tf.errors.ResourceExhaustedError):
        return True
    if not isinstance(error, tf.errors.OpError):
        return False
    message = str(error.message)
    return any(isinstance(error, kind) and phrase in message for kind, phrase in MESSAGE_FORMS)
