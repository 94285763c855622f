"""The MetaAdjuster's range-test reading against the test's length, on the held-out task-seeds.

For each held-out task-seed (`kadapt.cli.meta_evaluation`'s families), the range
test `RangeTestStart` runs before the first step, on the fresh model with the
start's batches, at several lengths: a share of the run's budget (at least 10
steps, at most 100), its smoothing following the length
(`kadapt.range_test.curve.sweep_smoothing`). Printed: each reading, and per
length how far the readings lie from the 100-step one and from the task-seed's
grid-best rate (given with `--grid-best`, e.g. from the meta_adjust table).

    python benchmarks/meta/range_test_length.py --seeds 3 4 5 --shares 0.3 0.1 0.05
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import keras
import numpy as np

from kadapt.cli import meta_evaluation as evaluation
from kadapt.meta.start.range_test_start import MIN_STEPS
from kadapt.recipes.training import steps_per_epoch


def readings(family, seed, shares, epochs):
    """The start's reading at `min(100, share x budget)` steps (at least 10) for each share."""
    task = evaluation.evaluation_task(family, seed, evaluation.GRID[0])
    budget = epochs * steps_per_epoch(len(task.data[0]), task.batch_size)
    found = {}
    for share in shares:
        length = max(MIN_STEPS, min(evaluation.RANGE_TEST_STEPS, int(budget * share)))
        keras.utils.set_random_seed(seed)
        model = task.build(budget)
        model.optimizer.build(model.trainable_variables)
        try:
            suggestion = float(evaluation.range_start(task).run(model, length).suggestion)
        except ValueError:
            suggestion = math.nan
        found[str(share)] = {"steps": length, "learning_rate": suggestion}
    return {"family": family, "seed": seed, "budget": budget, "readings": found}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=evaluation.EVALUATION_FAMILIES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[3, 4, 5])
    parser.add_argument("--shares", nargs="+", type=float, default=[0.3, 0.1, 0.05])
    parser.add_argument("--epochs", type=int, default=evaluation.EPOCHS)
    parser.add_argument("--grid-best", type=Path, help="JSON {\"family/seed\": grid-best rate}")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    best = json.loads(args.grid_best.read_text()) if args.grid_best else {}
    runs = []
    for family in args.families:
        for seed in args.seeds:
            run = readings(family, seed, args.shares, args.epochs)
            run["grid_best"] = best.get(f"{family}/{seed}")
            runs.append(run)
            print(json.dumps(run), flush=True)
            if args.out:
                args.out.write_text(json.dumps(runs, indent=1))
    print_summary(runs)


def print_summary(runs):
    """Per share: how many decades its readings lie from the first share's and from the grid-best rate."""
    def decades(a, b):
        return abs(math.log10(a / b)) if a and b and math.isfinite(a) and math.isfinite(b) else math.nan

    print("| task | seed | budget | grid-best | readings (share, steps: lr) |")
    print("|---|---|---|---|---|")
    for run in runs:
        cells = ", ".join(f"{share} {r['steps']}: {r['learning_rate']:.3g}" for share, r in run["readings"].items())
        print(f"| {run['family']} | {run['seed']} | {run['budget']} | {run['grid_best']} | {cells} |")
    first = next(iter(runs[0]["readings"]))
    print("| share | decades from the first share's reading: median / max | from the grid-best: median / max "
          "| none read |")
    print("|---|---|---|---|")
    for share in runs[0]["readings"]:
        lrs = [(run["readings"][share]["learning_rate"], run) for run in runs]
        to_first = [decades(lr, run["readings"][first]["learning_rate"]) for lr, run in lrs]
        to_best = [decades(lr, run["grid_best"]) for lr, run in lrs]
        failed = sum(not math.isfinite(lr) for lr, _ in lrs)
        print(f"| {share} | {np.nanmedian(to_first):.2f} / {np.nanmax(to_first):.2f} | "
              f"{np.nanmedian(to_best):.2f} / {np.nanmax(to_best):.2f} | {failed} |")


if __name__ == "__main__":
    main()
