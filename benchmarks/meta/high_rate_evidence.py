"""The evidence of a too-high rate that trains, on the grid of meta_adjust's families (development seeds).

Pass `grid`: each family-seed's constant grid runs (`meta_evaluation.GRID`, not
widened), plain (no adjuster), their final validation loss and each step's
training loss (from fit's running means). That gives the grid-best rate and
which rates are too high (finite, >= 1.2x the best's loss).

Pass `branches`: for the rates at and above the grid-best (constant) and the
cosine run at the grid-best, the first `--epochs` epochs with, at each epoch
end, the branches `HighRateCheck.read` trains from a snapshot (the live rate
and a tenth of it, one epoch's steps, at most 5% of the budget, on the training
rows, scored on 256 held ones). The snapshot is restored: the run is unchanged.

    nice -n 10 .venv/bin/python benchmarks/meta/high_rate_evidence.py grid --seeds 0 1 2 \
        --families iris circles friedman --out runs/hr/grid_a.json
    nice -n 10 .venv/bin/python benchmarks/meta/high_rate_evidence.py branches --epochs 4 \
        --grid runs/hr/grid_a.json --out runs/hr/branches_a.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import keras

from kadapt.cli import meta_evaluation as evaluation
from kadapt.recipes.training import steps_per_epoch


class StepLosses(keras.callbacks.Callback):
    """Each step's training loss, from fit's running mean of the epoch."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_begin(self, epoch, logs=None):
        self._total = 0.0

    def on_train_batch_end(self, batch, logs=None):
        total = float(logs["loss"]) * (batch + 1)
        self.losses.append(total - self._total)
        self._total = total


class Evidence(keras.callbacks.Callback):
    """At each of the first epoch ends, `high_rate.branch_evidence` from the run's state (restored)."""

    def __init__(self, task, epochs):
        super().__init__()
        self.task, self.epochs, self.readings = task, epochs, []

    def on_epoch_end(self, epoch, logs=None):
        from kadapt.meta.live import high_rate

        x, y = self.task.data[:2]
        check = high_rate.HighRateCheck(x, y, batch_size=self.task.batch_size, seed=self.task.seed)
        per_epoch = steps_per_epoch(len(x), self.task.batch_size)
        steps = check.num_steps(per_epoch, per_epoch * evaluation.EPOCHS)
        scores = check.read(self.model, steps)  # restored after: the run is unchanged
        self.readings.append({"epoch": epoch, "val_loss": float(logs.get("val_loss", math.nan)),
                              "loss": float(logs.get("loss", math.nan)), "steps": steps, "start": scores.start,
                              "scores": dict(zip(("1", "0.1"), scores.scores.values()))})
        if epoch + 1 >= self.epochs:
            self.model.stop_training = True


def grid_pass(family, seed, epochs):
    runs = {}
    for rate in evaluation.GRID:
        task = evaluation.evaluation_task(family, seed, rate)
        steps = StepLosses()
        run = evaluation.train_run(task, epochs, [steps])
        runs[rate] = {**run, "step_losses": steps.losses}
        print(f"{family}/{seed} lr={rate:g}: {run['val_loss']:.4g}", flush=True)
    finite = {rate: run["val_loss"] for rate, run in runs.items() if math.isfinite(run["val_loss"])}
    best = min(finite, key=finite.get)
    return {"family": family, "seed": seed, "best_rate": best, "best_val_loss": finite[best],
            "grid": {f"{rate:g}": run for rate, run in runs.items()}}


def branch_pass(entry, epochs):
    family, seed, best = entry["family"], entry["seed"], entry["best_rate"]
    out = {"family": family, "seed": seed, "best_rate": best, "best_val_loss": entry["best_val_loss"], "runs": {}}
    for key, run in entry["grid"].items():
        rate = float(key)
        if rate < best or (run["val_loss"] is not None and not math.isfinite(run["val_loss"])):
            continue
        out["runs"][key] = _evidence(evaluation.evaluation_task(family, seed, rate), epochs, run["val_loss"])
    cosine = evaluation.evaluation_task(family, seed, best, "cosine")
    out["cosine"] = _evidence(cosine, epochs, None)
    return out


def _evidence(task, epochs, final):
    evidence = Evidence(task, epochs)
    evaluation.train_run(task, evaluation.EPOCHS, [evidence])
    for reading in evidence.readings:
        print(f"{task.family}/{task.seed} lr={task.learning_rate:g} {task.schedule} epoch {reading['epoch']}: "
              f"{reading['scores']}", flush=True)
    return {"final": final, "readings": evidence.readings}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("grid", "branches"))
    parser.add_argument("--families", nargs="+", default=list(evaluation.EVALUATION_FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--grid", type=Path, help="a `grid` pass's output (for `branches`)")
    parser.add_argument("--epochs", type=int, default=4, help="epoch ends read in `branches`")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.mode == "grid":
        results = [grid_pass(f, s, evaluation.EPOCHS) for f in args.families for s in args.seeds]
    else:
        results = [branch_pass(entry, args.epochs) for entry in json.loads(args.grid.read_text())["results"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results}, default=float).replace("NaN", "null"))


if __name__ == "__main__":
    main()
