"""The range test's arms of `kadapt.cli.meta_evaluation` alone: its rate constant and under cosine.

`evaluation.range_test_runs` on each held-out task-seed (the test's steps
charged to the budget of `evaluation.EPOCHS` epochs), without the grid and
MetaAdjuster arms of `meta_adjust.py` (which runs these arms too). With
`--grid RESULTS.json` (a `meta_adjust.py` results file of the same seeds) each
arm is marked where it ends within 1.2x of that run's grid-best val loss.

    .venv/bin/python benchmarks/meta/range_test_arms.py --seeds 3 4 5      # ~8 min on 2 shared cores
"""

import argparse
import json
import math
import time
from pathlib import Path

from kadapt import environment  # noqa: E402

environment.load_tensorflow()

from kadapt.cli import meta_evaluation as evaluation  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(evaluation.EVALUATION_FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(evaluation.SEEDS))
    parser.add_argument("--epochs", type=int, default=evaluation.EPOCHS)
    parser.add_argument("--grid", type=Path, help="a meta_adjust.py results file with the grid-best losses")
    args = parser.parse_args()
    best = {}
    if args.grid:
        best = {(r["family"], r["seed"]): r["best_val_loss"] for r in json.loads(args.grid.read_text())["runs"]}
    started = time.perf_counter()
    print("| task | seed | range-test lr (steps) | constant | cosine | grid-best val loss |\n|---|---|---|---|---|---|")
    for family in args.families:
        for seed in args.seeds:
            ranged = evaluation.range_test_runs(family, seed, args.epochs)
            grid = best.get((family, seed))
            if ranged is None:
                print(f"| {family} | {seed} | no room in {args.epochs} epochs | | | |", flush=True)
                continue
            rate = ranged["learning_rate"]
            shown = "failed" if not math.isfinite(rate) else f"{rate:.3g} ({ranged['steps_run']})"
            print(f"| {family} | {seed} | {shown} | {_loss(ranged['constant'], grid)} | "
                  f"{_loss(ranged['cosine'], grid)} | {'-' if grid is None else f'{grid:.4g}'} |", flush=True)
    print(f"{time.perf_counter() - started:.0f} s; * within {evaluation.RANGE_NEAR}x of the grid-best")


def _loss(run, grid):
    loss = run["val_loss"]
    if not math.isfinite(loss):
        return "NaN"
    near = grid is not None and loss <= evaluation.RANGE_NEAR * grid
    return f"{loss:.4g}{' *' if near else ''}"


if __name__ == "__main__":
    main()
