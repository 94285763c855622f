"""Muon against the recipe's SGD: `kadapt train --data fashion_mnist`, whole processes.

Arms are `optimizer:rate`: `sgd` (the recipe), `muon` (Keras' Muon: its orthogonalized step on 2-D
kernels only, on fast_resnet the classifier's), `muon_filters` (`kadapt.optimizers.FilterMuon`: on
every convolution filter, flattened, as airbench).

Each arm is one `kadapt train` process (its defaults otherwise: fast_resnet, the MetaAdjuster,
best-epoch weights, test-time flips and shifts); arms run one after another, the order of the
optimizers alternated from seed to seed. The test accuracy and the wall time are the command's own
(`run.json`: `test_accuracy`, `wall_seconds`).

    python benchmarks/recipe/muon_recipe.py --arms sgd:0.2 muon:0.01 muon:0.003 --seeds 0 --epochs 4
    python benchmarks/recipe/muon_recipe.py --arms sgd:0.2 muon:0.01 --seeds 1 --epochs 4
    python benchmarks/recipe/muon_recipe.py --arms sgd:0.2 muon:0.01 muon_filters:0.03 --seeds 0 1 2 --epochs 4
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_OUT = Path(__file__).parent / "results" / "muon_recipe.json"


def run_arm(optimizer, rate, seed, epochs, train_rows):
    """`run.json`'s record of one `kadapt train` process."""
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "kadapt", "train", "--data", "fashion_mnist", "--optimizer", optimizer,
                "--learning-rate", str(rate), "--epochs", str(epochs), "--seed", str(seed), "--out", out]
        if train_rows:
            argv += ["--train-rows", str(train_rows)]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        record = json.loads((Path(out) / "run.json").read_text())
        resolved = json.loads((Path(out) / "config.json").read_text())["resolved"]
    return {"optimizer": optimizer, "learning_rate": rate, "seed": seed, "epochs": epochs,
            "train_rows": train_rows, "test_accuracy": record["test_accuracy"],
            "wall_seconds": record["wall_seconds"], "precision": resolved["precision"]["policy"],
            "epoch_seconds": record["seconds"].get("epochs")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=["sgd:0.2", "muon:0.01"], help="optimizer:rate ...")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-rows", type=int)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    arms = [(name, float(rate)) for name, rate in (arm.split(":") for arm in args.arms)]
    results = json.loads(args.out.read_text()) if args.out.exists() else []
    for index, seed in enumerate(args.seeds):
        for optimizer, rate in (arms if index % 2 == 0 else arms[::-1]):  # alternate which runs first
            result = run_arm(optimizer, rate, seed, args.epochs, args.train_rows)
            print(json.dumps(result), flush=True)
            results.append(result)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
