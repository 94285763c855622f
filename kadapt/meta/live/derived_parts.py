"""What the `MetaAdjuster` derives from the rows `fit` trains on (`FitRows`), where none was given.

Four parts need data a callback is not shown: the dead-run rescue's rule (the
chance level: the compiled loss of the best constant prediction on the
targets, `compiled_chance_loss`), the rescue's range test, and the judged
restart's and the too-high-rate check's branch and held rows. Each is built from the first epoch's sample;
where one cannot be, the part is off and one line says which, why and how to
turn it on (the rescue still acts on a divergence without its chance level).
"""

from __future__ import annotations

import math
from typing import Any

from kadapt.batching.logical_batch_loss import LogicalBatchLoss
from kadapt.meta.live.chance_loss import compiled_chance_loss
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.meta.live.fit_rows import FitRows
from kadapt.meta.live.high_rate import HighRateCheck
from kadapt.meta.live.restart_trial import RestartTrial
from kadapt.meta.start.range_test_start import RangeTestStart

CHANCE_OFF = ("MetaAdjuster: the dead-run rescue's at-chance rule is off: {why}. Pass chance_loss=<the loss of "
              "the best constant prediction> to turn it on (a divergence is still rescued).")
RESCUE_OFF = ("MetaAdjuster: the dead-run rescue is off: each worker of a multi-worker strategy would act on its "
              "own rows. Pass rescue=kadapt.meta.DeadRunRescue(...) built on the whole data to turn it on.")
HIGH_RATE_OFF = ("MetaAdjuster: the too-high-rate check is off: {why}. Pass high_rate=kadapt.meta.HighRateCheck(x, y, "
                 "batch_size=...) to turn it on.")
HIGH_RATE_SHORT = ("a branch would train under 10 steps (one epoch's, at most {share:g} of the budget; more epochs "
                   "or a larger `share` give it room)")
RESTART_OFF = ("MetaAdjuster: the judged restart is off: {why}. Pass restart_trial=kadapt.meta.RestartTrial(x, y, "
               "batch_size=...) to turn it on.")


def chance_rule(loss: Any, rows: FitRows) -> tuple[DeadRunRule, str | None]:
    """`(rule, line)`: the rescue's rule at the chance level of `loss` on the sampled targets,
    or, where that cannot be derived, one without the at-chance signature and the line saying so."""
    sample = rows.arrays()
    if sample is None:
        return DeadRunRule(math.inf), CHANCE_OFF.format(why=f"fit's targets could not be sampled ({rows.reason})")
    if isinstance(loss, LogicalBatchLoss):  # an accumulating model's: its value is the loss it wraps
        loss = loss.loss
    chance = compiled_chance_loss(loss, sample[1])
    if chance is None:
        if loss is None:
            name = "(none compiled: the model adds its own)"
        elif isinstance(loss, str) or callable(loss):
            name = repr(loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__))
        else:
            name = "of each output"  # a list or dict of losses
        why = (f"the chance level of the loss {name} is unknown (known: Keras' sparse, categorical and binary "
               "cross-entropies, mean squared and mean absolute errors, one output)")
        return DeadRunRule(math.inf), CHANCE_OFF.format(why=why)
    if not (math.isfinite(chance) and chance > 0):
        why = f"the targets fit trained on give a chance level of {chance:.4g} (one class or one value)"
        return DeadRunRule(math.inf), CHANCE_OFF.format(why=why)
    return DeadRunRule(chance), None


def range_test(rows: FitRows, seed: int | None) -> RangeTestStart | None:
    """The rescue's range test on the sampled rows, in fit's batch size; `None` without rows."""
    sample = rows.arrays()
    if sample is None or rows.rows < 2:
        return None
    return RangeTestStart(*sample, batch_size=rows.batch_size, seed=seed)


def restart_trial(rows: FitRows, seed: int | None) -> tuple[RestartTrial | None, str | None]:
    """`(trial, line)`: a judged restart on the sampled rows (its held rows among them: rows the
    run has trained on, so the comparison leans to the run), or `None` and the line saying why not."""
    return _on_rows(RestartTrial, RESTART_OFF, rows, seed)


def high_rate_check(rows: FitRows, seed: int | None) -> tuple[HighRateCheck | None, str | None]:
    """`(check, line)`: the too-high-rate check on the sampled rows (its held rows among them),
    or `None` and the line saying why not."""
    return _on_rows(HighRateCheck, HIGH_RATE_OFF, rows, seed)


def _on_rows(part, off, rows, seed):
    """`part(x, y, batch_size, seed)` on the sampled rows, or `None` and `off` saying why not."""
    sample = rows.arrays()
    if sample is None:
        return None, off.format(why=f"fit's rows could not be sampled ({rows.reason})")
    if rows.rows < 2:
        return None, off.format(why=f"fit trained on {rows.rows} row, and a branch needs 2")
    return part(*sample, batch_size=rows.batch_size, seed=seed), None
