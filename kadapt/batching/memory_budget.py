"""How many bytes a training step may use on a device.

Order of precedence: the `memory_budget` argument, the `KADAPT_MEMORY_BUDGET`
environment variable, then the device itself — on a GPU its capacity (NVML
through `nvidia-ml-py` when installed, else the logical device's
`memory_limit`) minus `GPU_SAFETY_MARGIN`; on the CPU `CPU_RAM_FRACTION` of the
RAM available now.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re

import tensorflow as tf

GPU_SAFETY_MARGIN = 0.10  # CUDA context, cuDNN workspaces, fragmentation
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
        capacity, source = gpu_capacity(device)
        return MemoryBudget(int(capacity * (1 - GPU_SAFETY_MARGIN)), device, source)
    available = available_ram()
    return MemoryBudget(
        int(available * CPU_RAM_FRACTION), device, f"{CPU_RAM_FRACTION:.0%} of available RAM"
    )


def gpu_capacity(device: str = "GPU:0") -> tuple[int, str]:
    """Total bytes of a GPU and how they were found."""
    index = int(device.split(":")[-1])
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        pynvml = None
    if pynvml is not None:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), "NVML total"
        finally:
            pynvml.nvmlShutdown()
    physical = tf.config.list_physical_devices("GPU")[index]
    limits = tf.config.get_logical_device_configuration(physical) or []
    if limits and limits[0].memory_limit:
        return int(limits[0].memory_limit) * 2**20, "logical device memory_limit"
    details = tf.config.experimental.get_device_details(physical)
    raise ValueError(
        f"The capacity of {device} ({details.get('device_name', 'GPU')}) is unknown: "
        "install `nvidia-ml-py`, set a logical device `memory_limit`, or pass "
        "`memory_budget=` (e.g. '20GiB'). Received: memory_budget=None"
    )


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
