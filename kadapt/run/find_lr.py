"""The `kadapt find-lr` job: a range test on `kadapt train`'s network, data and recipe."""

import dataclasses
import json
from pathlib import Path

import keras
import numpy as np

from kadapt.range_test import RangeTestResult
from kadapt.range_test import find_learning_rate
from kadapt.range_test import curve
from kadapt.recipes import training
from kadapt.recipes.config import command_line_switches
from kadapt.run.config import resolve_config
from kadapt.run.config import schedule_steps
from kadapt.run.data import load_data
from kadapt.run.errors import UsageError
from kadapt.run.networks import build_network
from kadapt.run.train_plan import plan_training

OPTIONS = ("data", "target", "test", "task", "stream", "model", "batch_size", "augment", "validation_split", "seed",
           "train_rows") + tuple(field.name for field in command_line_switches())
RESULT_FILE, PLOT_FILE = "range_test.json", "range_test.png"


def find_rate(options: dict, sweep: dict, out: str | None = None, echo=print) -> RangeTestResult:
    """Runs the range test and echoes the suggestion; with `out`, writes the curve and its plot there.

    Args:
        options: Dict. `kadapt train`'s data, network and recipe options by
            field name (`None`: not given).
        sweep: Dict. `start`, `stop`, `num_steps`, `rule` of `kadapt.find_learning_rate`.
        out: String or `None`. A directory for `range_test.json` and `range_test.png`.
        echo: Callable taking one line.
    """
    config = resolve_config(options)
    data = load_data(config)
    plan = plan_training(config, data)
    config, recipe = plan.config, plan.recipe
    keras.utils.set_random_seed(config.seed)
    model = build_network(plan.network, data, recipe)
    rows = training.expanded(data.x_train, data.train_targets, recipe, data.num_classes, config.seed)
    training.compile_recipe(model, recipe, schedule_steps(config, len(rows[0]))[1], data.task)
    batches = training.shuffled_batches(*rows, config.batch_size, data.num_classes, config.seed)
    try:
        result = find_learning_rate(model, training.augmented_batches(batches.repeat(), recipe, config.seed),
                                    **sweep)
    except ValueError as error:
        raise UsageError(" ".join(str(error).split())) from None
    for line in summary(result, config.batch_size):
        echo(line)
    if out is not None:
        _write(result, Path(out), echo)
    return result


def summary(result: RangeTestResult, batch_size: int) -> list[str]:
    """What the command prints: the suggestion, how the sweep ended, every rule's reading."""
    rates, smoothed = np.array(result.rates), np.array(result.smoothed_losses)
    ending = (f"stopped at divergence at step {result.steps_run}, rate {rates[-1]:.3g}" if result.diverged
              else f"{result.steps_run} steps, no divergence up to {rates[-1]:.3g}")
    rules = ", ".join(f"{rule} {curve.suggest(rates, smoothed, rule, len(rates))[0]:.3g}" for rule in curve.RULES)
    return [f"learning rate {result.suggestion:.4g} ({result.rule}; batch size {batch_size}; {ending})",
            f"rules: {rules}"]


def _write(result, out, echo):
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).write_text(json.dumps(dataclasses.asdict(result), indent=1) + "\n")
    result.plot(out / PLOT_FILE)
    echo(f"wrote {out / RESULT_FILE} and {out / PLOT_FILE}")
