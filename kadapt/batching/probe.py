"""`probe_micro_batch`: the largest micro-batch that fits, from real trial steps."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np

from kadapt.batching import training_state
from kadapt.batching.accumulate import accumulate
from kadapt.batching.accumulating_train_step import AccumulatingTrainStep
from kadapt.batching.allocator_region import reserve_region
from kadapt.batching.batch_plan import BatchPlan
from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.batching.batch_plan import plan_batch
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.memory_model import MemoryModel
from kadapt.batching.out_of_memory import is_out_of_memory
from kadapt.batching.peak_search import MARGIN  # noqa: F401 (the probe's margin, read by its users)
from kadapt.batching.peak_search import PeakSearch
from kadapt.environment import require_allocator_statistics
from kadapt.validation import check_micro_batch_size

# The peak of one traced step varies from run to run (independent ops run in
# parallel, and whether their buffers overlap depends on timing; figures:
# benchmarks/README.md#peak_levels): a size
# fits when each of this many measured steps does, the rule
# benchmarks/probe.py judges the probe by.
MEASURED_STEPS = 3
PREFERENCES = ("largest", "fastest")


@dataclasses.dataclass(frozen=True)
class ProbeTrial:
    """One trial step: a logical batch of two micro-batches of `micro_batch_size`.

    `peak_bytes` is the highest peak of the measured steps, `step_peaks`
    each one's (empty where not measured step by step); `peak_bytes` and
    `seconds_per_sample` are `None` when the step raised
    `ResourceExhaustedError`. `fits`: every measured step within the budget.
    `compiles`: the traces of the step the trial made (each an XLA compile
    under `jit_compile`; one per new size).
    """

    micro_batch_size: int
    peak_bytes: int | None
    seconds_per_sample: float | None
    fits: bool
    step_peaks: tuple = ()
    compiles: int = 0

    @property
    def mean_peak_bytes(self) -> float | None:
        """The mean of `step_peaks`, else `peak_bytes`."""
        return float(np.mean(self.step_peaks)) if self.step_peaks else self.peak_bytes

    @property
    def samples_per_second(self) -> float | None:
        return None if self.seconds_per_sample is None else 1.0 / self.seconds_per_sample


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What `probe_micro_batch` chose and what it measured."""

    micro_batch_size: int
    trials: tuple
    memory_model: MemoryModel | None
    budget: object

    @property
    def compiles(self) -> int:
        """The trials' traces of the step, each an XLA compile under `jit_compile`."""
        return sum(t.compiles for t in self.trials)

    def plan(self, logical_batch_size: int) -> BatchPlan:
        """The `BatchPlan` of `logical_batch_size`: as many micro-batches as the
        chosen size needs, split evenly (`balanced_micro_batch`), as
        `kadapt train` and `micro_batch_size="auto"` train it."""
        return plan_batch(logical_batch_size, balanced_micro_batch(logical_batch_size, self.micro_batch_size))

    def to_dict(self) -> dict[str, Any]:
        return {
            "micro_batch_size": self.micro_batch_size,
            "compiles": self.compiles,
            "trials": [dataclasses.asdict(t) for t in self.trials],
            "memory_model": None if self.memory_model is None else self.memory_model.to_dict(),
            "budget": dataclasses.asdict(self.budget),
        }


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
    fitting trials only proposes the next size (`PeakSearch`). It never
    returns a size it did not run. About 5 trials, at most 8. A
    `ResourceExhaustedError` counts as "does not fit". The trials leave no
    trace: weights, optimizer state, BatchNorm statistics, metrics and
    `iterations` are restored.

    It needs TensorFlow's allocator statistics for the device; on the CPU
    they exist only with oneDNN on (see `kadapt.environment`), and without
    them it raises `kadapt.AllocatorStatisticsError` before any trial. On the
    CPU it first has the allocator hold twice the budget as one region, as a
    GPU's does (`kadapt.batching.allocator_region`): peaks then depend on the
    step, not on how the process's regions grew.

    On Keras' JAX backend it reads XLA's plan of the step instead of running
    trials (`kadapt.batching.jax.probe.probe_micro_batch_jax`; a plain model
    is planned as it is, `prefer="largest"` only).

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
    model = _accumulating(model)
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
    search = PeakSearch(runner, budget.bytes, trained_size)
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
    from kadapt.batching.tensorflow.fit_trial import fit_steps  # TensorFlow's allocator (JAX plans)
    import tensorflow as tf

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


def sample_rows(data: Any) -> tuple:
    """`(x, y, sample_weight)` rows from arrays or the first batch of a dataset."""
    if is_dataset(data):
        data = next(iter(data))
        return keras.utils.unpack_x_y_sample_weight(data)
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        return tuple(data) + (None,) * (3 - len(data))
    raise TypeError(
        "Argument `data` must be `(x, y)`, `(x, y, sample_weight)` or a batched "
        f"`tf.data.Dataset`. Received: data of type {type(data).__name__}"
    )


def is_dataset(value: Any) -> bool:
    """Whether `value` is a `tf.data.Dataset`; TensorFlow is not imported for
    it (a dataset exists only where TensorFlow is loaded already)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(value, tf.data.Dataset)


def repeat_rows(sample: tuple, rows: int) -> tuple:
    """The first `rows` rows of every array in `sample`, cycling if short."""
    count = row_count(sample)
    index = np.arange(rows) % count

    def take(array):
        if array is None:
            return None
        tf = sys.modules.get("tensorflow")
        if tf is not None and isinstance(array, tf.Tensor):
            return tf.gather(array, index)
        return np.take(np.asarray(array), index, axis=0)

    return keras.tree.map_structure(take, sample)


def row_count(sample: tuple) -> int:
    first = next(a for a in keras.tree.flatten(sample[0]) if a is not None)
    return int(first.shape[0])


def _cap(sample, max_micro_batch_size):
    if max_micro_batch_size is None:
        return row_count(sample)
    return check_micro_batch_size(max_micro_batch_size, name="max_micro_batch_size")


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
