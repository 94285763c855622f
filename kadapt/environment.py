"""TensorFlow's process settings that kadapt relies on, made before TensorFlow loads.

TensorFlow reads some settings from environment variables once, when it is
imported. Two matter to kadapt on the CPU:

- `TF_ENABLE_ONEDNN_OPTS`: TensorFlow 2.21 turns its oneDNN kernels on by
  default on some CPUs only. Where they are off, conv nets train several times
  slower (benchmarks/README.md#cpu_allocator) and the CPU allocator keeps no statistics, so
  `tf.config.experimental.get_memory_info("CPU:0")` raises and the memory probe
  cannot measure a step.
- `TF_CPU_ALLOCATOR_USE_BFC`: the BFC allocator (the GPU's) on the CPU. It also
  gives statistics; `benchmarks/probe/cpu_allocator.py` measured both, and kadapt
  uses `SETTINGS` (figures: benchmarks/README.md#cpu_allocator; design: docs/probe.md).

The `kadapt` command, `tools/probe_gpu.py`, the tests and the benchmarks call
`configure_tensorflow()` before importing TensorFlow. A variable the user set
is never changed. In a process that imported TensorFlow without them,
`require_allocator_statistics` raises `AllocatorStatisticsError`, which says
what to set. This module imports nothing of TensorFlow at import time.

Under Keras' JAX backend none of this matters to the training step (XLA runs
it); `configure_tensorflow` only sets variables and is harmless there, and
`load_tensorflow` raises `kadapt.extras.MissingExtraError` where TensorFlow is
not installed.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from types import ModuleType
from typing import Any

from kadapt.extras import require

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
BFC = "TF_CPU_ALLOCATOR_USE_BFC"
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
INTEROP_THREADS = "TF_NUM_INTEROP_THREADS"
# Chosen by benchmarks/probe/cpu_allocator.py: statistics on every CPU and the fast
# kernels, with peaks that repeat run to run.
SETTINGS = {ONEDNN: "1"}
QUIET_LOG_LEVEL = "2"  # TensorFlow's C++ errors only
_TRUE = {"1", "true", "yes", "on"}
# TensorFlow's C++ log lines (absl format) and the line absl writes before it
# is initialized; the CUDA probing on a machine without a GPU prints these.
_CPP_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ [\w.-]+:\d+\] ")
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called"


class AllocatorStatisticsError(RuntimeError):
    """TensorFlow keeps no allocator statistics for a device in this process."""


def configure_tensorflow(verbose: bool = False) -> None:
    """Sets kadapt's TensorFlow settings where the user has not set them.

    Call it before TensorFlow is imported; afterwards TensorFlow has read its
    settings and this does nothing. `TF_CPP_MIN_LOG_LEVEL` is set to `"2"`
    (errors only) unless `verbose` or the user set it.

    Args:
        verbose: Bool. Leave TensorFlow's log level alone. Defaults to `False`.

    Returns:
        Dict of the variables this call set (empty when TensorFlow was already
        imported or the user had set them all).

    Example:

    ```python
    from kadapt import environment
    environment.configure_tensorflow()
    import tensorflow as tf  # oneDNN on, CPU allocator statistics available
    ```
    """
    if "tensorflow" in sys.modules:
        return {}
    wanted = dict(SETTINGS)
    if not verbose:
        wanted[LOG_LEVEL] = QUIET_LOG_LEVEL
    applied = {name: value for name, value in wanted.items() if name not in os.environ}
    os.environ.update(applied)
    return applied


def load_tensorflow(verbose: bool = False) -> ModuleType:
    """`configure_tensorflow`, then imports TensorFlow and lists its devices.

    TensorFlow's CUDA probing writes C++ log lines to the process's standard
    error before `TF_CPP_MIN_LOG_LEVEL` takes effect ("Could not find cuda
    drivers", "failed call to cuInit"). Unless `verbose` or the user set
    `TF_CPP_MIN_LOG_LEVEL`, those lines are held back: file descriptor 2 goes
    to a temporary file while TensorFlow loads, and every other line is
    written back after (every line, if loading raised).

    Args:
        verbose: Bool. Leave the log level alone and show every line.
            Defaults to `False`.

    Returns:
        The `tensorflow` module.

    Raises:
        kadapt.extras.MissingExtraError: TensorFlow is not installed (it is
            the `tensorflow` extra).
    """
    applied = configure_tensorflow(verbose)
    with _held_log_lines(LOG_LEVEL in applied):
        tf = require("tensorflow", extra="tensorflow")

        tf.config.list_physical_devices()
    return tf


@contextlib.contextmanager
def _held_log_lines(enabled):
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            _write_back(held.read().decode(errors="replace"), keep_all=failed)


def _write_back(text, keep_all):
    lines = text.splitlines(keepends=True)
    kept = lines if keep_all else [line for line in lines if not is_tensorflow_log_line(line)]
    if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def is_tensorflow_log_line(line: str) -> bool:
    """Whether `line` is one of TensorFlow's C++ (absl) log lines."""
    return bool(_CPP_LOG_LINE.match(line)) or line.startswith(_ABSL_PREAMBLE)


def visible_device_entry(index: int, visible: str | None) -> str:
    """Entry `index` of `CUDA_VISIBLE_DEVICES` (`visible`): a board index or a UUID.
    Without the variable, TensorFlow's GPU i is board i."""
    if not visible:
        return str(index)
    entries = [entry.strip() for entry in visible.split(",")]
    return entries[index] if index < len(entries) else str(index)


def steady_peaks(tf: ModuleType) -> str | None:
    """One inter-op thread for a run under a memory budget on the CPU, where
    the user chose none: independent ops then run one after the other, and a
    step's peak memory holds still from step to step, which the probe's
    choice rests on (benchmarks/README.md#interop_peak: the spread of a
    step's peak 1.08-1.10x -> 1.01-1.04x, the steps no slower; from process
    to process it still moves with what the process ran before:
    benchmarks/README.md#probe). Call it before TensorFlow runs its first operation. Returns the
    line a run prints; `None` on a GPU (its peak is its own allocator's).
    """
    if INTEROP_THREADS in os.environ:
        return f"{INTEROP_THREADS}={os.environ[INTEROP_THREADS]} (yours)"
    if tf.config.list_physical_devices("GPU"):
        return None
    try:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow already ran an operation in this process
        return "TensorFlow's own inter-op threads (it had already started in this process)"
    return (f"one inter-op thread under a memory budget on the CPU, so that a step's peak holds still "
            f"(set {INTEROP_THREADS} to choose)")


def thread_share(processes: int) -> int:
    """The CPU threads each of `processes` processes on this host gets: an equal share, at least 1."""
    return max(1, (os.cpu_count() or 1) // processes)


def set_cpu_threads(threads: int) -> None:
    """Limits TensorFlow in this process to `threads` intra-op and inter-op threads; call it
    before TensorFlow runs its first operation (or creates a distribution strategy)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def allocator_statistics_available(device: str = "CPU:0") -> bool:
    """Whether `tf.config.experimental.get_memory_info(device)` works here."""
    import tensorflow as tf

    try:
        tf.config.experimental.get_memory_info(device)
    except ValueError:
        return False
    return True


def require_allocator_statistics(device: str = "CPU:0") -> None:
    """Raises `AllocatorStatisticsError` unless `device` keeps statistics."""
    if allocator_statistics_available(device):
        return
    now = ", ".join(f"{name}={os.environ[name]!r}" for name in (ONEDNN, BFC) if name in os.environ)
    raise AllocatorStatisticsError(
        f"TensorFlow keeps no allocator statistics for device {device!r} in this process, so "
        f"kadapt cannot measure a training step's memory (set here: {now or 'neither variable'}). "
        f"Set {ONEDNN}=1 before TensorFlow is imported: in the shell "
        f"(`{ONEDNN}=1 python train.py`), or call `kadapt.environment.configure_tensorflow()` "
        "before the first `import tensorflow`/`import keras`. The `kadapt` command does this "
        "itself. Or pass an int micro_batch_size instead of probing."
    )


def describe() -> dict[str, Any]:
    """The settings TensorFlow runs under here, for `kadapt probe`'s fact sheet."""
    onednn = os.environ.get(ONEDNN)
    bfc = os.environ.get(BFC, "").strip().lower() in _TRUE
    return {
        "onednn": "not set (TensorFlow's default for this CPU)" if onednn is None
        else ("on" if onednn.strip().lower() in _TRUE else "off"),
        "onednn_variable": None if onednn is None else f"{ONEDNN}={onednn}",
        "cpu_allocator": "BFC" if bfc else "TensorFlow's default CPU allocator",
    }
