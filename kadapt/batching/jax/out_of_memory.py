"""Whether a JAX exception is a device running out of memory.

JAX 0.10 raises `jax.errors.JaxRuntimeError` (a `RuntimeError`; older jaxlib
releases named it `jaxlib.xla_extension.XlaRuntimeError`) for a failed XLA
execution, and for a host callback that raised (its message carried along). Its message opens with the XLA status code: out of memory reads
`"RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes."` (XLA's
buffer assignment and the GPU's BFC allocator), or names the allocator's
failure (`"Resource exhausted"`, `"CUDA_ERROR_OUT_OF_MEMORY"`, cuDNN/cuBLAS
`"*_STATUS_ALLOC_FAILED"`). The class is matched by name: the module that
defines it moved between jaxlib releases.
"""

from __future__ import annotations

PHRASES = ("RESOURCE_EXHAUSTED", "Resource exhausted", "Out of memory", "out of memory",
           "CUDA_ERROR_OUT_OF_MEMORY", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
CLASS_NAMES = ("JaxRuntimeError", "XlaRuntimeError")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a JAX runtime error that says a device ran out of memory.

    Args:
        error: An exception.

    Returns:
        Bool.

    Example:

    ```python
    error = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes.")
    assert is_out_of_memory(error)
    ```
    """
    if not any(kind.__name__ in CLASS_NAMES for kind in type(error).__mro__):
        return False
    message = str(error)
    return any(phrase in message for phrase in PHRASES)
