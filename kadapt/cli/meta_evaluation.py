"""Judging a meta-model on held-out tasks: the table of `kadapt meta eval MODEL.keras`.

The held-out set was fixed before any result was seen: the families of
`EVALUATION_FAMILIES` (never in the default meta-model's records: an MLP on
iris and on circles, friedman regression, a conv net on Fashion-MNIST images,
a GRU on the adding problem, an autoencoder on Fashion-MNIST), seeds 0-2, SGD
with momentum 0.9, `EPOCHS` epochs of batch 32. Every run of a task-seed
trains the same data, initialization and batch order.

For each task-seed:

- **grid**: the constant rates of `GRID` (8 points, 1e-4 to ~3). The
  grid-best rate is the one with the lowest final validation loss: what 8x the
  compute buys. Where it sits at an end of the grid, rates beyond it are
  added (`GRID_STEP` apart, up to `GRID_WIDENING`) until one is worse.
- **mis-set rates**, from the grid: `too_low` (1e-4, the grid's lowest),
  `too_high` (the lowest grid rate above the best that ends at least
  `MISSET_MARGIN` x the best's loss, finite) and `diverging` (the lowest rate,
  on the grid or above it up to `DIVERGING_LIMIT`, whose constant run ends
  non-finite). On each: `constant` (its grid run), `plateau` (Keras
  `ReduceLROnPlateau(factor=0.3, patience=2)`, tuned), `meta` (the
  `MetaAdjuster` with its defaults) and `meta_range` (the `MetaAdjuster`
  starting from the range test, `RangeTestStart` on the training data; its
  steps charged to the budget).
- **cosine**: a well-configured run, cosine from the grid-best rate to 0,
  without and with the `MetaAdjuster`, and with it starting from the range
  test (`with_range`).
- **range test** (`range_test_runs`): `kadapt.find_learning_rate` (rule
  `"valley"`, up to `RANGE_TEST_STEPS` steps) on the task's fresh model, then
  its rate `constant` and `cosine` (from it to 0); the test's steps are
  charged to the same budget (the run trains that many steps fewer).
- **well-set**: the constant grid-best run with the `MetaAdjuster` starting
  from the range test (`well_set`), beside the grid's own run at that rate.
- **anchors** (`anchor_runs`): the task's optimizer replaced by each of
  `ANCHORS` at its defaults (Schedule-Free AdamW and Prodigy at their
  reference defaults, Keras `Adam()` at 1e-3, Keras' own `ScheduleFreeAdamW`
  and `Muon`), same data, initialization,
  batches and epochs. They do not depend on the mis-set rate: one run each
  per task-seed.

`summarize` turns the runs into the table, against `TARGETS` (the first
adjuster's) and `RANGE_TARGETS` (issue 46's, for the adjuster starting from
the range test).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from kadapt import optimizers
from kadapt.callbacks import ScheduleFreeEvaluation
from kadapt.meta import DeadRunRescue
from kadapt.meta.live.adjuster import MetaAdjuster
from kadapt.meta.live.chance_loss import chance_loss
from kadapt.meta.live.chance_loss import regression_chance_loss
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.meta.live.restart_trial import RestartTrial
from kadapt.meta.records import tasks as task_lib
from kadapt.meta.start.range_test_start import RangeTestStart
from kadapt.range_test import find_learning_rate
from kadapt.range_test.find import MIN_STEPS
from kadapt.recipes.training import steps_per_epoch

EVALUATION_FAMILIES = ("iris", "circles", "friedman", "fashion_conv", "adding", "fashion_autoencoder")
SEEDS = (0, 1, 2)
EPOCHS = 20
MOMENTUM = 0.9
GRID = tuple(float(f"{rate:.3g}") for rate in np.logspace(-4, 0.5, 8))  # 1e-4 ... 3.16
GRID_STEP = 10 ** (4.5 / 7)  # the grid's spacing, ~4.4x
GRID_WIDENING = 3  # rates added at most beyond an end of the grid where the best sits
DIVERGING_LIMIT = (10.0, 30.0, 100.0, 300.0, 1000.0)
MISSET_MARGIN = 1.2
SETTINGS = ("too_low", "too_high", "diverging")
TARGETS = {  # name: (sense, target, what it measures)
    "near_grid_best": (">=", 0.75, "mis-set runs ending within 1.5x of the grid-best final val loss"),
    "beats_plateau": (">=", 0.85, "mis-set runs ending below tuned ReduceLROnPlateau"),
    "harm": ("<=", 0.0, "mis-set runs ending > 1.1x worse than the constant rate"),
    "rescue": (">=", 1.0, "diverging runs ending finite, below the initial val loss"),
    "cosine_no_harm": (">=", 1.0, "good cosine runs ending <= 1.05x the run without it"),
}
RANGE_TEST_STEPS = 100
RANGE_NEAR = 1.2  # "within 1.2x of the grid-best final val loss", the figure for the range test
WELL_SET_HARM = 1.05  # a well-set run "harmed": its final val loss above this times the run without the adjuster
RANGE_TARGETS = {  # name: (sense, target, what it measures), for the MetaAdjuster starting from the range test
    "near_grid_best": (">=", 0.80, f"mis-set runs ending within {RANGE_NEAR}x of the grid-best final val loss"),
    "beats_range_constant": (">=", 0.60, "mis-set runs ending below range test then constant (equal compute)"),
    "beats_anchors": (">=", 0.60, "mis-set runs ending below the best of the anchors the run ran (ANCHORS)"),
    "well_set_harm": ("<=", 0.0, f"well-set runs (constant and cosine at the grid-best) ending > {WELL_SET_HARM}x "
                                 "worse than without the adjuster"),
    "rescue": (">=", 1.0, "diverging runs ending finite, below the initial val loss"),
    "harm": ("<=", 0.0, "mis-set runs ending > 1.1x worse than the constant rate"),
    "cosine_no_harm": (">=", 1.0, f"good cosine runs ending <= {WELL_SET_HARM}x the run without it"),
}
ANCHORS = {  # the learning-rate-free and default arms, at their defaults: name -> optimizer factory
    "schedule_free_adamw": optimizers.ScheduleFreeAdamW,
    "prodigy": optimizers.Prodigy,
    "adam": lambda: keras.optimizers.Adam(),
    # Keras' own (3.14+ and 3.10+): its Schedule-Free AdamW evaluates at the training point y; its Muon
    # orthogonalizes the 2-D kernels and steps every other variable with AdamW
    "keras_schedule_free_adamw": lambda: keras.optimizers.ScheduleFreeAdamW(),
    "keras_muon": lambda: keras.optimizers.Muon(),
}
ANCHOR_NAMES = {"schedule_free_adamw": "Schedule-Free AdamW", "prodigy": "Prodigy", "adam": "Adam",
                "keras_schedule_free_adamw": "Keras' Schedule-Free AdamW", "keras_muon": "Keras' Muon"}
QUICK = {"families": ("iris", "adding"), "seeds": (0,), "epochs": 6}


class StopWhenNonFinite(keras.callbacks.Callback):
    """Ends a run once its weights are NaN/Inf: from there every step keeps them so."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not all(np.all(np.isfinite(v.numpy())) for v in self.model.trainable_variables):
            self.model.stop_training = True


def evaluation_task(family: str, seed: int, learning_rate: float, schedule: str = "constant") -> task_lib.Task:
    """The held-out task: `family`'s data and model for `seed`, SGD with momentum 0.9."""
    task = task_lib.make_task(family, seed, learning_rate, "sgd", schedule)
    return dataclasses.replace(task, momentum=MOMENTUM)


def reordered(task: task_lib.Task, order: int) -> task_lib.Task:
    """`task` with its training rows permuted (permutation `order` of a NumPy generator seeded
    by the task's seed): the same data, initialization and rate, the batches in another order."""
    x, y, x_val, y_val = task.data
    rows = np.random.default_rng([task.seed, order]).permutation(len(x))
    return dataclasses.replace(task, data=(x[rows], y[rows], x_val, y_val))


class StopAfterSteps(keras.callbacks.Callback):
    """Ends a run after `steps` optimizer steps (a budget that is not whole epochs)."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps, self.done = steps, 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.done += 1
        if self.done >= self.steps:
            self.model.stop_training = True


def train_run(task: task_lib.Task, epochs: int, callbacks: Sequence[keras.callbacks.Callback] = (),
              steps: int | None = None,
              optimizer: Callable[[], keras.optimizers.Optimizer] | None = None) -> dict[str, Any]:
    """Trains `task` for `epochs` (or the first `steps` of them) with `callbacks`;
    its final validation loss and wall time. A schedule spans the steps trained.
    `optimizer` (a factory) replaces the task's."""
    total = epochs * steps_per_epoch(len(task.data[0]), task.batch_size)
    model = task.build(total if steps is None else steps)
    if optimizer is not None:
        model.compile(optimizer=optimizer(), loss=task.make_loss(), jit_compile=False)
        model.optimizer.build(model.trainable_variables)
        callbacks = [*callbacks, ScheduleFreeEvaluation()]  # fit's validation at x (Schedule-Free); else nothing
    x, y, x_val, y_val = task.data
    keras.utils.set_random_seed(task.seed)  # the same batch order for every run of a task
    start = time.perf_counter()
    callbacks = [*callbacks, StopWhenNonFinite(), *([StopAfterSteps(steps)] if steps is not None else [])]
    model.fit(x, y, validation_data=(x_val, y_val), batch_size=task.batch_size, epochs=epochs, verbose=0,
              callbacks=callbacks)
    seconds = time.perf_counter() - start
    loss = float(model.evaluate(x_val, y_val, batch_size=256, verbose=0))
    if not all(np.all(np.isfinite(v.numpy())) for v in model.trainable_variables):
        loss = math.nan
    return {"val_loss": loss, "seconds": seconds}


def meta_run(task: task_lib.Task, epochs: int, meta_model: str | os.PathLike | keras.Model,
             rescue: bool = False, **adjuster_options: Any) -> dict[str, Any]:
    """The `MetaAdjuster` on `task`; with `rescue`, its dead-run rescue part as `kadapt train`
    builds it (`task_rescue`), else none: its actions are in the result's `"rescues"`."""
    adjuster = MetaAdjuster(meta_model, monitor="val_loss", verbose=0,
                            **{"restart_trial": restart_trial(task), **adjuster_options},
                            rescue=task_rescue(task) if rescue else False)
    result = train_run(task, epochs, [adjuster])
    kept = ("epoch", "trigger", "action", "predicted_gain", "range_test", "restart_trial")  # the judges' scores
    rescued = {id(d) for d in adjuster.rescue.decisions} if rescue else set()
    result["decisions"] = [{key: d[key] for key in kept if key in d} for d in adjuster.decisions if id(d) not in rescued]
    if rescue:
        result["rescues"] = [{key: d[key] for key in ("epoch", "trigger", "reason") if key in d}
                             for d in adjuster.rescue.decisions]
    return result


def task_rescue(task: task_lib.Task) -> DeadRunRescue:
    """The rescue part on `task` as `kadapt train` builds it (`kadapt.run.callbacks.dead_run_rescue`):
    `DeadRunRule` at the constant predictor's loss on the training targets, a new rate from a range
    test on the training rows (`range_start`), the validation loss watched."""
    y = task.data[1]
    if task.regression:
        chance = regression_chance_loss(y)
    else:
        chance = chance_loss(y, int(np.max(y)) + 1)
    return DeadRunRescue(DeadRunRule(chance), monitor="val_loss", range_test=range_start(task), verbose=False)


def restart_trial(task: task_lib.Task) -> RestartTrial:
    """The data a judged restart trains and scores its branch on, as `kadapt train` gives it
    (`kadapt.run.callbacks.self_tuning`): the training rows, the validation rows held."""
    x, y, x_val, y_val = task.data
    return RestartTrial(x, y, validation_data=(x_val, y_val), batch_size=task.batch_size, seed=task.seed)


def range_start(task: task_lib.Task) -> RangeTestStart:
    """The `MetaAdjuster`'s range test on `task`'s training data: the batches `range_test_runs` sweeps."""
    x, y = task.data[:2]
    return RangeTestStart(x, y, batch_size=task.batch_size, max_steps=RANGE_TEST_STEPS, seed=task.seed)


def plateau_run(task: task_lib.Task, epochs: int) -> dict[str, Any]:
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.3, patience=2, verbose=0)
    return train_run(task, epochs, [plateau])


def range_test_runs(family: str, seed: int, epochs: int) -> dict[str, Any]:
    """The range test on the task's fresh model, then its rate constant and under cosine.

    The test's steps come out of the run's budget of `epochs` epochs.
    Returns `{"learning_rate", "steps_run", "constant", "cosine"}`.
    """
    task = evaluation_task(family, seed, GRID[0])  # the test sets its own rates
    x, y = task.data[:2]
    budget = epochs * steps_per_epoch(len(x), task.batch_size)
    num_steps = min(RANGE_TEST_STEPS, budget // 2)  # at least half the budget trains
    if num_steps < MIN_STEPS:
        return None
    keras.utils.set_random_seed(seed)
    try:
        result = find_learning_rate(task.build(budget), _endless_batches(x, y, task.batch_size, seed),
                                    num_steps=num_steps)
    except ValueError as error:  # a curve no rate can be read off: the arm fails
        failed = {"val_loss": math.nan, "seconds": 0.0, "error": str(error)}
        return {"learning_rate": math.nan, "steps_run": num_steps, "constant": failed, "cosine": failed}
    left = budget - result.steps_run
    runs = {schedule: train_run(evaluation_task(family, seed, result.suggestion, schedule), epochs, steps=left)
            for schedule in ("constant", "cosine")}
    return {"learning_rate": result.suggestion, "steps_run": result.steps_run, **runs}


def anchor_runs(family: str, seed: int, epochs: int) -> dict[str, Any]:
    """The task trained with each of `ANCHORS` in place of its optimizer, at its defaults."""
    task = evaluation_task(family, seed, GRID[0])  # the rate is the anchor's own
    return {name: train_run(task, epochs, optimizer=factory) for name, factory in ANCHORS.items()}


def _endless_batches(x, y, batch_size, seed):
    """Shuffled batches of `(x, y)`, one epoch after another."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            rows = order[start:start + batch_size]
            yield x[rows], y[rows]


def evaluate_task(family: str, seed: int, meta_model: str | os.PathLike | keras.Model, epochs: int = EPOCHS,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every arm on one task-seed: `{"grid", "best_rate", "initial_val_loss", "settings", "cosine"}`."""
    say = progress or (lambda text: None)
    grid = {rate: train_run(evaluation_task(family, seed, rate), epochs) for rate in GRID}
    finite = _widened(grid, family, seed, epochs)
    best = min(finite, key=finite.get)
    say(f"{family}/{seed} grid best lr={best:g} val_loss={finite[best]:.4g}")
    rates = {"too_low": GRID[0] if finite.get(GRID[0], math.inf) >= MISSET_MARGIN * finite[best] else None,
             "too_high": next((r for r in GRID if r > best and finite.get(r, -math.inf) >= MISSET_MARGIN * finite[best]),
                              None),
             "diverging": next((r for r in GRID if r not in finite), None)}
    for rate in DIVERGING_LIMIT if rates["diverging"] is None else ():
        grid.setdefault(rate, train_run(evaluation_task(family, seed, rate), epochs))
        if not math.isfinite(grid[rate]["val_loss"]):
            rates["diverging"] = rate
            break
    untrained = evaluation_task(family, seed, best)
    initial = float(untrained.build().evaluate(untrained.data[2], untrained.data[3], batch_size=256, verbose=0))
    settings = {}
    for setting, rate in rates.items():
        if rate is None:
            say(f"{family}/{seed} {setting}: no such rate on the grid")
            continue
        task = evaluation_task(family, seed, rate)
        settings[setting] = {"learning_rate": rate, "constant": grid[rate],
                             "plateau": plateau_run(task, epochs), "meta": meta_run(task, epochs, meta_model),
                             "meta_range": meta_run(task, epochs, meta_model, range_test=range_start(task))}
        say(f"{family}/{seed} {setting} lr={rate:g}: " + ", ".join(
            f"{arm} {settings[setting][arm]['val_loss']:.4g}" for arm in ("constant", "plateau", "meta", "meta_range")))
    cosine_task = evaluation_task(family, seed, best, "cosine")
    cosine = {"without": train_run(cosine_task, epochs), "with": meta_run(cosine_task, epochs, meta_model),
              "with_range": meta_run(cosine_task, epochs, meta_model, range_test=range_start(cosine_task))}
    say(f"{family}/{seed} cosine at lr={best:g}: without {cosine['without']['val_loss']:.4g}, "
        f"with {cosine['with']['val_loss']:.4g}, with the range test {cosine['with_range']['val_loss']:.4g}")
    well_task = evaluation_task(family, seed, best)
    well_set = {"without": grid[best], "with_range": meta_run(well_task, epochs, meta_model,
                                                              range_test=range_start(well_task))}
    say(f"{family}/{seed} constant at lr={best:g}: without {well_set['without']['val_loss']:.4g}, "
        f"with the range test {well_set['with_range']['val_loss']:.4g}")
    anchors = anchor_runs(family, seed, epochs)
    say(f"{family}/{seed} anchors: " + ", ".join(f"{name} {run['val_loss']:.4g}" for name, run in anchors.items()))
    ranged = range_test_runs(family, seed, epochs)
    if ranged is None:
        say(f"{family}/{seed} range test: no room in {epochs} epochs")
    else:
        say(f"{family}/{seed} range test lr={ranged['learning_rate']:.3g} ({ranged['steps_run']} steps): "
            f"constant {ranged['constant']['val_loss']:.4g}, cosine {ranged['cosine']['val_loss']:.4g}")
    return {"family": family, "seed": seed, "grid": {f"{rate:g}": run for rate, run in grid.items()},
            "best_rate": best, "best_val_loss": finite[best], "initial_val_loss": initial,
            "settings": settings, "cosine": cosine, "range_test": ranged, "well_set": well_set, "anchors": anchors}


def rerun_range_start(run: dict[str, Any], meta_model: str | os.PathLike | keras.Model, epochs: int = EPOCHS,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`run` (an `evaluate_task` result) with its range-test-start arms run again with `meta_model`:
    each mis-set setting's `meta_range`, the cosine `with_range` and the well-set `with_range`. The
    other arms are deterministic and do not depend on how the start or the moves to the
    suggestion behave (the MetaAdjuster alone has no suggestion), so they are kept."""
    say = progress or (lambda text: None)
    family, seed, best = run["family"], run["seed"], run["best_rate"]
    run = copy.deepcopy(run)
    for setting, case in run["settings"].items():
        task = evaluation_task(family, seed, case["learning_rate"])
        case["meta_range"] = meta_run(task, epochs, meta_model, range_test=range_start(task))
        say(f"{family}/{seed} {setting} lr={case['learning_rate']:g}: meta_range {case['meta_range']['val_loss']:.4g}")
    cosine_task = evaluation_task(family, seed, best, "cosine")
    run["cosine"]["with_range"] = meta_run(cosine_task, epochs, meta_model, range_test=range_start(cosine_task))
    well_task = evaluation_task(family, seed, best)
    run["well_set"]["with_range"] = meta_run(well_task, epochs, meta_model, range_test=range_start(well_task))
    say(f"{family}/{seed} at lr={best:g}: cosine with the range test {run['cosine']['with_range']['val_loss']:.4g}, "
        f"constant with the range test {run['well_set']['with_range']['val_loss']:.4g}")
    return run


def _widened(grid, family, seed, epochs):
    """The finite final losses of `grid`, after adding rates beyond an end where the best sits there."""
    for _ in range(GRID_WIDENING + 1):
        finite = {rate: run["val_loss"] for rate, run in grid.items() if math.isfinite(run["val_loss"])}
        if not finite:
            raise RuntimeError(f"{family} seed {seed}: every grid rate diverged; the task is broken.")
        best = min(finite, key=finite.get)
        beyond = best / GRID_STEP if best == min(grid) else best * GRID_STEP if best == max(grid) else None
        if beyond is None or len(grid) >= len(GRID) + GRID_WIDENING:
            return finite
        beyond = float(f"{beyond:.3g}")
        grid[beyond] = train_run(evaluation_task(family, seed, beyond), epochs)
    return finite


def evaluate_meta_model(meta_model: str | os.PathLike | keras.Model, families: Sequence[str] = EVALUATION_FAMILIES,
                        seeds: Sequence[int] = SEEDS, epochs: int = EPOCHS,
                        progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """All arms on every held-out task-seed; the runs for `summarize`."""
    return [evaluate_task(family, seed, meta_model, epochs, progress) for family in families for seed in seeds]


def _key(loss):
    return loss if math.isfinite(loss) else math.inf


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The target figures over all runs, and per setting: `{"all": {...}, "too_low": {...}, ...}`."""
    def figures(cases):
        near = [_key(c["meta"]["val_loss"]) <= 1.5 * r["best_val_loss"] for r, c in cases]
        beats = [_key(c["meta"]["val_loss"]) < _key(c["plateau"]["val_loss"]) for r, c in cases]
        harm = [_key(c["meta"]["val_loss"]) > 1.1 * _key(c["constant"]["val_loss"]) for r, c in cases]
        diverged = [(r, c) for r, c in cases if not math.isfinite(c["constant"]["val_loss"])]
        rescued = [math.isfinite(c["meta"]["val_loss"]) and c["meta"]["val_loss"] < r["initial_val_loss"]
                   for r, c in diverged]
        return {"runs": len(cases), "near_grid_best": _mean(near), "beats_plateau": _mean(beats),
                "harm": _mean(harm), "rescue": _mean(rescued), "diverged_runs": len(diverged)}

    cases = [(r, c) for r in runs for c in r["settings"].values()]
    report = {"all": figures(cases)}
    for setting in SETTINGS:
        report[setting] = figures([(r, r["settings"][setting]) for r in runs if setting in r["settings"]])
    cosine = [_key(r["cosine"]["with"]["val_loss"]) <= 1.05 * _key(r["cosine"]["without"]["val_loss"])
              for r in runs]
    report["all"]["cosine_no_harm"] = _mean(cosine)
    report["all"]["cosine_runs"] = len(cosine)
    report["range_test"] = _range_figures(runs)
    report["meta_range"] = {setting: _meta_range_figures(runs, setting) for setting in ("all", *SETTINGS)}
    cosine = [_key(r["cosine"]["with_range"]["val_loss"]) <= 1.05 * _key(r["cosine"]["without"]["val_loss"])
              for r in runs if "with_range" in r["cosine"]]
    report["meta_range"]["all"].update(cosine_no_harm=_mean(cosine), cosine_runs=len(cosine))
    report["meta_range"]["all"].update(_well_set_figures(runs))
    report["anchors"] = _anchor_figures(runs)
    return report


def _well_set_figures(runs):
    """Harm of the range-test start on the well-set runs: the constant grid-best run and the cosine one."""
    pairs = [(r["well_set"]["with_range"], r["well_set"]["without"]) for r in runs if "well_set" in r]
    pairs += [(r["cosine"]["with_range"], r["cosine"]["without"]) for r in runs if "with_range" in r["cosine"]]
    harmed = [_key(with_["val_loss"]) > WELL_SET_HARM * _key(without["val_loss"]) for with_, without in pairs]
    return {"well_set_harm": _mean(harmed), "well_set_runs": len(harmed)}


def _anchor_figures(runs):
    """Per anchor that ran, over the task-seeds that ran it: the shares within `RANGE_NEAR` and 1.5x of the grid-best."""
    figures = {}
    for name in ANCHORS:
        ran = [(r, r["anchors"][name]) for r in runs if name in r.get("anchors", {})]
        if not ran:  # results of the anchors before it was one
            continue
        figures[name] = {"runs": len(ran),
                         "near_grid_best": _mean([_key(a["val_loss"]) <= RANGE_NEAR * r["best_val_loss"] for r, a in ran]),
                         "within_1.5x": _mean([_key(a["val_loss"]) <= 1.5 * r["best_val_loss"] for r, a in ran])}
    return figures


def _best_anchor(run):
    """The lowest final val loss of the run's anchors (`None` where it ran none)."""
    losses = [_key(a["val_loss"]) for a in run.get("anchors", {}).values()]
    return min(losses) if losses else None


def _meta_range_figures(runs, setting):
    """`RANGE_TARGETS`' figures of the `meta_range` arm over the mis-set runs of `setting` ("all": every one)."""
    cases = [(r, c) for r in runs for name, c in r["settings"].items()
             if "meta_range" in c and setting in ("all", name)]
    loss = [_key(c["meta_range"]["val_loss"]) for r, c in cases]
    anchor = [_key(r["range_test"]["constant"]["val_loss"]) if r.get("range_test") else math.inf for r, c in cases]
    diverged = [(value, r) for value, (r, c) in zip(loss, cases) if not math.isfinite(c["constant"]["val_loss"])]
    free = [(v, _best_anchor(r)) for v, (r, c) in zip(loss, cases) if _best_anchor(r) is not None]
    return {"runs": len(cases),
            "near_grid_best": _mean([v <= RANGE_NEAR * r["best_val_loss"] for v, (r, c) in zip(loss, cases)]),
            "beats_range_constant": _mean([v < a for v, a in zip(loss, anchor)]),
            "beats_anchors": _mean([v < a for v, a in free]), "anchor_runs": len(free),
            "harm": _mean([v > 1.1 * _key(c["constant"]["val_loss"]) for v, (r, c) in zip(loss, cases)]),
            "rescue": _mean([math.isfinite(v) and v < r["initial_val_loss"] for v, r in diverged]),
            "diverged_runs": len(diverged)}


def _range_figures(runs):
    """Per arm, the share of task-seeds within `RANGE_NEAR` x the grid-best final val loss;
    the MetaAdjuster's share over its mis-set runs beside them."""
    ranged = [r for r in runs if r.get("range_test")]
    figures = {arm: _mean([_key(r["range_test"][arm]["val_loss"]) <= RANGE_NEAR * r["best_val_loss"] for r in ranged])
               for arm in ("constant", "cosine")}
    meta = [_key(c["meta"]["val_loss"]) <= RANGE_NEAR * r["best_val_loss"] for r in runs for c in r["settings"].values()]
    return {"runs": len(ranged), **figures, "meta_misset": _mean(meta), "meta_runs": len(meta)}


def _mean(flags):
    return float(np.mean(flags)) if flags else None


def met(name: str, value: float | None) -> bool:
    sense, target, _ = TARGETS[name]
    return value is not None and (value >= target if sense == ">=" else value <= target)


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The Markdown tables of `kadapt meta eval`: the targets, then each task-seed."""
    report = summarize(runs)
    lines = ["| figure | measured | target | met | what |", "|---|---|---|---|---|"]
    for name, (sense, target, what) in TARGETS.items():
        value = report["all"][name]
        shown = "-" if value is None else f"{value:.2f}"
        lines.append(f"| {name} | {shown} | {sense} {target:g} | {'yes' if met(name, value) else 'NO'} | {what} |")
    lines += ["", "| setting | runs | near grid-best | beats plateau | harm | rescue |", "|---|---|---|---|---|---|"]
    for setting in ("all", *SETTINGS):
        figures = report[setting]
        cells = " | ".join("-" if figures[k] is None else f"{figures[k]:.2f}"
                           for k in ("near_grid_best", "beats_plateau", "harm", "rescue"))
        lines.append(f"| {setting} | {figures['runs']} | {cells} |")
    ranged = report["range_test"]
    lines += ["", f"| within {RANGE_NEAR}x of the grid-best | runs | share |", "|---|---|---|",
              f"| range test, then constant | {ranged['runs']} | {_share(ranged['constant'])} |",
              f"| range test, then cosine | {ranged['runs']} | {_share(ranged['cosine'])} |",
              f"| MetaAdjuster from a mis-set rate | {ranged['meta_runs']} | {_share(ranged['meta_misset'])} |"]
    lines += _meta_range_table(report["meta_range"])
    lines += _anchor_table(report["anchors"])
    lines += ["", "| task | seed | grid-best lr | its val loss | setting: lr, constant / plateau / meta / meta+range "
              "| cosine without / with / with+range | constant at the grid-best without / with+range "
              f"| anchors: {' / '.join(ANCHOR_NAMES[name] for name in ANCHORS)} | range test lr: constant / cosine "
              "| meta's decisions "
              "| meta+range's decisions |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        arms = ("constant", "plateau", "meta", "meta_range")
        settings = "; ".join(f"{s} {c['learning_rate']:g}: " + " / ".join(_loss(c[a]) for a in arms if a in c)
                             for s, c in r["settings"].items())
        cosine = " / ".join(_loss(r["cosine"][a]) for a in ("without", "with", "with_range") if a in r["cosine"])
        well_set = " / ".join(_loss(r["well_set"][a]) for a in ("without", "with_range")) if "well_set" in r else "-"
        anchors = " / ".join(_loss(r["anchors"][a]) for a in ANCHORS if a in r["anchors"]) if "anchors" in r else "-"
        lines.append(f"| {r['family']} | {r['seed']} | {r['best_rate']:g} | {r['best_val_loss']:.4g} | {settings} | "
                     f"{cosine} | {well_set} | {anchors} | {_ranged(r)} | {_all_decisions(r, 'meta', 'with')} | "
                     f"{_all_decisions(r, 'meta_range', 'with_range', 'well_set')} |")
    return "\n".join(lines)


def _meta_range_table(figures):
    lines = ["", "MetaAdjuster starting from the range test:", "",
             "| figure | measured | target | met | what |", "|---|---|---|---|---|"]
    for name, (sense, target, what) in RANGE_TARGETS.items():
        value = figures["all"][name]
        reached = value is not None and (value >= target if sense == ">=" else value <= target)
        lines.append(f"| {name} | {_share(value)} | {sense} {target:g} | {'yes' if reached else 'NO'} | {what} |")
    lines += ["", "| setting | runs | near grid-best (1.2x) | beats range test then constant | beats the best anchor "
              "| harm | rescue |", "|---|---|---|---|---|---|---|"]
    for setting in ("all", *SETTINGS):
        names = ("near_grid_best", "beats_range_constant", "beats_anchors", "harm", "rescue")
        cells = " | ".join(_share(figures[setting][name]) for name in names)
        lines.append(f"| {setting} | {figures[setting]['runs']} | {cells} |")
    return lines


def _anchor_table(figures):
    lines = ["", "Anchors at their defaults (the task's optimizer replaced; one run per task-seed):", "",
             f"| anchor | runs | within {RANGE_NEAR}x of the grid-best | within 1.5x |", "|---|---|---|---|"]
    for name, values in figures.items():
        lines.append(f"| {name} | {values['runs']} | {_share(values['near_grid_best'])} | "
                     f"{_share(values['within_1.5x'])} |")
    return lines


def _all_decisions(run, arm, cosine_arm, well_set_arm=None):
    decisions = [f"{s}: {_decisions(c[arm])}" for s, c in run["settings"].items() if arm in c]
    if cosine_arm in run["cosine"]:
        decisions.append(f"cosine: {_decisions(run['cosine'][cosine_arm])}")
    if well_set_arm is not None and well_set_arm in run:
        decisions.append(f"well-set: {_decisions(run[well_set_arm]['with_range'])}")
    return "; ".join(decisions)


def _share(value):
    return "-" if value is None else f"{value:.2f}"


def _ranged(run):
    ranged = run.get("range_test")
    if not ranged:
        return "-"
    return f"{ranged['learning_rate']:.3g}: {_loss(ranged['constant'])} / {_loss(ranged['cosine'])}"


def _loss(run):
    return "NaN" if not math.isfinite(run["val_loss"]) else f"{run['val_loss']:.4g}"


def _decisions(run):
    applied = [d["action"] for d in run["decisions"] if not d["action"].startswith("keep")]
    kept = len(run["decisions"]) - len(applied)
    return (", ".join(applied) or "none") + (f" (+{kept} kept)" if kept else "")


_NAN_KEYS = ("val_loss", "loss", "learning_rate")


def restored(value: Any) -> Any:
    """A results file's value (JSON) as the runs had it: a loss (diverged) or a rate (none
    found) written as null becomes NaN again.

    Example:

    ```python
    runs = [restored(run) for run in json.loads(path.read_text())["runs"]]
    ```
    """
    if isinstance(value, dict):
        return {k: math.nan if v is None and k in _NAN_KEYS else restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restored(v) for v in value]
    return value
