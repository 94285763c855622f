"""`StartJudge`: which rate a run starts from, judged by short branches from its own state.

A range test reads a rate off one sweep; on the held-out tasks that reading
was 100x low on some (a 40-step sweep on iris) and moved well-set rates as
readily as mis-set ones. So the suggestion is not applied blindly: from a
snapshot of the run, each candidate rate trains a few steps on the fit's data
and is scored by the mean loss on a few held batches it did not train on. The
live rate stays unless a candidate's score is clearly lower:

    keep  unless  min_c score(c) < (1 - margin) * score(live)

A non-finite score (the branch diverged) is worse than any finite one, so a
diverging live rate gives way to any candidate that trains. The candidates
are the live rate, the suggestion, their geometric mean, and ten times the
suggestion (the valley rule read low on most held-out tasks); candidates
within `SPREAD` of one kept before them are dropped.

This module is the policy: pure functions of rates and scores. The branches
themselves run in `kadapt.meta.branch_trials`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from kadapt.validation import check_range

SPREAD = 2.0  # candidates closer than this factor are one candidate
SUGGESTION_BOOST = 10.0  # the valley rule read 2-100x below the grid's best on most held-out tasks
BRANCH_SHARE = 0.2  # at most this share of the run's budget goes to the branches


@dataclasses.dataclass(frozen=True)
class StartJudge:
    """How the range test's suggestion is judged before the run starts from it.

    Args:
        margin: Float in [0, 1). A candidate replaces the live rate only when
            its held loss is below `(1 - margin)` times the live rate's.
            Defaults to `0.1`.
        branch_steps: Int >= 1. The most steps each candidate trains. Defaults to `10`.
        held_batches: Int >= 1. The most batches the candidates are scored on. Defaults to `4`.

    Example:

    ```python
    judge = StartJudge(margin=0.1)
    judge.candidates(live=1e-4, suggestion=0.01)   # (1e-4, 0.01, 0.001, 0.1)
    judge.choose(1e-4, {1e-4: 2.3, 0.01: 0.9, 0.001: 1.8, 0.1: 0.7})   # 0.1
    ```
    """

    margin: float = 0.1
    branch_steps: int = 10
    held_batches: int = 4

    def __post_init__(self) -> None:
        check_range("margin", self.margin, low=0.0, high=1.0, high_open=True)
        check_range("branch_steps", self.branch_steps, low=1, integer=True)
        check_range("held_batches", self.held_batches, low=1, integer=True)

    def candidates(self, live: float, suggestion: float) -> tuple[float, ...]:
        """The rates to branch on, the live rate first (left out where it is not a usable rate)."""
        usable = math.isfinite(live) and live > 0
        proposed = [live, suggestion, math.sqrt(live * suggestion), suggestion * SUGGESTION_BOOST] if usable \
            else [suggestion, suggestion * SUGGESTION_BOOST]
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

    def choose(self, live: float, scores: Mapping[float, float]) -> float | None:
        """The rate to move to, or `None` to keep `live`.

        `scores` maps each candidate to its held loss after its branch (NaN or
        inf where it diverged); `live` need not be among them (an unusable rate).
        """
        finite = {rate: score for rate, score in scores.items() if math.isfinite(score)}
        if not finite:
            return None
        best = min(finite, key=finite.get)
        if best == live:
            return None
        live_score = scores.get(live, math.inf)
        if math.isfinite(live_score) and finite[best] >= (1 - self.margin) * live_score:
            return None
        return best
