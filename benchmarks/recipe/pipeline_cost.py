"""What the recipe's input pipeline costs beside its training step: one epoch of Fashion-MNIST's
54,000 training rows through the recipe's batches (`shuffled_batches`) with and without its
on-the-fly augmentation (`augmented_batches`), drawn alone, against the recipe's compiled
`fast_resnet` step on the same batches, in one process. CPU seconds count both threads'
work (tf.data's and the step's run on the same cores here), so they say what the pipeline takes
from the step where the two overlap.

    python benchmarks/recipe/pipeline_cost.py [--batch 256] [--steps 30] [--rounds 3]
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import timed  # noqa: E402
from kadapt import environment  # noqa: E402

environment.load_tensorflow()

import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.recipes import training  # noqa: E402
from kadapt.recipes.config import FastFitConfig  # noqa: E402

ROWS = 54_000  # kadapt train's training rows (the last 6,000 of 60,000 validate)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    (x, y), _ = kadapt.datasets.fashion_mnist()
    x, y = np.asarray(x[:ROWS], "float32")[..., None], y[:ROWS]  # as fast_fit takes them
    config = FastFitConfig()
    steps = training.steps_per_epoch(ROWS, args.batch)

    def epoch(augment):
        batches = training.shuffled_batches(x, y, args.batch, 10, seed=0)
        batches = training.augmented_batches(batches, config, seed=0) if augment else batches.prefetch(-1)
        return lambda: sum(1 for _ in batches)

    model = training.compile_recipe(training.recipe_network(config, x, 10), config.replace(optimizer="sgd"), steps)
    sample = list(training.augmented_batches(training.shuffled_batches(x, y, args.batch, 10, seed=0), config, seed=0)
                  .take(args.steps))
    model.train_on_batch(*sample[0])  # the trace and compile, untimed

    def train():
        for images, labels in sample:
            model.train_on_batch(images, labels)

    rows = {"batches only": [], "batches + augmentation": [], "training step": []}
    for _ in range(args.rounds):
        rows["batches only"].append(timed(epoch(False))[1:])
        rows["batches + augmentation"].append(timed(epoch(True))[1:])
        _, wall, cpu = timed(train)
        rows["training step"].append((wall * steps / args.steps, cpu * steps / args.steps))
    print(f"per epoch of {ROWS} rows in batches of {args.batch} ({steps} steps), medians of {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| part | wall s | CPU s |\n|---|---|---|")
    medians = {name: np.median(np.array(values), axis=0) for name, values in rows.items()}
    for name, (wall, cpu) in medians.items():
        print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    augmentation = medians["batches + augmentation"][1]
    print(f"pipeline with augmentation / training step, CPU seconds: {augmentation / medians['training step'][1]:.3f}")


if __name__ == "__main__":
    main()
