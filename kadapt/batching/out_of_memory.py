"""Whether an exception is a device running out of memory, on either backend.

The forms are each backend's (`kadapt.batching.tensorflow.out_of_memory`,
`kadapt.batching.jax.out_of_memory`); an error is judged by the backend whose
class it is, so this module imports neither framework: an error of a
framework's class exists only once that framework is loaded.
"""

from __future__ import annotations

import re

_TERMINAL_STYLE = re.compile(r"\x1b\[[0-9;]*m")
# Lines of a message that say what ran out (both backends' phrases).
_TELLING = ("Dst tensor is not initialized", "Failed to get convolution", "without BLAS support",
            "RESOURCE_EXHAUSTED", "Resource exhausted", "OOM when allocating", "Out of memory",
            "CUDA_ERROR_OUT_OF_MEMORY", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
# cuDNN's and cuBLAS's start-up failures: memory outside TensorFlow's pool, or a library that does
# not match CUDA; the message cannot tell which.
LIBRARY_START_FAILURES = ("Failed to get convolution algorithm", "Failed to get convolution execution plan",
                          "without BLAS support")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says a device ran out of memory, in any form its
    backend raises it.

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
    module = type(error).__module__ or ""
    if module.startswith("tensorflow"):
        from kadapt.batching.tensorflow.out_of_memory import is_out_of_memory as judge
    elif module.startswith(("jax", "jaxlib")):
        from kadapt.batching.jax.out_of_memory import is_out_of_memory as judge
    else:
        return False
    return judge(error)


def explain(error: BaseException) -> str:
    """`"ClassName: the line of the message that says what ran out"`, for an
    error message that names its cause (a graph error's message opens with the
    failing op's traceback, an eager layer's with the layer's name); for a
    cuDNN or cuBLAS start-up failure, with what else it may mean."""
    message = _TERMINAL_STYLE.sub("", str(getattr(error, "message", error)))  # Keras' bold, eagerly
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    telling = [line for line in lines if any(phrase in line for phrase in _TELLING)]
    line = (telling or lines or [""])[0][:300].rstrip(".")
    text = f"{type(error).__name__}: {line}"
    if any(phrase in line for phrase in LIBRARY_START_FAILURES):
        text += (" (when no smaller micro-batch escapes it, the cuDNN or cuBLAS library may not match the "
                 "installed CUDA instead: TensorFlow's log above says which)")
    return text
