"""How far a well-set run's final validation loss moves when it trains a few steps fewer, or in another order.

The meta_adjust figure "well-set runs harmed" counts runs at the grid-best
rate whose final validation loss ends above 1.05x the run without the
adjuster. A start that changes nothing but costs steps trains the same
trajectory, shorter; one that goes on from a branch trains
other batches first. This script trains the plain run at the grid-best rate
(constant and cosine, `kadapt.cli.meta_evaluation`'s tasks): full; with its last
`--cuts` steps cut (the cosine spans the full budget and stops early, as a
run whose start was charged does); and full with its training rows in
`--orders` other orders (the same data, initialization and rate). Printed:
each final loss against the full run's, and how many lie above 1.05x: the
noise floor of the criterion for a start that changes nothing else.

    python benchmarks/meta/well_set_noise.py --results runs/base/base_*.json --cuts 10 100 --orders 3

The full constant run is the grid-best figure itself (the same run), so its
reordered runs also say how often the grid's best rate, trained from the first
step in another order, lands within 1.2x of the grid-best: the noise ceiling
of meta_adjust's "within 1.2x" figure (`meta_rescue.py --noise` reads
`--out`'s file).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kadapt.cli import meta_evaluation as evaluation
from kadapt.recipes.training import steps_per_epoch


def noise_runs(family, seed, rate, cuts, orders, epochs, schedules):
    """Final val loss of the well-set run, full, cut and reordered, for each schedule."""
    losses = {}
    for schedule in schedules:
        task = evaluation.evaluation_task(family, seed, rate, schedule)
        budget = epochs * steps_per_epoch(len(task.data[0]), task.batch_size)
        runs = {"full": evaluation.train_run(task, epochs)["val_loss"]}
        for cut in (c for c in cuts if c < budget):
            stop = evaluation.StopAfterSteps(budget - cut)
            runs[f"cut {cut}"] = evaluation.train_run(task, epochs, [stop])["val_loss"]
        for order in range(1, orders + 1):
            runs[f"order {order}"] = evaluation.train_run(evaluation.reordered(task, order), epochs)["val_loss"]
        losses[schedule] = {"budget": budget, "runs": runs}
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="+", type=Path, required=True,
                        help="meta_adjust results (or table_results.py's base files): the grid-best rates")
    parser.add_argument("--cuts", nargs="*", type=int, default=[10, 100])
    parser.add_argument("--orders", type=int, default=3)
    parser.add_argument("--schedules", nargs="+", default=["constant", "cosine"], choices=["constant", "cosine"])
    parser.add_argument("--epochs", type=int, default=evaluation.EPOCHS)
    parser.add_argument("--out", type=Path, help="the losses as JSON too (meta_rescue.py --noise reads them)")
    args = parser.parse_args()
    saved = []
    runs = [run for path in args.results for run in json.loads(path.read_text())["runs"]]
    names = [f"cut {c}" for c in args.cuts] + [f"order {k}" for k in range(1, args.orders + 1)]
    print(f"| task | seed | schedule | budget | full | {' | '.join(names)} |")
    print("|---|---|---|---|---|" + "---|" * len(names))
    above = {"cut": [0, 0], "order": [0, 0]}  # runs above 1.05x the full one, runs
    # The full constant run is the grid-best figure: how often its own rate, reordered, is within 1.2x of it.
    within = [0, 0]
    for run in runs:
        found = noise_runs(run["family"], run["seed"], run["best_rate"], args.cuts, args.orders, args.epochs,
                           args.schedules)
        saved.append({"family": run["family"], "seed": run["seed"], "rate": run["best_rate"],
                      "grid_best": run["best_val_loss"], "schedules": found})
        for schedule, result in found.items():
            full, cells = result["runs"]["full"], []
            for name in names:
                loss = result["runs"].get(name)
                if loss is None:
                    cells.append("-")
                    continue
                count = above[name.split()[0]]
                count[0] += not loss <= evaluation.WELL_SET_HARM * full
                count[1] += 1
                if schedule == "constant" and name.startswith("order"):
                    within[0] += loss <= evaluation.RANGE_NEAR * full
                    within[1] += 1
                cells.append(f"{loss:.4g} ({loss / full:.2f}x)")
            print(f"| {run['family']} | {run['seed']} | {schedule} | {result['budget']} | {full:.4g} | "
                  f"{' | '.join(cells)} |", flush=True)
    print(f"\nabove {evaluation.WELL_SET_HARM}x the full run: cut {above['cut'][0]}/{above['cut'][1]}, "
          f"reordered {above['order'][0]}/{above['order'][1]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": saved}, indent=1))
    print(f"constant runs reordered within {evaluation.RANGE_NEAR}x of the full run (the grid-best): "
          f"{within[0]}/{within[1]}")


if __name__ == "__main__":
    main()
