"""How far a well-set run's final validation loss moves when it trains a few steps fewer.

The meta_adjust figure "well-set runs harmed" counts runs at the grid-best
rate whose final validation loss ends above 1.05x the run without the
adjuster. A start that changes nothing but costs steps trains the same
trajectory, shorter. This script trains exactly that: the plain run at the
grid-best rate (constant and cosine, `kadapt.meta.evaluation`'s tasks), full
and with its last `--cuts` steps cut (the cosine spans the full budget and
stops early, as a run whose start was charged does), and
prints each final loss against the full run's: the noise floor of the 1.05x
criterion for a start that costs those steps.

    python benchmarks/meta/well_set_noise.py --results runs/base/base_*.json --cuts 10 30 100
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kadapt.meta import evaluation
from kadapt.recipes.training import steps_per_epoch


def cut_runs(family, seed, rate, cuts, epochs):
    """Final val loss of the well-set run, full and cut, for each schedule."""
    losses = {}
    for schedule in ("constant", "cosine"):
        task = evaluation.evaluation_task(family, seed, rate, schedule)
        budget = epochs * steps_per_epoch(len(task.data[0]), task.batch_size)
        full = evaluation.train_run(task, epochs)["val_loss"]
        losses[schedule] = {"budget": budget, "full": full,
                            "cut": {cut: evaluation.train_run(task, epochs, [evaluation.StopAfterSteps(budget - cut)])
                                    ["val_loss"] for cut in cuts if cut < budget}}
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="+", type=Path, required=True,
                        help="meta_adjust results (or table_results.py's base files): the grid-best rates")
    parser.add_argument("--cuts", nargs="+", type=int, default=[10, 30, 100])
    parser.add_argument("--epochs", type=int, default=evaluation.EPOCHS)
    args = parser.parse_args()
    runs = [run for path in args.results for run in json.loads(path.read_text())["runs"]]
    print(f"| task | seed | schedule | budget | full | {' | '.join(f'cut {c}' for c in args.cuts)} |")
    print("|---|---|---|---|---|" + "---|" * len(args.cuts))
    above = {cut: 0 for cut in args.cuts}
    count = 0
    for run in runs:
        for schedule, found in cut_runs(run["family"], run["seed"], run["best_rate"], args.cuts, args.epochs).items():
            cells = []
            for cut in args.cuts:
                loss = found["cut"].get(cut)
                ratio = loss / found["full"] if loss is not None else None
                above[cut] += ratio is not None and ratio > evaluation.WELL_SET_HARM
                cells.append("-" if ratio is None else f"{loss:.4g} ({ratio:.2f}x)")
            count += 1
            print(f"| {run['family']} | {run['seed']} | {schedule} | {found['budget']} | {found['full']:.4g} | "
                  f"{' | '.join(cells)} |", flush=True)
    print("\n" + ", ".join(f"cut {cut}: {above[cut]}/{count} above {evaluation.WELL_SET_HARM}x the full run"
                           for cut in args.cuts))


if __name__ == "__main__":
    main()
