"""Training-step time of the recipe's `fast_resnet` under each numerics, alternating in one
process (Fashion-MNIST-shaped data, batch 256): float32, `mixed_bfloat16`, and both under XLA;
then what `kadapt.choose_precision` decides on this machine and how long it took (its own
measurement, shorter: 6 rounds of 3 steps).

    python benchmarks/recipe/precision_step.py [--batch 256] [--rounds 5] [--steps 12]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kadapt import environment  # noqa: E402

environment.load_tensorflow()

import keras  # noqa: E402

import kadapt  # noqa: E402
from fast_resnet_step import synthetic_batch  # noqa: E402  (the same data as the network's benchmark)
from harness import alternate  # noqa: E402
from harness import ratio_lines  # noqa: E402
from kadapt.precision import global_policy  # noqa: E402
from kadapt.precision import supported_policies  # noqa: E402
from kadapt.recipes import training  # noqa: E402
from kadapt.recipes.config import FastFitConfig  # noqa: E402

ARMS = {"float32": ("float32", False), "mixed_bfloat16": ("mixed_bfloat16", False),
        "float32 + XLA": ("float32", True), "mixed_bfloat16 + XLA": ("mixed_bfloat16", True)}


def build(images, policy=None, jit_compile=False):
    """The recipe's compiled network under `policy` (`None`: Keras' global policy, as
    `choose_precision` sets it for each policy it times)."""
    with global_policy(policy or keras.mixed_precision.global_policy().name):
        keras.utils.set_random_seed(0)
        model = training.recipe_network(FastFitConfig(), images, 10)
    model = training.compile_recipe(model, FastFitConfig(optimizer="sgd"), 1000)  # the recipe's for fast_resnet
    model.jit_compile = jit_compile
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    images, x, y = synthetic_batch(args.batch)
    print(f"supported policies here: {supported_policies()}")
    models = {name: build(images, *arm) for name, arm in ARMS.items()}
    times = alternate(models, x, y, args.rounds, args.steps, warmup_steps=2)
    print(f"{'numerics':24s} {'ms per step':>11s} {'vs float32':>10s}")
    for name, median, fastest, slowest, ratio in ratio_lines(times, "float32"):
        print(f"{name:24s} {1000 * median:11.1f} {ratio:9.2f}x  "
              f"(rounds {1000 * fastest:.1f}-{1000 * slowest:.1f} ms)")
    began = time.perf_counter()
    choice = kadapt.choose_precision(lambda: build(images), x, y, batch_size=args.batch)
    print(f"choose_precision: {choice.policy} ({choice.reason}), {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
