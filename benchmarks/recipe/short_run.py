"""The recipe re-tuned for a short run (issue 42 item 2): `fast_fit` variants on Fashion-MNIST's
validation rows, and the step time of each network size.

Every variant trains `kadapt.recipes.fast_fit` (the library code `kadapt train` runs) on the
first 54,000 training rows, validates on the last 6,000 (the rows `kadapt train` holds out; the
test rows are never touched) and reports the validation accuracy with and without the recipe's
test-time augmentation, the steps, the wall and CPU seconds (`time.process_time`: every thread
of this process) and the load average. With other processes on the cores, compare cost by
steps x the ms per step that `--step-times` measures (each network size alternated in one
process, so a slow spell falls on all alike) and by CPU seconds, not by wall time alone.

    python benchmarks/recipe/short_run.py --step-times                     # ms per step of each size
    python benchmarks/recipe/short_run.py --variants default w32_e10 --seeds 0
    python benchmarks/recipe/short_run.py --list
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import step_seconds  # noqa: E402
from harness import timed  # noqa: E402
from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.recipes import FastFitConfig  # noqa: E402
from kadapt.recipes import fast_fit  # noqa: E402
from kadapt.recipes import training  # noqa: E402

TRAIN_ROWS = 54_000  # kadapt train's default: the last 10% of the 60,000 held out
BATCH_SIZE = 256  # the recipe's
WIDTHS = {"w64": (64, 128, 256), "w48": (48, 96, 192), "w32": (32, 64, 128)}
DEFAULT_OUT = Path(__file__).parent / "results" / "short_run.jsonl"


def variant(widths="w64", epochs=10, batch_size=BATCH_SIZE, **overrides):
    """`(FastFitConfig overrides, epochs, batch size)`; a larger batch scales the peak rate linearly."""
    overrides = {"widths": WIDTHS[widths], **overrides}
    if batch_size != BATCH_SIZE and "learning_rate" not in overrides:
        overrides["learning_rate"] = FastFitConfig().learning_rate * batch_size / BATCH_SIZE
    return overrides, epochs, batch_size


VARIANTS = {
    "default": variant(),
    "w48_e10": variant("w48"),
    "w32_e10": variant("w32"),
    "w64_e6": variant(epochs=6),
    "w64_e8": variant(epochs=8),
    "w48_e8": variant("w48", epochs=8),
    "w48_e6": variant("w48", epochs=6),
    "w32_e6": variant("w32", epochs=6),
    "w32_e16": variant("w32", epochs=16),
    "w64_e4": variant(epochs=4),
    "w64_b512": variant(batch_size=512),
    "w48_b512": variant("w48", batch_size=512),
    "w64_ls02": variant(label_smoothing=0.2),
    "w64_ema": variant(ema_momentum=0.99, restore_best_weights=False),
    "w48_ema": variant("w48", ema_momentum=0.99, restore_best_weights=False),
    "w64_e6_ema": variant(epochs=6, ema_momentum=0.99, restore_best_weights=False),
    "w64_e6_ls02": variant(epochs=6, label_smoothing=0.2),
    "w64_e6_translate1": variant(epochs=6, translate=1 / 28),
}


def split():
    """`(x_train, y_train, x_val, y_val)`: the first 54,000 training rows and the last 6,000."""
    (x, y), _ = kadapt.datasets.fashion_mnist()
    return x[:TRAIN_ROWS], y[:TRAIN_ROWS], x[TRAIN_ROWS:], y[TRAIN_ROWS:]


def accuracy(model, x, y, config, tta):
    scores = training.evaluate_recipe(model, x, y, config if tta else config.replace(flip=False, test_shift=0))
    return scores["accuracy"]


def run_variant(name, seed, data):
    """One variant's record: validation accuracy (TTA on and off), steps, wall and CPU seconds, load."""
    overrides, epochs, batch_size = VARIANTS[name]
    config = FastFitConfig(**overrides)
    x, y, x_val, y_val = data
    load_before = os.getloadavg()
    model, train_wall, train_cpu = timed(lambda: fast_fit(x, y, validation_data=(x_val, y_val), epochs=epochs,
                                                          batch_size=batch_size, config=config, seed=seed))
    return {
        "variant": name, "seed": seed, "epochs": epochs, "batch_size": batch_size,
        "overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()},
        "val_accuracy_tta": accuracy(model, x_val, y_val, config, tta=True),
        "val_accuracy": accuracy(model, x_val, y_val, config, tta=False),
        "steps": epochs * training.steps_per_epoch(len(x), batch_size),
        "train_wall_seconds": round(train_wall, 1), "train_cpu_seconds": round(train_cpu, 1),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }


def step_times(rounds, steps, batch_sizes):
    """`{"wXX@batch": [ms per step of each round]}`: every network size and batch, alternated in this process."""
    x, y, _, _ = split()
    arms = {}
    for batch_size in batch_sizes:
        images, labels = np.asarray(x[:batch_size, ..., None], "float32"), training.one_hot(y[:batch_size], 10)
        for name, widths in WIDTHS.items():
            keras.utils.set_random_seed(0)
            config = FastFitConfig(widths=widths, optimizer="sgd")  # fast_fit's choice for fast_resnet
            model = training.compile_recipe(training.recipe_network(config, x[:5000, ..., None], 10), config, 1000)
            step_seconds(model, images, labels, 3)  # the trace
            arms[f"{name}@{batch_size}"] = (model, images, labels)
    times = {arm: [] for arm in arms}
    for _ in range(rounds):
        for arm, (model, images, labels) in arms.items():
            times[arm].append(1000 * step_seconds(model, images, labels, steps))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["default"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--step-times", action="store_true", help="measure ms per step of each network size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines, appended")
    args = parser.parse_args()
    if args.list:
        for name, (overrides, epochs, batch_size) in VARIANTS.items():
            print(f"{name:20s} epochs={epochs} batch={batch_size} {overrides}")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.step_times:
        load_before = os.getloadavg()
        times = step_times(args.rounds, args.steps, args.batch_sizes)
        record = {"step_times_ms": {arm: {"median": round(float(np.median(t)), 1), "rounds": [round(v, 1) for v in t]}
                                    for arm, t in times.items()},
                  "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
        print(json.dumps(record), flush=True)
        with args.out.open("a") as file:
            file.write(json.dumps(record) + "\n")
        return
    data = split()
    for name in args.variants:
        for seed in args.seeds:
            record = run_variant(name, seed, data)
            print(json.dumps(record), flush=True)
            with args.out.open("a") as file:
                file.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
