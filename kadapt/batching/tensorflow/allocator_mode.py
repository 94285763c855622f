"""`allocator_mode`: which allocator serves a device, and so what its peaks count.

- `"bfc"`: a GPU's BFC allocator holding its pool as one region (the
  default). Peaks count whole chunks.
- `"bfc-growth"`: the same with memory growth on (`TF_FORCE_GPU_ALLOW_GROWTH=true`
  or `tf.config.experimental.set_memory_growth`): regions grow on demand, the
  layout that makes a step's peak depend on how they happened to grow.
  The memory probe refuses it (`check_measurable`).
- `"cuda_malloc_async"`: `TF_GPU_ALLOCATOR=cuda_malloc_async`, CUDA's stream
  ordered allocator. Peaks count the bytes requested, not chunks; the
  pool's own rounding and fragmentation are not in them.
- `"cpu-bfc"` (`TF_CPU_ALLOCATOR_USE_BFC=true`) and `"cpu"` (TensorFlow's
  default CPU allocator) on the CPU.

A size measured under one mode says little about another, so the mode is
part of the probe cache's key. TensorFlow reads these variables once, when
it creates its devices; this reads them as they are now.
"""

from __future__ import annotations

import os

GROWTH_VARIABLE = "TF_FORCE_GPU_ALLOW_GROWTH"
GPU_ALLOCATOR_VARIABLE = "TF_GPU_ALLOCATOR"
CPU_BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
MODES = ("bfc", "bfc-growth", "cuda_malloc_async", "cpu", "cpu-bfc")
COUNTS = {
    "bfc": "whole allocator chunks",
    "bfc-growth": "whole allocator chunks, in regions grown on demand",
    "cuda_malloc_async": "requested bytes (CUDA's async allocator)",
    "cpu": "whole allocator chunks",
    "cpu-bfc": "whole allocator chunks",
}


def allocator_mode(device: str = "GPU:0", memory_growth=None) -> str:
    """The allocator mode of `device`, one of `MODES` (see the module docstring).

    Args:
        device: String, e.g. `"GPU:0"` or `"CPU:0"`. Defaults to `"GPU:0"`.
        memory_growth: Callable `device -> bool` or `None`: whether memory
            growth was set for the device in this process. Defaults to
            `tf.config.experimental.get_memory_growth` of its physical GPU
            (tests substitute it).

    Example:

    ```python
    from kadapt.batching.tensorflow.allocator_mode import allocator_mode
    allocator_mode("CPU:0")  # "cpu"
    ```
    """
    if not device.upper().startswith("GPU"):
        return "cpu-bfc" if os.environ.get(CPU_BFC_VARIABLE, "").strip().lower() in {"1", "true"} else "cpu"
    if os.environ.get(GPU_ALLOCATOR_VARIABLE) == "cuda_malloc_async":
        return "cuda_malloc_async"
    # TensorFlow takes exactly "true" or "false" from the variable over the setting.
    forced = os.environ.get(GROWTH_VARIABLE)
    growth = forced == "true" if forced in ("true", "false") else (memory_growth or _memory_growth)(device)
    return "bfc-growth" if growth else "bfc"


def _memory_growth(device):
    import tensorflow as tf

    physical = tf.config.list_physical_devices("GPU")
    index = int(device.split(":")[-1])
    return bool(physical) and tf.config.experimental.get_memory_growth(physical[min(index, len(physical) - 1)])


def check_measurable(device: str, mode: str | None = None) -> None:
    """Raises `ValueError` when a probed micro-batch on `device` would not
    hold in the next process: under memory growth (mode `"bfc-growth"`)."""
    mode = mode or allocator_mode(device)
    if mode != "bfc-growth":
        return
    raise ValueError(
        f"Argument `micro_batch_size` cannot be 'auto' (nor a size probed) with {growth_reason(device)}, "
        f"or pass an int micro_batch_size. Received: micro_batch_size='auto', allocator mode {mode!r}"
    )


def growth_reason(device: str) -> str:
    """Why memory growth defeats the probe, and what to do (the command line says it too)."""
    return (
        f"GPU memory growth on for {device}: its allocator grows region by region, so a step's peak "
        f"depends on how the regions happened to grow, and a size measured here may not fit the next "
        f"run. Turn memory growth off (unset {GROWTH_VARIABLE}, drop "
        f"tf.config.experimental.set_memory_growth) and set a logical device memory_limit to share the GPU"
    )
