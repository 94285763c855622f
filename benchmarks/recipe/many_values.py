"""How many values of a many-valued string column `kadapt train` should keep one-hot (issue 63, item 4).

A seeded table: a string column `shop` of 1,000 values drawn with Zipf-like frequencies (p ~ 1/rank^0.8),
each value with its own effect (normal, sd 1.5), a number `x`, and a 0/1 label drawn from
logistic(effect[shop] + 0.7 x); 24,000 training rows (the last 10% validation) and 8,000 test rows
(Bayes accuracy printed). Each arm is `kadapt train` with its defaults in this process,
`kadapt.run.encoding.MAX_CATEGORIES` set to the arm's count (and `MIN_CATEGORIES` no higher), test
accuracy from run.json. Figures: benchmarks/README.md#public_tables.

    PYTHONPATH=. .venv/bin/python benchmarks/recipe/many_values.py --seeds 0 1      # ~5 min on 2 cores
"""

import argparse
import csv
import json
import tempfile
from pathlib import Path

import numpy as np

VALUES, TRAIN_ROWS, TEST_ROWS = 1000, 24000, 8000
ARMS = (16, 64, 256, 1024)


def write_table(folder):
    """train.csv and test.csv in `folder`; returns the test rows' Bayes accuracy."""
    rank = np.arange(1, VALUES + 1)
    frequency = rank**-0.8 / np.sum(rank**-0.8)
    effect = np.random.default_rng(0).normal(0.0, 1.5, VALUES)
    for name, rows, seed in (("train", TRAIN_ROWS, 1), ("test", TEST_ROWS, 2)):
        rng = np.random.default_rng(seed)
        shop, x = rng.choice(VALUES, rows, p=frequency), rng.normal(size=rows)
        chance = 1 / (1 + np.exp(-(effect[shop] + 0.7 * x)))
        label = (rng.uniform(size=rows) < chance).astype(int)
        with open(folder / f"{name}.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["shop", "x", "y"])
            writer.writerows([f"s{s:04d}", f"{v:.4f}", y] for s, v, y in zip(shop, x, label))
    return float(np.mean(np.maximum(chance, 1 - chance)))


def run(folder, values, seed):
    from kadapt import cli
    from kadapt.run import encoding

    encoding.MAX_CATEGORIES, encoding.MIN_CATEGORIES = values, min(values, 64)
    out = folder / f"run-{values}-{seed}"
    cli.main(["train", "--data", str(folder / "train.csv"), "--target", "y", "--test", str(folder / "test.csv"),
              "--out", str(out), "--overwrite", "--seed", str(seed), "--fit-verbose", "0"])
    return json.loads((out / "run.json").read_text())["test_accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        print(f"Bayes accuracy on the test rows: {write_table(folder):.4f}")
        results = {values: [run(folder, values, seed) for seed in args.seeds] for values in ARMS}
    print("| values kept one-hot | test accuracy, mean (each seed) |\n|---|---|")
    for values, scores in results.items():
        print(f"| {values} | {np.mean(scores):.4f} ({' / '.join(f'{s:.4f}' for s in scores)}) |")


if __name__ == "__main__":
    main()
