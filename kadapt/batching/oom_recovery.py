"""Out-of-memory recovery: shrink the micro-batch and retry the same batch.

The rule is backend-neutral: `smaller_micro_batch` picks the size to retry
with and `shrink` records the event (`oom_events`) or raises
`OutOfMemoryError` after `max_oom_retries`. Each backend's train function
runs it: `kadapt.batching.tensorflow.recovery.RecoveringTrainFunction`
(restores what a failed step touched, runs the same batch again; read its
docstring for tf.distribute) and `kadapt.batching.jax.train_function`.
"""

from __future__ import annotations

import logging
import math

import keras

from kadapt.batching.memory_model import MemoryModel
from kadapt.batching.out_of_memory import explain

logger = logging.getLogger("kadapt")

SHRINK_FACTOR = 0.75  # without a memory model; gentler than halving


class OutOfMemoryError(RuntimeError):
    """A training step does not fit even after shrinking the micro-batch."""


def proposed_micro_batch(model, micro):
    """The micro-batch this worker would retry with after running out of memory at `micro`."""
    if micro == 1:
        return 1
    return smaller_micro_batch(micro, getattr(model.probe_result, "memory_model", None))


def shrink(model, error, attempt, smaller=None, step=None):
    """Sets a smaller micro-batch after an OOM (`smaller`, or this process's
    choice), or raises `OutOfMemoryError`. `step`: the logical step, where the
    optimizer's variable does not hold it (JAX's state lives outside it in `fit`)."""
    micro = model.micro_batch_size
    if micro == 1 or attempt >= model.max_oom_retries:
        raise OutOfMemoryError(
            f"A training step ran out of memory with micro_batch_size={micro} "
            f"after {attempt} retries (max_oom_retries={model.max_oom_retries}); the last error: "
            f"{explain(error)}. Use a smaller model or input, a device with more memory, or "
            "mixed precision (`keras.mixed_precision.set_global_policy('mixed_float16')`)."
        ) from error
    if smaller is None:
        smaller = proposed_micro_batch(model, micro)
    if step is None:
        step = int(keras.ops.convert_to_numpy(model.optimizer.iterations)) if model.optimizer.built else 0
    model._oom_events.append((step, micro, smaller))
    # Each retry traces the step anew (an XLA compile under `jit_compile`).
    logger.warning(
        "out of memory at micro_batch_size=%d (step %d); retrying the same "
        "batch with micro_batch_size=%d (a new compile; %d so far)", micro, step, smaller,
        getattr(model.train_function, "compiles", 0) + 1,
    )
    model.micro_batch_size = smaller


def smaller_micro_batch(micro_batch_size: int, memory_model: MemoryModel | None = None) -> int:
    """The micro-batch to retry with after `micro_batch_size` ran out of memory.

    With a memory model, re-solve it for 90% of the peak it predicted for the
    size that failed (the device evidently had less room than thought);
    without one, shrink by `SHRINK_FACTOR`. Never below half, never the same.
    """
    if memory_model is not None:
        room = 0.9 * memory_model.peak_bytes(micro_batch_size)
        target = memory_model.largest_fitting(room)
    else:
        target = math.floor(micro_batch_size * SHRINK_FACTOR)
    return max(1, math.ceil(micro_batch_size / 2), min(target, micro_batch_size - 1))
