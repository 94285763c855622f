"""What TensorFlow, and NVML where installed, say about a GPU's memory.

A GPU's capacity, for kadapt, is the pool TensorFlow's allocator has on it:
the `memory_limit` TensorFlow gave the device when it created it (the free
memory at start minus TensorFlow's reserve, or a logical device's
`memory_limit`; only the GPUs `CUDA_VISIBLE_DEVICES` shows). NVML's total
is the whole board, including what this process can never get; it is shown
beside the pool as a cross-check, never used as the budget.

NVML numbers the boards in PCI bus order and ignores
`CUDA_VISIBLE_DEVICES`; TensorFlow's GPU i is the i-th entry of
`CUDA_VISIBLE_DEVICES` (an index or a `GPU-` UUID, possibly a prefix). The
two orders agree when `CUDA_DEVICE_ORDER=PCI_BUS_ID` or every board is of
one kind.
"""

from __future__ import annotations

import dataclasses
import os

from kadapt.environment import VISIBLE_DEVICES
from kadapt.environment import visible_device_entry


@dataclasses.dataclass(frozen=True)
class GpuCapacity:
    """The pool of a GPU's allocator, where the figure came from, and NVML's total (or `None`)."""

    pool_bytes: int
    source: str
    nvml_total_bytes: int | None


def tensorflow_memory_limits() -> dict[str, int]:
    """`{"GPU:0": bytes, "CPU:0": bytes, ...}`: the `memory_limit` of each
    device of TensorFlow's eager context, the devices kadapt's steps run on.

    TensorFlow has no public call for it: `kadapt._compat` reads the eager
    context's own device list (why that one: its docstring), and returns
    `{}` where the internals it reads are gone (the logical device
    configuration is then the only source).
    """
    from kadapt._compat import tensorflow_device_memory_limits

    return {short_name(name): limit for name, limit in tensorflow_device_memory_limits().items()}


def short_name(name: str) -> str:
    """`"GPU:0"` for `"/job:localhost/replica:0/task:0/device:GPU:0"`."""
    return ":".join(name.split(":")[-2:])


def gpu_capacity(device: str = "GPU:0", list_limits=None) -> GpuCapacity:
    """The pool of `device`'s allocator (see the module docstring).

    Args:
        device: String, e.g. `"GPU:0"`. Defaults to `"GPU:0"`.
        list_limits: Callable `() -> {device: bytes}` or `None`. Defaults to
            `tensorflow_memory_limits` (tests substitute it).
    """
    index = device_index(device)
    pool = (list_limits or tensorflow_memory_limits)().get(f"GPU:{index}")
    source = "TensorFlow memory_limit"
    if not pool:
        pool, source = _logical_limit(index), "logical device memory_limit"
    if not pool:
        raise ValueError(
            f"The memory of {device} is unknown: TensorFlow reports no memory_limit for it. "
            "Pass `memory_budget=` (e.g. '20GiB'), or set a logical device memory_limit. "
            f"Received: memory_budget=None, device={device!r}"
        )
    return GpuCapacity(int(pool), source, nvml_total(index))


def device_index(device: str) -> int:
    try:
        return int(device.split(":")[-1])
    except ValueError:
        raise ValueError(
            f"Argument `device` must name a device with its index, e.g. 'GPU:0'. Received: device={device!r}"
        ) from None


def _logical_limit(index):
    import tensorflow as tf

    physical = tf.config.list_physical_devices("GPU")
    if index >= len(physical):
        return None
    limits = tf.config.get_logical_device_configuration(physical[index]) or []
    return limits[0].memory_limit * 2**20 if limits and limits[0].memory_limit else None


def nvml_total(index: int, visible: str | None = None, nvml=None) -> int | None:
    """NVML's total bytes of TensorFlow's GPU `index`, or `None` without NVML
    (`nvidia-ml-py` not installed, no driver) or when the board is not found.

    Args:
        index: Int. TensorFlow's GPU index.
        visible: String or `None`. `CUDA_VISIBLE_DEVICES`. Defaults to the
            process's.
        nvml: Module or `None`. `pynvml`. Defaults to importing it.
    """
    nvml = nvml or _import_nvml()
    if nvml is None:
        return None
    visible = os.environ.get(VISIBLE_DEVICES) if visible is None else visible
    entry = visible_device_entry(index, visible)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        handle = _nvml_handle(nvml, entry)
        return None if handle is None else int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except nvml.NVMLError:  # a board NVML cannot read (lost, no permission): no cross-check
        return None
    finally:
        nvml.nvmlShutdown()


def _nvml_handle(nvml, entry):
    boards = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    if entry.isdigit():
        return boards[int(entry)] if int(entry) < len(boards) else None
    for board in boards:  # a UUID, or a prefix of one, as CUDA accepts
        uuid = nvml.nvmlDeviceGetUUID(board)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if uuid.startswith(entry):
            return board
    return None


def _import_nvml():
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return None
    return pynvml
