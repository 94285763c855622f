"""The main job: `kadapt train` against the plain Keras baseline on Fashion-MNIST, side by side.

Arms (each over --seeds, one after another in this process):
  baseline   kadapt.models.small_cnn, Adam 1e-3, batch 128, 10 epochs (plain Keras `fit`)
  kadapt     `kadapt train --data fashion_mnist` with its defaults (the recipe, fast_resnet,
             the default MetaAdjuster), through the same library call the command makes
  meta_off   the same with `--meta off`
  bfloat16   the kadapt arm with `--precision bfloat16` (Keras' mixed_bfloat16 policy)

Each run's time split (`kadapt.run.phases`: data, network, pipeline, probe, first step, epochs,
evaluation, saving) is printed and kept in the results, the baseline's by the same clock.
Wall time runs from the first data touch (loading the files) to the end of the final test
evaluation (the command's own for the kadapt arms: test-time flips and shifts), less the time of
the per-epoch test evaluations that only this benchmark makes to give the time to 91%.
`kadapt train` holds out the last 10% of the training rows for validation, as its defaults say;
the baseline trains on all 60,000. The kadapt arms' test accuracy is the command's
own (test-time flips and shifts, the best epoch's weights).

    python benchmarks/recipe/main_job.py                       # all arms, seeds 0 1 2
    python benchmarks/recipe/main_job.py --seeds 0 --set epochs=2 train_rows=6000 --baseline-epochs 2
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from fashion_mnist_fast import arm_summary  # noqa: E402  (the same summary as the recipe's benchmark)
from kadapt.recipes import predict_with_tta  # noqa: E402
from kadapt.run import start_run  # noqa: E402
from kadapt.run import train  # noqa: E402
from kadapt.run.phases import FirstStepClock  # noqa: E402
from kadapt.run.phases import PhaseClock  # noqa: E402
from kadapt.run.config import resolve_config  # noqa: E402

BASELINE_EPOCHS = 10
BASELINE_BATCH_SIZE = 128
TARGET_ACCURACY = 0.91
ARMS = ("baseline", "kadapt", "meta_off", "bfloat16")
DEFAULT_OUT = Path(__file__).parent / "results" / "main_job.json"


class TestAccuracy(keras.callbacks.Callback):
    """Test accuracy at every epoch end, and the seconds since `start` that
    training had taken by then: the time these evaluations take is kept out
    of the clock (they exist only to give the time to 91%)."""

    def __init__(self, x_test, y_test, start, tta):
        super().__init__()
        self.x_test, self.y_test, self.start, self.tta = x_test, y_test, start, tta
        self.curve, self.evaluation_seconds = [], 0.0

    def on_epoch_end(self, epoch, logs=None):
        began = time.perf_counter()
        logits = predict_with_tta(self.model, self.x_test, **self.tta)
        self.curve.append({"epoch": epoch + 1, "seconds": self.elapsed(began),
                           "accuracy": float(np.mean(logits.argmax(-1) == self.y_test))})
        self.evaluation_seconds += time.perf_counter() - began
        print(f"  epoch {epoch + 1}: {self.curve[-1]}", flush=True)

    def elapsed(self, now=None):
        return (now or time.perf_counter()) - self.start - self.evaluation_seconds


def run_baseline(seed, options, epochs):
    start, clock = time.perf_counter(), PhaseClock()
    with clock.phase("data"):
        (x, y), (x_test, y_test) = kadapt.datasets.fashion_mnist()
        rows = options.get("train_rows")
        x, y = (x[:rows], y[:rows]) if rows else (x, y)
        x, x_test = x / 255.0, x_test / 255.0
    with clock.phase("network"):
        keras.utils.set_random_seed(seed)
        model = kadapt.models.small_cnn()
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    curve, first_step = TestAccuracy(x_test, y_test, start, {"flip": False}), FirstStepClock()
    with clock.fit(first_step):
        model.fit(x, y, batch_size=BASELINE_BATCH_SIZE, epochs=epochs, callbacks=[first_step, curve], verbose=0)
    clock.add("epochs", -curve.evaluation_seconds)  # the benchmark's own per-epoch evaluations, off the clock
    with clock.phase("evaluation"):
        logits = predict_with_tta(model, x_test, flip=False)  # the final evaluation, on the clock
    accuracy = float(np.mean(logits.argmax(-1) == y_test))
    return {"accuracy": accuracy, "wall_seconds": curve.elapsed(), "curve": curve.curve, "seconds": clock.to_dict()}


def run_kadapt(seed, options, meta):
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        run = start_run({"data": "fashion_mnist", "seed": seed, "meta": meta, **options}, Path(folder) / "run")
        curve = TestAccuracy(run.data.x_test, run.data.y_test, start, run.plan.recipe.test_time_augmentation)
        record = train(run, echo=lambda line: print("  " + line, flush=True), callbacks=[curve])
        decisions = run.directory.read_jsonl("meta_decisions.jsonl")
    seconds = dict(record["seconds"])
    seconds["epochs"] = round(seconds["epochs"] - curve.evaluation_seconds, 1)  # the benchmark's own evaluations
    return {"accuracy": record["test_accuracy"], "wall_seconds": curve.elapsed(), "seconds": seconds,
            "curve": curve.curve, "micro_batch_size": record["micro_batch_size"],
            "weights_epoch": record["weights"]["epoch"],
            "decisions": [f"step {d['step']}: {d['trigger']} -> {d['action']}" for d in decisions]}


def mean_split(runs):
    """The mean seconds of each phase over `runs` (each run's `"seconds"`)."""
    return {name: round(float(np.mean([run["seconds"].get(name, 0.0) for run in runs])), 1)
            for name in runs[0]["seconds"]}


def seconds_to(curve, accuracy):
    reached = [point["seconds"] for point in curve if point["accuracy"] >= accuracy]
    return reached[0] if reached else None


def verdict(arms):
    """The targets of the main job, where the arms for them ran."""
    lines = []
    baseline, ours, off, bfloat16 = (arms.get(name) for name in ARMS)
    if baseline and ours:
        gain = 100 * (ours["mean_accuracy"] - baseline["mean_accuracy"])
        ratio = ours["mean_wall_seconds"] / baseline["mean_wall_seconds"]
        lines.append(f"kadapt - baseline: {gain:+.2f} points (target >= +3.0): {'met' if gain >= 3.0 else 'NOT met'}")
        lines.append(f"wall time kadapt / baseline: {ratio:.2f}x (target <= 2.5x): {'met' if ratio <= 2.5 else 'NOT met'}")
    if ours and off:
        harm = 100 * (ours["mean_accuracy"] - off["mean_accuracy"])
        lines.append(f"meta on - meta off: {harm:+.2f} points (target >= -0.1): {'met' if harm >= -0.1 else 'NOT met'}")
    if ours and bfloat16:
        change = 100 * (bfloat16["mean_accuracy"] - ours["mean_accuracy"])
        ratio = bfloat16["mean_wall_seconds"] / ours["mean_wall_seconds"]
        lines.append(f"bfloat16 - float32: {change:+.2f} points (target within 0.15): "
                     f"{'met' if abs(change) <= 0.15 else 'NOT met'}")
        lines.append(f"wall time bfloat16 / float32: {ratio:.2f}x (target <= 0.65x): {'met' if ratio <= 0.65 else 'NOT met'}")
    return lines


def parse_options(pairs):
    """`--set name=JSON` pairs as `kadapt train` options (checked by its own config)."""
    options = {key: json.loads(value) for key, value in (pair.split("=", 1) for pair in pairs)}
    resolve_config({"data": "fashion_mnist", **options})  # a misspelt option fails here, before any run
    return options


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", choices=ARMS, action="append")
    parser.add_argument("--set", nargs="*", default=[], metavar="OPTION=JSON",
                        help="kadapt train options for the kadapt arms (epochs, train_rows, memory_budget, ...); "
                             "train_rows also applies to the baseline")
    parser.add_argument("--baseline-epochs", type=int, default=BASELINE_EPOCHS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    options = parse_options(args.set)
    runners = {
        "baseline": lambda seed: run_baseline(seed, options, args.baseline_epochs),
        "kadapt": lambda seed: run_kadapt(seed, options, "default"),
        "meta_off": lambda seed: run_kadapt(seed, options, "off"),
        "bfloat16": lambda seed: run_kadapt(seed, {**options, "precision": "bfloat16"}, "default"),
    }
    results = {"options": options, "seeds": args.seeds, "runs": [], "arms": {}}
    for arm in args.only or ARMS:
        for seed in args.seeds:
            load_before = os.getloadavg()
            run = {"arm": arm, "seed": seed, **runners[arm](seed)}
            run.update(seconds_to_91=seconds_to(run["curve"], TARGET_ACCURACY),
                       loadavg_before=load_before, loadavg_after=os.getloadavg())
            results["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "curve"}), flush=True)
        runs = [r for r in results["runs"] if r["arm"] == arm]
        results["arms"][arm] = {**arm_summary(runs), "mean_seconds": mean_split(runs)}
        print(arm, json.dumps(results["arms"][arm]), flush=True)
    results["verdict"] = verdict(results["arms"])
    print("\n".join(results["verdict"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
