"""How many bytes a training step may use on a device.

Order of precedence: the `memory_budget` argument, the `KADAPT_MEMORY_BUDGET`
environment variable, then the device itself — on a GPU the pool TensorFlow's
allocator has there (`kadapt.batching.gpu_memory`) less `gpu_margin`; on the
CPU `CPU_RAM_FRACTION` of the RAM available now.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re

from kadapt.batching.gpu_memory import gpu_capacity

# Taken off a GPU's pool. The pool already excludes the CUDA context and
# TensorFlow's own reserve (it is what remained free at start, less that
# reserve). What a measured peak does not show, inside the pool: the
# workspaces a step or the XLA compile of a new size takes after the measured
# step (cuDNN/cuBLAS(Lt) autotuning and workspaces, a few hundred MiB on
# large convolutions and GEMMs) -- a fixed part; and the free space the
# allocator's chunks leave between buffers, which grows with the pool
# (on the CPU, peaks of the same step moved by up to 15-20% across processes
# before the region was held; one region makes it far less) -- a fraction.
GPU_MARGIN_BYTES = 512 * 2**20
GPU_MARGIN_FRACTION = 0.05
CPU_RAM_FRACTION = 0.50  # of MemAvailable: leave the rest to the OS and data
ENVIRONMENT_VARIABLE = "KADAPT_MEMORY_BUDGET"

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """Bytes a training step may use on `device`, and where the figure came from."""

    bytes: int
    device: str
    source: str


def parse_memory_size(value: int | str, name: str = "memory_budget") -> int:
    """Returns `value` in bytes: an int, or a string like `"2GiB"` / `"512 MB"`."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise TypeError(
            f"Argument `{name}` must be a number of bytes or a string such as "
            f"'2GiB'. Received: {name}={value!r} (of type {type(value).__name__})"
        )
    if isinstance(value, str):
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else None
        if unit not in _UNITS:
            raise ValueError(
                f"Argument `{name}` could not be parsed as a size: use bytes or a "
                f"number with a unit (B, KB, MB, GB, KiB, MiB, GiB), e.g. '2GiB'. "
                f"Received: {name}={value!r}"
            )
        value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(
            f"Argument `{name}` must be a positive size, e.g. '2GiB'. Received: {name}={value!r}"
        )
    return int(value)


def default_device() -> str:
    """`"GPU:0"` when TensorFlow sees a GPU, else `"CPU:0"`."""
    import tensorflow as tf  # here: `parse_memory_size` serves the JAX backend too, without TensorFlow

    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def device_budget(memory_budget: int | str | None = None, device: str | None = None) -> MemoryBudget:
    """Returns the `MemoryBudget` for `device` (see the module docstring)."""
    device = device or default_device()
    if memory_budget is not None:
        return MemoryBudget(parse_memory_size(memory_budget), device, "memory_budget argument")
    if os.environ.get(ENVIRONMENT_VARIABLE):
        size = parse_memory_size(os.environ[ENVIRONMENT_VARIABLE], name=ENVIRONMENT_VARIABLE)
        return MemoryBudget(size, device, ENVIRONMENT_VARIABLE)
    if device.upper().startswith("GPU"):
        return gpu_budget(device)
    available = available_ram()
    return MemoryBudget(
        int(available * CPU_RAM_FRACTION), device, f"{CPU_RAM_FRACTION:.0%} of available RAM"
    )


def gpu_margin(pool_bytes: int) -> int:
    """Bytes kept free of a GPU pool of `pool_bytes` (see `GPU_MARGIN_BYTES`)."""
    return GPU_MARGIN_BYTES + int(GPU_MARGIN_FRACTION * pool_bytes)


def gpu_budget(device: str, list_limits=None) -> MemoryBudget:
    """The budget of a GPU: its allocator's pool less `gpu_margin`; `list_limits` as in `gpu_capacity`."""
    capacity = gpu_capacity(device, list_limits)
    size = capacity.pool_bytes - gpu_margin(capacity.pool_bytes)
    if size <= 0:
        raise ValueError(
            f"The pool of {device} ({capacity.pool_bytes / 2**20:.0f} MiB, {capacity.source}) is smaller "
            f"than kadapt's margin ({gpu_margin(capacity.pool_bytes) / 2**20:.0f} MiB): pass "
            f"`memory_budget=` (e.g. '1GiB') or give the device more memory. Received: memory_budget=None"
        )
    source = f"{capacity.source} {capacity.pool_bytes / 2**30:.1f} GiB less {GPU_MARGIN_BYTES // 2**20} MiB + {GPU_MARGIN_FRACTION:.0%}"
    return MemoryBudget(size, device, source)


def available_ram() -> int:
    """Bytes of RAM available to new allocations (Linux MemAvailable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
