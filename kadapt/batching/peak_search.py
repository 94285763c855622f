"""`PeakSearch`: the largest micro-batch whose measured peaks fit, without assuming a line.

Peaks are not monotonic in rows on every device: oneDNN on the CPU (as
cuDNN's algorithm choice on a GPU) picks kernels with different scratch
space by batch size, and a logical batch split into micro-batches with a
ragged tail peaks higher than an even split. Measured on an AMD EPYC (a two
conv net, 1,024-row logical batch): 64 rows peaked at 49.7 MB, 57 rows at
66.5 MB, 69 rows at 72.6 MB (docs/probe.md).

So each size is judged by its own measured peaks: it fits when every step
did, and it is chosen when its mean peak plus NOISE_SIGMAS pooled standard
deviations (of the fitting trials within NEIGHBOURS x of that size) fits too. The line
peak = a + b * m through the two largest fitting trials only proposes where
to look next; a size that fits is never dropped because a smaller one did
not, and the search looks only between the largest size chosen so far and
the smallest tried above it that was not (then once past it, where it
fitted without room for its noise and nothing is left below it). Bisection
tries a size that divides the logical batch first: no ragged tail, one
micro-batch shape. The search runs no trial
to insure the choice: a size that overflows in another process (peaks
that jump with the size jump with the process too) is caught by the
first-step check there, which falls back to 0.8 x the size and checks
those steps (`kadapt.batching.auto_micro_batch.FirstStepCheck`); that
fallback is measured only where it is needed. Typically five trials, at most eight; it
never returns a size it did not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kadapt.batching.memory_model import MemoryModel
from kadapt.batching.probe import FIRST_TRIAL_ROWS
from kadapt.batching.probe import MARGIN
from kadapt.batching.probe import SECOND_TRIAL_FACTOR
from kadapt.batching.probe import too_small_message

MIN_GAIN = 0.05  # a further trial must promise 5% more rows
FAR = 1.5  # a target above this x the largest measured size is far
EXTRAPOLATED_SHARE = 0.75  # of the way from the chosen size to a far target
TYPICAL_TRIALS = 5  # with a chosen size, the search ends here
MAX_TRIALS = 8  # reached only while no trial has fit with room for the noise
# A size is chosen when its mean peak plus this many standard deviations of a
# step's peak fits: about 1 step in 40 above it, were the peaks normal.
NOISE_SIGMAS = 2.0
# A failing size whose mean peak is this far above the line through the fitting
# sizes is a jump (the 57 and 69 rows: 40-45% above), not the line's end.
JUMP = 0.15
# A size's room for the noise pools the steps of the fitting sizes within this
# factor of it: pooled from every fitting size above half the largest, a noisy
# size far above took a steady size's room (an AMD run of issue 44's net chose
# 28 rows twice where 34 had fitted).
NEIGHBOURS = 1.25


class PeakSearch:
    """The search policy of `probe_micro_batch`, apart from how trials run.

    Args:
        runner: Callable `size -> ProbeTrial` that runs (or simulates) a
            trial; `fits`, `peak_bytes`, `step_peaks` and, for `fastest`,
            `samples_per_second` are read.
        budget_bytes: Int. Peak bytes a trial may reach and still fit.
        trained_size: Callable `size -> size` or `None`: the micro-batch a
            size trains as (a logical batch split evenly runs
            `balanced_micro_batch(B, m) <= m`), so only sizes that train are
            tried, once each. Defaults to `None` (every size as it is).
        data_bytes: Int. Bytes of the data given as arrays (0 for a
            dataset), named by the error when not even 1 row fits.
            Defaults to 0.
        logical_batch_size: Int or `None`. The rows a step trains. A size
            that divides it splits it with no ragged tail, one micro-batch
            shape, and bisection tries such a size first where one lies
            between its bounds. Defaults to `None` (no size preferred).

    Example:

    ```python
    search = PeakSearch(lambda m: run_trial(model, sample, m, budget), budget.bytes)
    chosen = search.largest(1024)
    ```
    """

    def __init__(self, runner: Callable[[int], Any], budget_bytes: int,
                 trained_size: Callable[[int], int] | None = None, data_bytes: int = 0,
                 logical_batch_size: int | None = None) -> None:
        self.runner, self.budget_bytes, self.data_bytes = runner, budget_bytes, data_bytes
        self.trained_size = trained_size or (lambda size: size)
        self.logical_batch_size = logical_batch_size
        self.trials = []

    def largest(self, cap: int) -> int:
        """The largest tried size that fits with room for the noise (else the
        largest that fitted), at most `cap`."""
        size = self.trained_size(min(cap, FIRST_TRIAL_ROWS))
        while not self.run(size).fits:
            if size == 1:
                raise ValueError(too_small_message(self.budget_bytes, self.trials[-1], self.data_bytes))
            size = self.trained_size(max(1, size // SECOND_TRIAL_FACTOR))
        self.try_size(self.trained_size(self.second_size(size, cap)))
        while len(self.trials) < MAX_TRIALS:
            size = self.next_size(cap)
            if size is None:
                break
            self.run(size)
        return self.chosen()

    def jumped_above(self, size: int) -> bool:
        """Whether a size above `size` failed by a jump (JUMP above the line
        through the fitting sizes): then peaks jump with the size, and with
        the process, and no line foretells an unmeasured size."""
        return any(t.micro_batch_size > size and not t.fits and self.is_jump(t.micro_batch_size)
                   for t in self.trials)

    def chosen(self) -> int:
        """The largest size chosen by the rule; where the noise seen late
        leaves none, the largest that fitted (it did fit)."""
        return self.best_safe() or max(t.micro_batch_size for t in self.trials if t.fits)

    def next_size(self, cap: int) -> int | None:
        """The next size to try, or `None` when the search is done."""
        best = self.best_safe()
        if best and len(self.trials) >= TYPICAL_TRIALS:
            return None
        above = self.smallest_unsafe_above(best, cap)
        predicted = self.predicted()
        middle = (best + above) // 2
        if predicted is not None and best * (1 + MIN_GAIN) < predicted < above:
            # Below a size that did not fit, the line through lower sizes is no
            # better a guide than bisection: take the larger step of the two.
            target = self.damped(min(cap, predicted))
            if above > cap or target >= middle:
                return self.untried(target, best, above)
        if above <= cap:  # the line points at or past a size that did not fit: bisect
            return self.nearest_untried(middle, best, above) or self.past_noisy(above, cap)
        # Nothing above failed and the line promises under MIN_GAIN more: real
        # curves bend and jump, so look 2 x MIN_GAIN higher while trials remain.
        return self.untried(min(cap, math.ceil(best * (1 + 2 * MIN_GAIN))), best, cap + 1)

    def untried(self, target: int, best: int, above: int) -> int | None:
        """The first size from `target` up that trains as a new size in
        (best, above), if any."""
        tried = {t.micro_batch_size for t in self.trials}
        for size in range(max(target, best + 1), above):
            trained = self.trained_size(size)
            if best < trained < above and trained not in tried:
                return trained
        return None

    def nearest_untried(self, middle: int, best: int, above: int) -> int | None:
        """The untried size nearest `middle` that trains as itself in (best,
        above), the larger on a tie; one that divides the logical batch
        first, where there is one. A logical batch trains only some sizes
        (1024 rows: ..., 103, 114, 128, 147), and the size the middle trains
        as (never above it) sends a bisection between 103 and 147 to 114,
        never to 128 (conv_bn on an Intel Xeon chose 114 of 147 that way).
        A ragged tail is a second shape with its own kernels and buffers:
        small_cnn's 128 rows (8 even micro-batches of 1,024) peaked at
        35.0-56.7 MiB, 114 (9, a tail of 112) at 49.6-67.8 and 103 at
        39.5-55.3 (docs/probe.md), and a bisection between 64 and 171 went
        to 114, 0.89x of 128, over the budget in 2 of 9 processes."""
        tried = {t.micro_batch_size for t in self.trials}
        logical = self.logical_batch_size
        even = [m for m in range(best + 1, above) if logical and logical % m == 0 and m not in tried]
        if even:
            return min(even, key=lambda m: (abs(m - middle), -m))
        for distance in range(max(middle - best, above - middle)):
            for size in (middle + distance, middle - distance):
                if best < size < above and size not in tried and self.trained_size(size) == size:
                    return size
        return None

    def past_noisy(self, above: int, cap: int) -> int | None:
        """Where nothing is left to try below `above`, a size that fitted
        without room for its noise, the next size up (below the next size
        not chosen): its steps fitting says nothing of a larger size's,
        whose peaks need not be higher (small_cnn: 114 rows at 49.6-67.8 MiB,
        128 at 35.0-56.7). `None` where `above` did not fit."""
        trial = next((t for t in self.trials if t.micro_batch_size == above), None)
        if trial is None or not trial.fits:
            return None
        return self.untried(above + 1, above, self.smallest_unsafe_above(above, cap))

    def smallest_unsafe_above(self, best: int, cap: int) -> int:
        """The smallest tried size above `best` that is not chosen by the
        rule, else `cap + 1`: the search looks below it. The largest of them
        is passed once where its peak is a jump (JUMP above the line through
        the fitting sizes, within FAR x `best`): a kernel's scratch space at
        that size, which says nothing of the sizes above it. Farther out, a
        line through lower sizes is no judge of a jump."""
        unsafe = sorted(t.micro_batch_size for t in self.trials
                        if t.micro_batch_size > best and not self.safe(t))
        for index, size in enumerate(unsafe):
            if index + 1 < len(unsafe) or size > FAR * best or not self.is_jump(size):
                return size
        return cap + 1

    def is_jump(self, size: int) -> bool:
        memory_model = self.memory_model()
        trial = next(t for t in self.trials if t.micro_batch_size == size)
        if memory_model is None or trial.peak_bytes is None:
            return False
        return trial.mean_peak_bytes > (1 + JUMP) * memory_model.peak_bytes(size)

    def second_size(self, first: int, cap: int) -> int:
        """A second size far enough from the first for a good slope: 90% of
        budget / (first peak per row), at least SECOND_TRIAL_FACTOR x the
        first (peak / rows over-counts a row's cost, so this is low)."""
        trial = self.trials[-1]
        if not trial.peak_bytes:
            return min(cap, first * SECOND_TRIAL_FACTOR)
        estimate = int(0.9 * self.budget_bytes * first / trial.peak_bytes)
        return min(cap, max(first * SECOND_TRIAL_FACTOR, estimate))

    def predicted(self) -> int | None:
        """The largest size the line through the two largest fitting trials
        allows with room for the noise and the margin (`None` without two)."""
        memory_model = self.memory_model()
        if memory_model is None:
            return None
        room = self.budget_bytes / (1 + NOISE_SIGMAS * self.noise())
        return memory_model.largest_fitting(room, MARGIN)

    def damped(self, target: int) -> int:
        """A target far beyond every measured size, pulled back
        EXTRAPOLATED_SHARE of the way from the chosen size: a line is least
        sure far from its points."""
        measured = max(t.micro_batch_size for t in self.trials if t.peak_bytes is not None)
        if target <= FAR * measured:
            return target
        best = self.best_safe()
        return best + math.ceil(EXTRAPOLATED_SHARE * (target - best))

    def fastest(self, largest: int) -> int:
        """The fitting size with the best samples/s, after up to three more
        powers of two below `largest`."""
        smallest = min(t.micro_batch_size for t in self.trials if t.fits)
        tried = {t.micro_batch_size for t in self.trials}
        powers = [2**k for k in range(32) if smallest < 2**k < largest and 2**k not in tried]
        for size in powers[-3:]:
            self.run(size)
        fitting = [t for t in self.trials if t.fits]
        return max(fitting, key=lambda t: t.samples_per_second).micro_batch_size

    def best_safe(self) -> int:
        return max((t.micro_batch_size for t in self.trials if self.safe(t)), default=0)

    def noise(self, size: int | None = None) -> float:
        """The relative standard deviation of one step's peak at `size`
        (default: the largest fitting size), pooled over the measured steps
        of the fitting trials within NEIGHBOURS x of it, itself included:
        the spread differs by size (the kernels, the tail, the share of the
        fixed part), so a size's room comes from the steps measured at and
        near it, not from a noisy size far from it; a size that does not
        fit, often one where the kernels jump, says nothing of the sizes
        that do. 0 before two steps of one such trial are known."""
        measured = [t for t in self.trials if t.fits and len(t.step_peaks) > 1]
        if not measured:
            return 0.0
        if size is None:
            size = max(t.micro_batch_size for t in measured)
        near = [np.asarray(t.step_peaks) / np.mean(t.step_peaks) for t in measured
                if size <= NEIGHBOURS * t.micro_batch_size and t.micro_batch_size <= NEIGHBOURS * size]
        if not near:
            return 0.0
        squares = sum(float(np.sum((r - 1.0) ** 2)) for r in near)
        return math.sqrt(squares / sum(len(r) - 1 for r in near))

    def safe(self, trial: Any) -> bool:
        """Fits, and keeps fitting: its mean peak plus NOISE_SIGMAS pooled
        standard deviations within the budget."""
        if not trial.fits:
            return False
        limit = self.budget_bytes / (1 + NOISE_SIGMAS * self.noise(trial.micro_batch_size))
        return trial.mean_peak_bytes <= limit

    def memory_model(self) -> MemoryModel | None:
        """The line through the two largest fitting trials (their mean peaks)."""
        fitting = sorted((t for t in self.trials if t.fits), key=lambda t: t.micro_batch_size)
        if len({t.micro_batch_size for t in fitting}) < 2:
            return None
        top = fitting[-2:]
        return MemoryModel.fit([t.micro_batch_size for t in top], [t.mean_peak_bytes for t in top])

    def try_size(self, size: int) -> None:
        if size not in {t.micro_batch_size for t in self.trials}:
            self.run(size)

    def run(self, size: int) -> Any:
        trial = self.runner(size)
        self.trials.append(trial)
        return trial

