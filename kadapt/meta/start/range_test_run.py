"""`RangeTestRun`: a `RangeTestStart` run on the model before the first step, and what it did.

`run_range_test` runs the test from the model's state (which the test puts
back), then lets the start's rule move the rate: its judge's branches
(`kadapt.meta.start.start_judge`, `kadapt.meta.start.branch_trials`) or, with
`judge="always"`, the distance to the suggestion. It returns a frozen
`RangeTestRun`: the steps to charge to the run, the suggestion the meta-model
sees from then on, the rate set (if any) and what to log. The `MetaAdjuster`
counts the steps and logs the run; nothing here knows of `fit`.
"""

from __future__ import annotations

import dataclasses
import math

import keras

from kadapt.batching.training_state import restore
from kadapt.meta.model import actions as action_lib
from kadapt.meta.start.branch_trials import branch_scores
from kadapt.meta.start.range_test_start import RangeTestStart
from kadapt.meta.start.start_judge import SPREAD
from kadapt.optimizers.live_rate import learning_rate_multiplier
from kadapt.optimizers.live_rate import set_learning_rate_multiplier
from kadapt.optimizers.live_variables import applied_learning_rate


@dataclasses.dataclass(frozen=True)
class RangeTestRun:
    """What starting from the range test did.

    Args:
        action: String. `"keep"`, or the move, e.g. `"range test: lr x0.1"`.
        detail: Dict. What the test (and the judge's branches) found, and why
            the rate was kept: the decision log's `"range_test"` entry.
        steps: Int. Steps the test and the branches trained, to be charged to
            the run. Defaults to `0`.
        suggestion: Float or `None`. The test's rate, as the meta-model sees
            it (the live rate where the judge's branches refuted the reading,
            `StartJudge.refutes`); `None` where the curve gave none or the
            test did not run. Defaults to `None`.
        learning_rate: Float or `None`. The rate the optimizer applies now,
            where it was moved; `None` where it was kept. Defaults to `None`.
        kept: Int. Of `steps`, those of the branch the run goes on from
            (`RangeTestStart(continue_branch=True)`): trained, not undone, so
            not charged. Defaults to `0`.
        continued_from: Float or `None`. The rate of the branch the run goes
            on from; `None` where the state before the branches was put back.
            Defaults to `None`.
    """

    action: str
    detail: dict
    steps: int = 0
    suggestion: float | None = None
    learning_rate: float | None = None
    kept: int = 0
    continued_from: float | None = None


def run_range_test(start: RangeTestStart, model: keras.Model, budget: int | None) -> RangeTestRun:
    """Runs `start`'s range test on `model`, and moves the rate as the start's judge rules.

    Args:
        start: `kadapt.meta.RangeTestStart`. The test, its data and its rule.
        model: A compiled, built `keras.Model`: left as it was, but for its rate.
        budget: Int or `None`. The run's steps (`epochs x steps per epoch`).

    Example:

    ```python
    run = run_range_test(RangeTestStart(x, y, batch_size=32), model, budget=600)
    run.action, run.steps  # e.g. "range test: lr x0.01", 142
    ```
    """
    num_steps = start.num_steps(budget)
    if num_steps is None:
        return RangeTestRun("keep", {"why": f"no room for a range test in a budget of {budget} steps"})
    live = applied_learning_rate(model.optimizer)
    try:
        result = start.run(model, num_steps)
    except ValueError as error:
        # A curve no rate can be read off: the test ran (up to num_steps), the rate stays.
        return RangeTestRun("keep", {"why": str(error), "learning_rate": live}, num_steps)
    steps, suggestion = result.steps_run, float(result.suggestion)
    detail = {"suggestion": result.suggestion, "steps_run": result.steps_run, "learning_rate": live}
    settable = action_lib.can_adjust_learning_rate(model.optimizer)
    kept = 0  # steps of a branch the run goes on from
    if start.judge is None:
        rate = start.choose(live, result.suggestion)
        why = f"within {start.factor:g}x of the suggestion"
    if not settable:
        rate, why = None, "the optimizer's rate cannot be set live"
    elif start.judge is not None:
        rate, why, judged, branch_steps, kept = _judge_start(start, model, live, result.suggestion, budget)
        detail.update(judged)
        steps += branch_steps
    continued = detail.get("continued_from")
    if detail.get("suggestion_refuted"):  # the live rate beat it: the meta-model sees the live rate as the test's
        suggestion = live
    if rate is None:
        return RangeTestRun("keep", {**detail, "why": why}, steps, suggestion, kept=kept, continued_from=continued)
    if continued is None:  # else the branch's end holds the rate
        apply_rate(model.optimizer, live, rate)
    return RangeTestRun(f"range test: lr x{rate / live:.3g}", detail, steps, suggestion, rate, kept, continued)


def apply_rate(optimizer: keras.optimizers.Optimizer, live: float, rate: float) -> None:
    """Makes `optimizer` apply `rate` where it applies `live` now: through its live multiplier
    (which keeps a schedule's shape), or as its float rate."""
    multiplier = learning_rate_multiplier(optimizer)
    if multiplier is not None:
        set_learning_rate_multiplier(optimizer, float(keras.ops.convert_to_numpy(multiplier)) * rate / live)
    else:
        optimizer.learning_rate = rate


def _judge_start(start, model, live, suggestion, budget):
    """Branches from the state now at each candidate rate and returns the judge's rate (`None`:
    keep), why it kept, the candidates' scores to log, the branches' steps, and those of them
    the run keeps: with `continue_branch`, it goes on from the end of the chosen rate's branch
    (the live rate's where it is kept), its steps trained, not lost."""
    judge = start.judge
    rates = judge.candidates(live, suggestion)
    if rates == (live,):  # the suggestion is within SPREAD of the live rate: nothing to judge, nothing charged
        return None, f"within {SPREAD:g}x of the suggestion", {}, 0, 0
    steps = judge.steps_per_branch(budget, len(rates))
    if steps < 1:
        return None, f"no room for branches in a budget of {budget} steps", {}, 0, 0
    try:
        train, held = start.branch_batches(steps, judge.held_batches)
    except ValueError as error:
        return None, str(error), {}, 0, 0
    optimizer = model.optimizer
    trials = branch_scores(model, rates, lambda rate: apply_rate(optimizer, live, rate), train, held,
                           keep_ends=start.continue_branch)
    chosen = judge.choose(live, trials.start, trials.scores)
    judged = {"branch_steps": steps, "held_batches": len(held), "held_loss": _json_number(trials.start),
              "branches": [{"learning_rate": rate, "held_loss": _json_number(score)}
                           for rate, score in trials.scores.items()]}
    if chosen is None and judge.refutes(live, trials.start, trials.scores, suggestion):
        judged["suggestion_refuted"] = True
    end = trials.ends.get(live if chosen is None else chosen)
    if end is not None:  # its steps are the run's: trained, not lost
        restore(end)
        judged["continued_from"] = live if chosen is None else chosen
    why = f"no candidate's gain in held loss more than {1 + judge.margin:g}x the live rate's"
    return chosen, why, judged, steps * len(rates), 0 if end is None else steps


def _json_number(value):
    return float(value) if math.isfinite(value) else None
