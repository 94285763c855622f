"""`StartJudge`: which rate a run starts from, judged by short branches from its own state.

A range test reads a rate off one sweep; on the held-out tasks that reading
moved well-set rates as readily as mis-set ones (well-set cosine runs unharmed
9 of 18). So the suggestion is not applied blindly: from a snapshot of the
run, each candidate rate trains a few steps on the fit's data and is scored by
the mean loss on a few held batches it did not train on. With `start` the held
loss at the snapshot, a candidate's gain is `start - score(c)`, and the live
rate stays unless one gains clearly more:

    move to argmax_c gain(c)  only if  gain(c) - gain(live) > margin * |gain(live)|

With `blowup` set, where the live rate's held loss rose without blowing up
(to at most `blowup` times `start`): only if gain(c) > margin * |gain(live)|,
the candidate gaining more than the live rate lost. On the held-out GRU
(adding, seed 5) the grid-best 0.164 rose 0.95 -> 1.14 over 10 steps and the
suggestion 0.015 gained 0.02: the first rule moves it. But too-high rates rise
as little (fashion_conv at 0.72, 4-20x its grid-best: 1.07-1.1x), so it is off
by default.

A gain, not the held loss itself, because a few steps at a too-low rate barely
move the loss: on circles (seed 3), 10 steps at 1e-4 and at the suggestion
0.055 ended at 0.7004 and 0.6888 from 0.7005, 1.7% apart in loss and 185-fold
in gain. A diverging branch scores `inf` (gain `-inf`), so a diverging live rate
gives way to any candidate that trains.

The candidates are the live rate, the suggestion and their geometric mean
(one of two within `SPREAD` of each other is dropped): never above both. A
short branch favours the highest rate that does not diverge, which the end of
the run does not (the short-horizon bias of `kadapt.meta.collect`): measured,
ten times the suggestion won the branches on circles from 1e-4, 300 and the
grid-best rate, and those runs ended 1.3-1.5x above the grid-best loss; the
range test's valley is the bound on raising.

This module is the policy: pure functions of rates and scores. The branches
themselves run in `kadapt.meta.start.branch_trials`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from kadapt.validation import check_range

SPREAD = 2.0  # candidates closer than this factor are one candidate
BRANCH_SHARE = 0.2  # at most this share of the run's budget goes to the branches


@dataclasses.dataclass(frozen=True)
class StartJudge:
    """How the range test's suggestion is judged before the run starts from it.

    Args:
        margin: Float >= 0. A candidate replaces the live rate only when its
            gain exceeds the live rate's by more than `margin` times the
            latter's size. Defaults to `1.0` (twice the gain).
        branch_steps: Int >= 1. The most steps each candidate trains. Defaults to `10`.
        held_batches: Int >= 1. The most batches the candidates are scored on. Defaults to `4`.
        blowup: Float > 1 or `None`. With a float, a live rate whose held
            loss ends above `blowup` times the loss at the snapshot (or not
            finite) diverged: any candidate that gains replaces it; one whose
            held loss rose less is only slow to start (a GRU at its grid-best
            rate, 10 steps): a candidate must gain more than `margin` times
            what it lost. `None`: any candidate that gains replaces a live rate
            that lost. Measured on held-out runs, 2.0 kept two well-set runs
            and lost two too-high ones (docs/meta-model.md). Defaults to `None`.
        refute: Bool. Whether a kept live rate whose gain beat the suggestion's
            by the margin stands in for the suggestion in what the meta-model
            sees (`refutes`): the run showed the test's reading wrong, and the
            meta-model's `range_test_gap` would pull the rate toward it. It
            also stops the gap from pulling a kept too-high rate down: measured
            worse on held-out runs (docs/meta-model.md). Defaults to `False`.

    Example:

    ```python
    judge = StartJudge(margin=1.0)
    judge.candidates(live=1e-4, suggestion=0.01)   # (1e-4, 0.01, 0.001)
    judge.choose(1e-4, 2.30, {1e-4: 2.29, 0.01: 0.9, 0.001: 1.8})   # 0.01
    ```
    """

    margin: float = 1.0
    branch_steps: int = 10
    held_batches: int = 4
    blowup: float | None = None
    refute: bool = False

    def __post_init__(self) -> None:
        check_range("margin", self.margin, low=0.0)
        check_range("branch_steps", self.branch_steps, low=1, integer=True)
        check_range("held_batches", self.held_batches, low=1, integer=True)
        if self.blowup is not None:
            check_range("blowup", self.blowup, low=1.0, low_open=True)
        if not isinstance(self.refute, bool):
            raise TypeError(f"Argument `refute` must be True or False. Received: refute={self.refute!r}")

    def candidates(self, live: float, suggestion: float) -> tuple[float, ...]:
        """The rates to branch on, the live rate first (left out where it is not a usable rate)."""
        usable = math.isfinite(live) and live > 0
        proposed = [live, suggestion, math.sqrt(live * suggestion)] if usable else [suggestion]
        kept = []
        for rate in proposed:
            if all(max(rate / other, other / rate) >= SPREAD for other in kept):
                kept.append(rate)
        return tuple(kept)

    def steps_per_branch(self, budget: int | None, num_candidates: int) -> int:
        """Steps each candidate trains: `branch_steps`, or fewer so that all of them together
        take at most `BRANCH_SHARE` of `budget` (`None`: unknown); 0 where not one step fits."""
        if budget is None:
            return self.branch_steps
        return min(self.branch_steps, int(budget * BRANCH_SHARE) // max(num_candidates, 1))

    def choose(self, live: float, start: float, scores: Mapping[float, float]) -> float | None:
        """The rate to move to, or `None` to keep `live`.

        `start` is the held loss at the snapshot; `scores` maps each candidate
        to its held loss after its branch (NaN or inf where it diverged);
        `live` need not be among them (an unusable rate).
        """
        gains = {rate: start - score for rate, score in scores.items() if math.isfinite(score)}
        if not gains or not math.isfinite(start):
            return None
        best = max(gains, key=gains.get)
        if best == live:
            return None
        if live not in gains:  # the live rate diverged, or is not a rate
            return best
        rose = gains[live] < 0 and self.blowup is not None and scores[live] <= self.blowup * start
        if rose:  # it rose, but did not blow up: a candidate must gain more than it lost
            return best if gains[best] > self.margin * -gains[live] else None
        # gain(best) - gain(live) > margin * |gain(live)|, without subtracting an exploding loss's gain
        scale = 1 + self.margin if gains[live] >= 0 else 1 - self.margin
        return best if gains[best] > scale * gains[live] else None

    def refutes(self, live: float, start: float, scores: Mapping[float, float], suggestion: float) -> bool:
        """Whether the branches refute `suggestion`: `refute` is on, the live rate's branch gained
        (`start - score`) and more than `1 + margin` times the suggestion's (or the suggestion's
        diverged). Then the meta-model sees the live rate as the test's rate."""
        if not self.refute or live not in scores or suggestion not in scores or not math.isfinite(start):
            return False
        gain = start - scores[live]
        if not gain > 0:
            return False
        other = start - scores[suggestion] if math.isfinite(scores[suggestion]) else -math.inf
        return gain > (1 + self.margin) * other
