"""`PlanSearch`: the largest micro-batch whose planned peak fits, from few plans.

A plan (XLA's buffers of the compiled step) is the same on every compile, so
the search needs none of `PeakSearch`'s room for noisy peaks: plan
FIRST_PLAN_ROWS, a second size from it, fit peak = a + b * m through the two
highest planned sizes, plan the largest size the line allows with the
probe's margin, and refit through it until the line names a planned size.
Typically three plans; never a size it did not plan.
"""

from __future__ import annotations

from collections.abc import Callable

from kadapt.batching.memory_model import MemoryModel
from kadapt.batching.probe import FIRST_TRIAL_ROWS
from kadapt.batching.probe import MARGIN
from kadapt.batching.probe import SECOND_TRIAL_FACTOR
from kadapt.batching.probe import ProbeTrial
from kadapt.batching.probe import too_small_message

MAX_PLANS = 6  # each one an XLA compile


class PlanSearch:
    """The search policy of the plan-based probe, apart from how sizes are planned.

    Args:
        runner: Callable `size -> ProbeTrial` that plans (or simulates) a size;
            `fits` and `peak_bytes` are read.
        budget_bytes: Int. Peak bytes a planned step may reach and still fit.
        trained_size: Callable `size -> size` or `None`: the micro-batch a
            size trains as (a logical batch split evenly runs
            `balanced_micro_batch(B, m) <= m`), so only sizes that train are
            planned, once each. Defaults to `None` (every size as it is).
    """

    def __init__(self, runner: Callable[[int], ProbeTrial], budget_bytes: int,
                 trained_size: Callable[[int], int] | None = None) -> None:
        self.runner, self.budget_bytes = runner, budget_bytes
        self.trained_size = trained_size or (lambda size: size)
        self.trials = []

    def largest(self, cap: int) -> int:
        """The largest planned size within the budget and the margin, at most `cap`."""
        size = self.trained_size(min(cap, FIRST_TRIAL_ROWS))
        while not self.run(size).fits:
            if size == 1:
                raise ValueError(too_small_message(self.budget_bytes, self.trials[-1]))
            size = self.trained_size(max(1, size // SECOND_TRIAL_FACTOR))
        second = self.trained_size(self.second_size(size, cap))
        if second not in self.planned():
            self.run(second)
        while len(self.trials) < MAX_PLANS:
            target = self.trained_size(self.target(cap))
            if target in self.planned():
                break
            self.run(target)
        target = self.target(cap)
        fitting = [t.micro_batch_size for t in self.trials if t.fits]
        return max([s for s in fitting if s <= target] or fitting)

    def second_size(self, first: int, cap: int) -> int:
        """Budget / (peak per row of the first plan), which under-counts the
        rows that fit (the fixed part is in that peak): at most 90% of it."""
        estimate = int(0.9 * self.budget_bytes * first / self.trials[-1].peak_bytes)
        return min(cap, self.below_failed(cap), max(first + 1, estimate))

    def below_failed(self, cap: int) -> int:
        """The largest size below every planned size that did not fit."""
        return min([t.micro_batch_size for t in self.trials if not t.fits], default=cap + 1) - 1

    def target(self, cap: int) -> int:
        """The line's largest size with the margin, between 1 and `cap`,
        below every planned size that did not fit."""
        model = self.memory_model()
        if model is None:
            return self.trials[-1].micro_batch_size
        return max(1, min(cap, model.largest_fitting(self.budget_bytes, MARGIN), self.below_failed(cap)))

    def memory_model(self) -> MemoryModel | None:
        """The line through the two largest planned sizes (`None` before two)."""
        peaks = {t.micro_batch_size: t.peak_bytes for t in self.trials}
        if len(peaks) < 2:
            return None
        top = sorted(peaks)[-2:]
        return MemoryModel.fit(top, [peaks[size] for size in top])

    def planned(self) -> set:
        return {t.micro_batch_size for t in self.trials}

    def run(self, size: int) -> ProbeTrial:
        trial = self.runner(size)
        self.trials.append(trial)
        return trial
