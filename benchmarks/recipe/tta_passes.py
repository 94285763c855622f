"""Test-time augmentation in as few passes as keep its gain (issue 66 item 3): every variant of
`kadapt.recipes.predict_with_tta` on trained `kadapt train` runs of Fashion-MNIST, scored on its
10,000 test rows.

Train the runs first (about 8 minutes each on 2 cores), then score them:

    python -m kadapt train --data fashion_mnist --epochs 8 --seed 1 --out /tmp/tta-1   # 2, 3 alike
    python benchmarks/recipe/tta_passes.py /tmp/tta-1 /tmp/tta-2 /tmp/tta-3 --rounds 2

Each run's network (`training.keras`, as the run evaluated it: its precision policy kept) scores
every variant once a round, the variants in turn and their order reversed every other round, so a
slow spell of a shared machine falls on all alike; one untimed pass first traces the predict
function. Accuracy is a mean over the runs (the first round's: the others repeat it exactly);
seconds are the median over runs and rounds of one variant's call on the 10,000 rows.
"""

import argparse
import json
import os
import time
from pathlib import Path

from kadapt import environment

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.recipes import predict_with_tta  # noqa: E402
from kadapt.recipes.inference import shifted_images  # noqa: E402
from kadapt.run.data import load_arrays  # noqa: E402

# name: (predict_with_tta's arguments, passes over the rows)
VARIANTS = {
    "none": ({"flip": False, "shift": 0}, 1),
    "flip": ({"flip": True, "shift": 0}, 2),
    "shift 1": ({"flip": False, "shift": 1}, 3),
    "flip + shift 1": ({"flip": True, "shift": 1}, 6),
    "flip + shift 2": ({"flip": True, "shift": 2}, 6),
}
# Averages of single views that predict_with_tta does not offer, scored from each view's outputs
# (x: the images, f: mirrored, +1 / -1: shifted one pixel down-right / up-left): name: {view: weight}.
COMBINATIONS = {
    "flip, shifts unmirrored": {"x": 0.25, "f x": 0.25, "+1": 0.25, "-1": 0.25},
    "flip + shift 1 (as views)": {"x": 0.25, "f x": 0.25, "+1": 0.125, "f +1": 0.125, "-1": 0.125, "f -1": 0.125},
    "flip, mirrored +1 shift": {"x": 1 / 3, "f x": 1 / 3, "f +1": 1 / 3},
    "x, mirrored shifts": {"x": 0.5, "f +1": 0.25, "f -1": 0.25},
}
BATCH_SIZE = 512  # kadapt.recipes.training.evaluate_recipe's


def score_run(directory, x, y, rounds):
    """`{variant: {"accuracy", "seconds": [one per round]}}` of one run's network."""
    model = kadapt.load_model(directory, compile=False, for_training=True)
    predict_with_tta(model, x[:BATCH_SIZE + 1], batch_size=BATCH_SIZE, flip=False)  # both traces: full, ragged
    scores = {name: {"seconds": []} for name in VARIANTS}
    for round_index in range(rounds):
        order = list(VARIANTS) if round_index % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            start = time.perf_counter()
            outputs = predict_with_tta(model, x, batch_size=BATCH_SIZE, **VARIANTS[name][0])
            scores[name]["seconds"].append(time.perf_counter() - start)
            scores[name].setdefault("accuracy", float((outputs.argmax(-1) == y).mean()))
    views = view_outputs(model, x)
    for name, weights in COMBINATIONS.items():
        outputs = sum(weight * views[view] for view, weight in weights.items())
        scores[name] = {"accuracy": float((outputs.argmax(-1) == y).mean()), "seconds": []}
    return scores


def view_outputs(model, x):
    """`{view: outputs}` of the six single views of flip + shift 1."""
    views = {"x": x, "+1": shifted_images(x, 1), "-1": shifted_images(x, -1)}
    views.update({f"f {name}": images[:, :, ::-1] for name, images in views.items()})
    return {name: model.predict(images, batch_size=BATCH_SIZE, verbose=0) for name, images in views.items()}


def table(runs):
    """Markdown rows: variant, passes, mean accuracy (each run's), gain over none, median seconds."""
    lines = ["| variant | passes | test accuracy, mean (each run), % | vs none, points | seconds, median (range) |",
             "|---|---|---|---|---|"]
    base = np.mean([scores["none"]["accuracy"] for scores in runs.values()])
    passes = {**{name: passes for name, (_, passes) in VARIANTS.items()},
              **{name: len(weights) for name, weights in COMBINATIONS.items()}}
    for name, count in passes.items():
        accuracies = [scores[name]["accuracy"] for scores in runs.values()]
        seconds = [s for scores in runs.values() for s in scores[name]["seconds"]]
        each = " / ".join(f"{100 * a:.2f}" for a in accuracies)
        timed = f"{np.median(seconds):.2f} ({min(seconds):.2f}-{max(seconds):.2f})" if seconds else "not timed"
        lines.append(f"| {name} | {count} | {100 * np.mean(accuracies):.3f} ({each}) | "
                     f"{100 * (np.mean(accuracies) - base):+.3f} | {timed} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories of `kadapt train --data fashion_mnist`")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tta_passes.json"))
    args = parser.parse_args()
    _, (x, y) = load_arrays("fashion_mnist")
    load = [os.getloadavg()[0]]
    runs = {}
    for directory in args.runs:
        runs[directory] = score_run(directory, x, y, args.rounds)
        load.append(os.getloadavg()[0])
        print(directory, json.dumps(runs[directory]), flush=True)
    print("\n".join(table(runs)))
    print(f"load average (1 min) {min(load):.1f}-{max(load):.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": runs, "load": load}, indent=1))


if __name__ == "__main__":
    main()
