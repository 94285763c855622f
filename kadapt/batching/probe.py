"""What `probe_micro_batch` measures and how it searches, on either backend.

`ProbeTrial` and `ProbeResult`, the search policy `MicroBatchSearch` (it
takes a `runner: size -> ProbeTrial` and knows nothing of how trials run),
its constants and messages, and the rows a probe feeds its trials. The
probe itself is `kadapt.batching.micro_batch_probe.probe_micro_batch`; each
backend's trials are `kadapt.batching.tensorflow.probe` (real trial steps)
and `kadapt.batching.jax.probe` (XLA's plan of the step).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
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
MIN_GAIN = 0.05  # a further trial must promise 5% more rows
FAR = 1.5  # a target above this x the largest measured size is far
EXTRAPOLATED_SHARE = 0.75  # of the way from the best fitting size to a far target
TYPICAL_TRIALS = 5  # with a size that fits, the search ends here; a spare trial looks above the line
MAX_TRIALS = 8  # reached only while no trial has fit with room for the noise
# A size is chosen when its mean peak plus this many standard deviations of a
# step's peak fits: about 1 step in 40 above it, were the peaks normal.
NOISE_SIGMAS = 2.0
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


class MicroBatchSearch:
    """The search policy of `probe_micro_batch`, apart from how trials run.

    Args:
        runner: Callable `size -> ProbeTrial` that runs (or simulates) a trial.
        budget_bytes: Int. Peak bytes a trial may reach and still fit.
    """

    def __init__(self, runner: Callable[[int], ProbeTrial], budget_bytes: int) -> None:
        self.runner, self.budget_bytes = runner, budget_bytes
        self.trials = []

    def largest(self, cap: int) -> int:
        size = min(cap, FIRST_TRIAL_ROWS)
        while not self.run(size).fits:
            if size == 1:
                raise ValueError(too_small_message(self.budget_bytes, self.trials[-1]))
            size = max(1, size // SECOND_TRIAL_FACTOR)
        second = self.second_size(size, cap)
        if second not in {t.micro_batch_size for t in self.trials}:
            self.run(second)
        while len(self.trials) < MAX_TRIALS:
            size = self.next_size(cap)
            if size is None:
                break
            self.run(size)
        # Noise seen late can leave no size with room for it: then the
        # largest that fit by the rule, which did fit.
        return self.best_fitting() or max(t.micro_batch_size for t in self.trials if t.fits)

    def next_size(self, cap: int) -> int | None:
        """The next trial size, or `None` when the search is done."""
        target, predicted = self.next_target(cap)
        best = self.best_fitting()
        if best and len(self.trials) >= TYPICAL_TRIALS:
            return None  # a verified size in the typical count; more would refine it only
        if target > best and not (predicted and target < best * (1 + MIN_GAIN)):
            return target
        # The line promises under MIN_GAIN more. Real peaks are noisy and often
        # concave, which a line through lower sizes under-predicts: with a
        # trial to spare, look 2 x MIN_GAIN higher. Bisection runs to the end.
        explore = min(self.upper_bound(cap), math.ceil(best * (1 + 2 * MIN_GAIN)))
        if predicted and len(self.trials) < TYPICAL_TRIALS and explore > best:
            return explore
        return None

    def upper_bound(self, cap: int) -> int:
        failed = [t.micro_batch_size for t in self.trials if not self.safe(t)]
        return min(failed, default=cap + 1) - 1

    def second_size(self, first: int, cap: int) -> int:
        """A second size far enough from the first for a good slope.

        Peak / rows of the first trial over-counts the per-row cost (the fixed
        part is in it), so budget / that is a lower estimate of the largest
        size; aim at 90% of it, at least `SECOND_TRIAL_FACTOR` x the first.
        """
        trial = self.trials[-1]
        if trial.peak_bytes is None or trial.peak_bytes == 0:
            return min(cap, first * SECOND_TRIAL_FACTOR)
        estimate = int(0.9 * self.budget_bytes * first / trial.peak_bytes)
        return min(cap, max(first * SECOND_TRIAL_FACTOR, estimate))

    def next_target(self, cap: int) -> tuple[int, bool]:
        """The next size to try, and whether the memory model predicted it."""
        failed = [t for t in self.trials if not self.safe(t)]
        upper = self.upper_bound(cap)
        memory_model = self.memory_model()
        if memory_model is not None:
            room = self.budget_bytes / (1 + NOISE_SIGMAS * self.noise())
            predicted = memory_model.largest_fitting(room, MARGIN)
            # Trust the line unless a size it says fits has already failed
            # (an out-of-memory error the allocator's peak did not foresee).
            if predicted < upper or not failed:
                return min(cap, upper, self.damped(predicted)), True
        return (self.best_fitting() + upper + 1) // 2, False

    def damped(self, target: int) -> int:
        """A target far beyond every measured size, pulled back: a line
        through sizes far below its answer is least sure of it (real curves
        bend and step), so go EXTRAPOLATED_SHARE of the way there from the
        best fitting size; the next line runs through nearer points."""
        measured = max(t.micro_batch_size for t in self.trials if t.peak_bytes is not None)
        if target <= FAR * measured:
            return target
        best = self.best_fitting()
        return best + math.ceil(EXTRAPOLATED_SHARE * (target - best))

    def fastest(self, largest: int) -> int:
        smallest = min(t.micro_batch_size for t in self.trials if t.fits)
        tried = {t.micro_batch_size for t in self.trials}
        powers = [2**k for k in range(32) if smallest < 2**k < largest and 2**k not in tried]
        for size in powers[-3:]:
            self.run(size)
        fitting = [t for t in self.trials if t.fits]
        return max(fitting, key=lambda t: t.samples_per_second).micro_batch_size

    def best_fitting(self) -> int:
        return max((t.micro_batch_size for t in self.trials if self.safe(t)), default=0)

    def noise(self) -> float:
        """The relative standard deviation of one step's peak, pooled over
        the measured steps of the trials of at least half the largest
        measured size (a small trial's peak is mostly the fixed part and says
        little of the top); 0 before two steps of one trial are known."""
        measured = [t for t in self.trials if len(t.step_peaks) > 1]
        if not measured:
            return 0.0
        top = max(t.micro_batch_size for t in measured)
        near = [np.asarray(t.step_peaks) / np.mean(t.step_peaks) for t in measured
                if 2 * t.micro_batch_size >= top]
        squares = sum(float(np.sum((r - 1.0) ** 2)) for r in near)
        return math.sqrt(squares / sum(len(r) - 1 for r in near))

    def safe(self, trial: ProbeTrial) -> bool:
        """Fits, and keeps fitting: its mean peak plus NOISE_SIGMAS pooled
        standard deviations within the budget. A size whose steps fit once
        near the edge may not fit in the next process."""
        limit = self.budget_bytes / (1 + NOISE_SIGMAS * self.noise())
        return trial.fits and trial.mean_peak_bytes <= limit

    def memory_model(self) -> MemoryModel | None:
        measured = [t for t in self.trials if t.peak_bytes is not None]
        if len({t.micro_batch_size for t in measured}) < 2:
            return None
        # The two measured sizes nearest the top describe the top best.
        top = sorted(measured, key=lambda t: t.micro_batch_size)[-2:]
        return MemoryModel.fit([t.micro_batch_size for t in top], [t.peak_bytes for t in top])

    def run(self, size: int) -> ProbeTrial:
        trial = self.runner(size)
        self.trials.append(trial)
        return trial


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


def too_small_message(budget_bytes, trial):
    peak = "ran out of memory" if trial.peak_bytes is None else f"peaked at {trial.peak_bytes:,} bytes"
    return (
        f"Argument `memory_budget` is smaller than one sample's training step: a "
        f"step of micro-batches of 1 row {peak}, over the budget. Give a larger "
        f"budget or a smaller model. Received: memory_budget={budget_bytes:,} bytes"
    )
