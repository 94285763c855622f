"""`reserve_region`: the CPU budget held as one allocator region, as a GPU holds its memory.

TensorFlow's CPU allocator with oneDNN is a BFC allocator, the GPU's kind. It
grows on demand, region by region, each twice the last; a buffer never spans
two regions, and a free chunk less than twice a request is handed out whole
and counted whole in the peak. So where a step's buffers land, and its peak,
depend on how the regions happened to grow, from one fresh process to the
next, and lower in a process that had run larger steps before (the probe's
own). A GPU's
allocator takes its memory as one region when it starts. Taking
`REGION_FACTOR` x the budget as one region before the first measured step
(allocated uninitialized and freed at once: the pages are never touched, the
region stays with the allocator) put that step's buffers in one region in
every process (figures: benchmarks/README.md#peak_levels; why:
docs/probe.md).
"""

from __future__ import annotations

from kadapt.batching.tensorflow.allocator_mode import check_measurable
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.memory_budget import available_ram
from kadapt.environment import allocator_statistics_available

# Room for a trial up to twice the budget in the same region, so that the
# probe measures an overshoot as it is rather than across a new region.
REGION_FACTOR = 2
MiB = 2**20

_reserved_bytes = {}  # device -> the largest region reserved in this process


def reserve_region(budget: MemoryBudget) -> None:
    """Makes the allocator of `budget.device` hold one free region of
    `REGION_FACTOR` x `budget.bytes` (at most half the RAM available), once per
    process and size. Resets the device's peak. On a GPU, whose allocator
    holds its memory as one region from the start, it only refuses memory
    growth (`kadapt.batching.tensorflow.allocator_mode.check_measurable`: growing
    regions are what this function undoes on the CPU, and a GPU shared by
    growth has no room to hold the budget). A no-op where the CPU keeps no
    allocator statistics (TensorFlow's plain CPU allocator: `malloc`, no
    regions).

    Args:
        budget: `kadapt.batching.MemoryBudget`.

    Example:

    ```python
    # Before the first step of a process that trains a size probed elsewhere:
    kadapt.batching.reserve_region(kadapt.batching.device_budget("2GiB"))
    ```
    """
    device = budget.device
    if device.upper().startswith("GPU"):
        check_measurable(device)
        return
    if not device.upper().startswith("CPU") or not allocator_statistics_available(device):
        return
    # At most half the RAM available: one reservation of all of it was refused
    # (22.9 GiB on a 24 GiB host; half was held). The default CPU budget is half.
    size = min(REGION_FACTOR * budget.bytes, available_ram() // 2)
    if _reserved_bytes.get(device, 0) >= size:
        return
    import tensorflow as tf  # TensorFlow's CPU allocator (the JAX backend plans instead)

    try:
        with tf.device(device):
            # Rows of 1 MiB: Empty's shape is int32, and a region may pass 2 GiB.
            block = tf.raw_ops.Empty(shape=[-(-size // MiB), MiB], dtype=tf.uint8, init=False)
    except tf.errors.ResourceExhaustedError:
        raise ValueError(
            f"The CPU allocator could not hold {size / MiB:.0f} MiB ({REGION_FACTOR} x the "
            f"memory budget) as one region: pass a smaller `memory_budget`. Received: "
            f"memory_budget={budget.bytes} bytes ({budget.source})"
        ) from None
    del block
    tf.config.experimental.reset_memory_stats(device)
    _reserved_bytes[device] = size
