"""How `kadapt train` should give a many-valued string column to the network (issue 63, item 4):
one-hot over how many of its values, or an embedding, and from how many values on.

A seeded table per `--values` count: a string column `shop` of that many values drawn with Zipf-like
frequencies (p ~ 1/rank^0.8), each value with its own effect (normal, sd 1.5), a number `x`, and a
0/1 label drawn from logistic(effect[shop] + 0.7 x); 24,000 training rows (the last 10% validation)
and 8,000 test rows (Bayes accuracy printed). Each arm is `kadapt train` with its defaults in this
process: `one-hot K` sets `kadapt.run.encoding.MAX_CATEGORIES` to K (and `MIN_CATEGORIES` no higher)
and embeds nothing, `embedding` embeds every string column (`EMBED_ABOVE` 0); test accuracy from
run.json. Figures: benchmarks/README.md#public_tables.

    PYTHONPATH=. .venv/bin/python benchmarks/recipe/many_values.py --seeds 0 1      # ~10 min on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/recipe/many_values.py --values 1000 --arms 16 64 256 1024
"""

import argparse
import csv
import json
import tempfile
from pathlib import Path

import numpy as np

VALUES, TRAIN_ROWS, TEST_ROWS = (100, 300, 1000, 3000), 24000, 8000
ARMS = ("1024", "embedding")  # one-hot over at most 1,024 values, and the embedding


def write_table(folder, values, train_rows=TRAIN_ROWS):
    """train.csv and test.csv in `folder`; returns the test rows' Bayes accuracy."""
    rank = np.arange(1, values + 1)
    frequency = rank**-0.8 / np.sum(rank**-0.8)
    effect = np.random.default_rng(0).normal(0.0, 1.5, values)
    for name, rows, seed in (("train", train_rows, 1), ("test", TEST_ROWS, 2)):
        rng = np.random.default_rng(seed)
        shop, x = rng.choice(values, rows, p=frequency), rng.normal(size=rows)
        chance = 1 / (1 + np.exp(-(effect[shop] + 0.7 * x)))
        label = (rng.uniform(size=rows) < chance).astype(int)
        with open(folder / f"{name}.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["shop", "x", "y"])
            writer.writerows([f"s{s:05d}", f"{v:.4f}", y] for s, v, y in zip(shop, x, label))
    return float(np.mean(np.maximum(chance, 1 - chance)))


def run(folder, arm, seed):
    from kadapt import cli
    from kadapt.run import encoding

    if arm == "embedding":
        encoding.MAX_CATEGORIES, encoding.MIN_CATEGORIES, encoding.EMBED_ABOVE = 1024, 64, 0
    else:
        encoding.MAX_CATEGORIES, encoding.MIN_CATEGORIES, encoding.EMBED_ABOVE = int(arm), min(int(arm), 64), 10**9
    out = folder / f"run-{arm}-{seed}"
    cli.main(["train", "--data", str(folder / "train.csv"), "--target", "y", "--test", str(folder / "test.csv"),
              "--out", str(out), "--overwrite", "--seed", str(seed), "--fit-verbose", "0"])
    return json.loads((out / "run.json").read_text())["test_accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--values", type=int, nargs="+", default=list(VALUES))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), help="one-hot counts, or 'embedding'")
    parser.add_argument("--rows", type=int, default=TRAIN_ROWS, help="rows of train.csv (the last 10%% validate)")
    args = parser.parse_args()
    rows = []
    for values in args.values:
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            bayes = write_table(folder, values, args.rows)
            for arm in args.arms:
                scores = [run(folder, arm, seed) for seed in args.seeds]
                rows.append((values, bayes, arm, scores))
    print("| values | Bayes | arm | test accuracy, mean (each seed) |\n|---|---|---|---|")
    for values, bayes, arm, scores in rows:
        name = arm if arm == "embedding" else f"one-hot {arm}"
        print(f"| {values} | {bayes:.4f} | {name} | {np.mean(scores):.4f} ({' / '.join(f'{s:.4f}' for s in scores)}) |")


if __name__ == "__main__":
    main()
