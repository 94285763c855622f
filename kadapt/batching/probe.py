"""What `probe_micro_batch` measures and how it searches, on either backend.

`ProbeTrial` and `ProbeResult`, the constants and messages the searches
share (the trial probe's `kadapt.batching.peak_search.PeakSearch`, the plan
probe's `kadapt.batching.plan_search.PlanSearch`), and the rows a probe
feeds its trials. The
probe itself is `kadapt.batching.micro_batch_probe.probe_micro_batch`; each
backend's trials are `kadapt.batching.tensorflow.probe` (real trial steps)
and `kadapt.batching.jax.probe` (XLA's plan of the step).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import keras
import numpy as np

from kadapt.batching.batch_plan import BatchPlan
from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.batching.batch_plan import plan_batch
from kadapt.batching.memory_model import MemoryModel

FIRST_TRIAL_ROWS = 16
SECOND_TRIAL_FACTOR = 4
MARGIN = 0.05  # of the room above the fixed memory, kept free
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


def too_small_message(budget_bytes, trial, data_bytes=0):
    """The error when a step of 1-row micro-batches does not fit; `data_bytes`:
    the size of the data given as arrays (0 for a dataset), named where it
    is half the budget or more (`fit` may copy arrays into the allocator the
    step is measured in: docs/probe.md)."""
    peak = "ran out of memory" if trial.peak_bytes is None else f"peaked at {trial.peak_bytes:,} bytes"
    data = ""
    if data_bytes and 2 * data_bytes >= budget_bytes:
        data = (f" The data given as arrays ({data_bytes:,} bytes) counts in the same memory: `fit` "
                f"copies arrays into TensorFlow's allocator; pass a `tf.data.Dataset` that reads "
                f"them in batches, or a budget well above the data.")
    received = f"memory_budget={budget_bytes:,} bytes"
    if data:
        received += f", data arrays of {data_bytes:,} bytes"
    return (
        f"Argument `memory_budget` is smaller than one sample's training step: a "
        f"step of micro-batches of 1 row {peak}, over the budget. Give a larger "
        f"budget or a smaller model.{data} Received: {received}"
    )
