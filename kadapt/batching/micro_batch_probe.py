"""`probe_micro_batch`: the largest micro-batch that fits, on either backend.

The one place the probe picks a backend: real trial steps on TensorFlow
(`kadapt.batching.tensorflow.probe`), XLA's plan of the step on JAX
(`kadapt.batching.jax.probe`). What both measure and how they search is in
`kadapt.batching.probe` and `kadapt.batching.plan_search`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from kadapt.batching.accumulate import accumulate
from kadapt.batching.accumulating_train_step import AccumulatingTrainStep
from kadapt.batching.probe import PREFERENCES
from kadapt.batching.probe import ProbeResult
from kadapt.batching.probe import ProbeTrial


def probe_micro_batch(
    model: keras.Model,
    data: Any,
    memory_budget: int | str | None = None,
    prefer: str = "largest",
    max_micro_batch_size: int | None = None,
    on_trial: Callable[[ProbeTrial], None] | None = None,
    logical_batch_size: int | None = None,
) -> ProbeResult:
    """Finds the largest micro-batch whose training step fits in memory.

    Runs trial steps of the accumulating train step as `fit` runs it (of
    the logical batch where given, only sizes it trains as, else of two
    micro-batches; through `model.fit`, so the input pipeline counts) and
    measures three steps of each with `tf.config.experimental.reset_memory_stats`
    / `get_memory_info`: a size fits when each step's peak is within the
    budget. Peaks are not monotonic in rows (kernels change with the batch
    size), so each size is judged by its own peaks, and chosen only when its
    mean peak plus two standard deviations of a step's peak (pooled over the
    fitting trials near the top) fits too; a line through the largest
    fitting trials only proposes the next size
    (`kadapt.batching.peak_search.PeakSearch`). It never returns a size it
    did not run. About 5 trials, at most 8. A `ResourceExhaustedError`
    counts as "does not fit". The trials leave no trace: weights, optimizer
    state, BatchNorm statistics, metrics and `iterations` are restored.

    It needs TensorFlow's allocator statistics for the device; on the CPU
    they exist only with oneDNN on (see `kadapt.environment`), and without
    them it raises `kadapt.AllocatorStatisticsError` before any trial. On the
    CPU it first has the allocator hold twice the budget as one region, as a
    GPU's does (`kadapt.batching.tensorflow.allocator_region`): peaks then depend on the
    step, not on how the process's regions grew.

    On Keras' JAX backend it reads XLA's plan of the step instead of running
    trials (`kadapt.batching.jax.probe.probe_micro_batch_jax`; a plain model
    is planned as it is, `prefer="largest"` only); on TensorFlow it runs
    `kadapt.batching.tensorflow.probe.probe_micro_batch_tensorflow`.

    Args:
        model: Compiled `keras.Model`. An accumulating model is probed as is;
            any other is probed through `kadapt.accumulate`.
        data: `(x, y)` or `(x, y, sample_weight)` arrays, or a batched
            `tf.data.Dataset`. Its first rows (repeated when needed) feed the
            trials.
        memory_budget: Bytes, a string like `"2GiB"`, or `None` for the
            device's (see `kadapt.batching.memory_budget`). Defaults to `None`.
        prefer: `"largest"` or `"fastest"` (the fitting trial size with the
            best samples/s; probes a few powers of two more). Defaults to
            `"largest"`.
        max_micro_batch_size: Positive int or `None`. The largest size worth
            having, usually the logical batch size. Defaults to the rows of
            `data` (arrays) or of its first batch (a dataset).
        on_trial: Callable `ProbeTrial -> None` or `None`, called after each
            trial (progress lines). Defaults to `None`.
        logical_batch_size: Positive int or `None`. The rows of the steps
            that will train: each trial step is one of them, split as
            `ProbeResult.plan` splits it (a step of many micro-batches peaks
            higher than one of two). Defaults to `None` (two micro-batches).

    Returns:
        A `ProbeResult`.

    Example:

    ```python
    result = kadapt.probe_micro_batch(model, (x, y), memory_budget="4GiB")
    print(result.micro_batch_size, result.plan(1024))
    ```
    """
    if prefer not in PREFERENCES:
        raise ValueError(
            f"Argument `prefer` must be one of {PREFERENCES}. Received: prefer={prefer!r}"
        )
    if keras.backend.backend() == "jax":  # JAX: XLA's plan of the step, no trial steps
        return _probe_jax(model, data, memory_budget, prefer, max_micro_batch_size, on_trial,
                          logical_batch_size)
    from kadapt.batching.tensorflow.probe import probe_micro_batch_tensorflow  # TensorFlow is optional

    return probe_micro_batch_tensorflow(_accumulating(model), data, memory_budget, prefer, max_micro_batch_size,
                                        on_trial, logical_batch_size)


def _accumulating(model):
    if isinstance(model, AccumulatingTrainStep):
        checked = model
    elif isinstance(model, keras.Model):
        checked = accumulate(model, 1)
    else:
        raise TypeError(
            "Argument `model` must be a compiled `keras.Model`. "
            f"Received: model={model!r} (of type {type(model).__name__})"
        )
    if not checked.compiled:
        raise ValueError(
            "Argument `model` must be compiled before probing: call "
            f"`model.compile(optimizer=..., loss=...)`. Received: model={model.name!r}"
        )
    return checked


def _probe_jax(model, data, memory_budget, prefer, max_micro_batch_size, on_trial, logical_batch_size):
    from kadapt.batching.jax.probe import probe_micro_batch_jax  # JAX is optional

    if prefer != "largest":
        raise ValueError(
            "Argument `prefer` must be 'largest' on the JAX backend: a plan gives memory, "
            f"not speed. Received: prefer={prefer!r}"
        )
    return probe_micro_batch_jax(model, data, memory_budget, max_micro_batch_size, on_trial,
                                 logical_batch_size)
