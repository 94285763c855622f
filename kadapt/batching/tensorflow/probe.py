"""The probe on TensorFlow: real trial steps, measured by the allocator's statistics.

`probe_micro_batch_tensorflow` runs what `kadapt.probe_micro_batch` runs on
TensorFlow: trial steps of the accumulating train step whose peaks
`tf.config.experimental.reset_memory_stats` / `get_memory_info` read, sizes
chosen by `kadapt.batching.peak_search.PeakSearch`; each trial runs the
step through `fit` (`kadapt.batching.tensorflow.fit_trial`); the trials
leave no trace (`leaves_no_trace`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kadapt.batching import training_state
from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.peak_search import PeakSearch
from kadapt.batching.probe import ProbeResult
from kadapt.batching.probe import ProbeTrial
from kadapt.batching.probe import is_dataset
from kadapt.batching.probe import repeat_rows
from kadapt.batching.probe import row_count
from kadapt.batching.probe import sample_rows
from kadapt.batching.tensorflow.allocator_region import reserve_region
from kadapt.batching.tensorflow.fit_trial import fit_steps
from kadapt.batching.tensorflow.out_of_memory import is_out_of_memory
from kadapt.environment import require_allocator_statistics
from kadapt.validation import check_micro_batch_size

# The peak of one traced step varies from step to step: independent ops run in
# parallel, and whether their buffers overlap depends on timing. small_cnn's
# step at 147 rows (a logical batch of 1,024, oneDNN on) peaked at 54.0-83.6
# MiB over 22 steps in each of 10 processes, and at 52.2 MiB in every step
# with one inter-op thread (docs/probe.md). Three steps saw 63.5-63.8 MiB of
# 64 in one probe, and the size was chosen; its third training step peaked at
# 68.5. So a size fits when each of MEASURED_STEPS measured steps does, its
# room for the noise taken from their spread. A trial over the budget runs
# them all too: a `fit` stopped early left its data alive in a reference
# cycle until a collection (two_conv: 16 rows at 46 MiB after three stopped
# trials, 22 after three whole ones), and the steps after it peaked higher.
MEASURED_STEPS = 5


def probe_micro_batch_tensorflow(
    model: keras.Model,
    data: Any,
    memory_budget: int | str | None,
    prefer: str,
    max_micro_batch_size: int | None,
    on_trial: Callable[[ProbeTrial], None] | None,
    logical_batch_size: int | None,
) -> ProbeResult:
    """`kadapt.probe_micro_batch` on TensorFlow, for an accumulating model
    (`kadapt.AccumulatingTrainStep`); the arguments are its own."""
    budget = device_budget(memory_budget)
    require_allocator_statistics(budget.device)
    sample = sample_rows(data)
    cap = _cap(sample, max_micro_batch_size)
    rows = None
    if logical_batch_size is not None:
        rows = check_micro_batch_size(logical_batch_size, name="logical_batch_size")
    reserve_region(budget)
    report = on_trial or (lambda trial: None)

    def runner(size):
        trial = run_trial(model, sample, size, budget, rows, data if is_dataset(data) else None)
        report(trial)
        return trial

    trained_size = None if rows is None else (lambda size: balanced_micro_batch(rows, size))
    search = PeakSearch(runner, budget.bytes, trained_size, 0 if is_dataset(data) else array_bytes(data), rows)
    with leaves_no_trace(model, sample):
        chosen = search.largest(cap)
        if prefer == "fastest":
            chosen = search.fastest(chosen)
    return ProbeResult(chosen, tuple(search.trials), search.memory_model(), budget)


def run_trial(model: keras.Model, sample: tuple, size: int, budget: MemoryBudget,
              rows: int | None = None, data: Any = None) -> ProbeTrial:
    """Runs the step `fit` will run at micro-batch `size`: one traced step of
    `rows` rows, then MEASURED_STEPS measured ones, all through `model.fit`
    on `data` (a dataset, else `sample`'s arrays; see
    `kadapt.batching.tensorflow.fit_trial`); returns a `ProbeTrial` with the
    highest peak and the fastest step. The step is two micro-batches of
    `size`, or with `rows` (a logical batch) as it trains: split evenly into
    as many micro-batches as `size` needs (`balanced_micro_batch`)."""
    model.micro_batch_size = size if rows is None else balanced_micro_batch(rows, size)
    rows = rows or 2 * size
    compiles = compile_count(model)
    try:
        steps = fit_steps(model, sample if data is None else data, sample, rows, 1 + MEASURED_STEPS,
                          budget.device, lambda count: repeat_rows(sample, count))
    except tf.errors.OpError as error:
        if not is_out_of_memory(error):
            raise
        return ProbeTrial(size, None, None, False, compiles=compile_count(model) - compiles)
    compiles = compile_count(model) - compiles
    # The CPU allocator's statistics skip small allocations; a step never
    # needs less than its variables, optimizer slots and gradient sum.
    floor = resident_bytes(model)
    peaks = tuple(int(max(p, floor)) for p in steps.peaks[1:])  # the first step traced
    seconds = min(steps.seconds[1:])
    return ProbeTrial(size, max(peaks), seconds / rows, max(peaks) <= budget.bytes, peaks, compiles)


def array_bytes(data: Any) -> int:
    """Bytes of the arrays in `data` (`(x, y, sample_weight)`, nested)."""
    arrays = [a for a in keras.tree.flatten(data) if a is not None and hasattr(a, "shape")]
    return sum(int(np.prod(a.shape)) * np.dtype(getattr(a.dtype, "as_numpy_dtype", a.dtype)).itemsize
               for a in arrays)


def compile_count(model: keras.Model) -> int:
    """The traces of the model's train function so far (0 before it exists)."""
    return getattr(model.train_function, "compiles", 0)


def resident_bytes(model: keras.Model) -> int:
    """Bytes of the model's and optimizer's variables plus a float32 gradient sum."""
    variables = list(model.variables) + list(model.optimizer.variables)
    held = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
    return held + sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)


@contextlib.contextmanager
def leaves_no_trace(model: keras.Model, sample: tuple) -> Iterator[None]:
    """Builds the model, then restores every variable a trial step can touch."""
    x = repeat_rows(sample, 1)[0]
    if not model.built:
        model(x, training=False)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    saved = training_state.host_snapshot(training_state.state_variables(model))
    known = {id(variable) for variable, _ in saved}
    micro, retries = model._micro_batch_size, model.max_oom_retries
    model.max_oom_retries = 0  # a trial's OOM is an answer, not a failure
    try:
        yield
    finally:
        training_state.restore(saved)
        for metric in model.metrics:
            if any(id(v) not in known for v in metric.variables):
                metric.reset_state()
        model._micro_batch_size, model.max_oom_retries = micro, retries


def _cap(sample, max_micro_batch_size):
    if max_micro_batch_size is None:
        return row_count(sample)
    return check_micro_batch_size(max_micro_batch_size, name="max_micro_batch_size")
