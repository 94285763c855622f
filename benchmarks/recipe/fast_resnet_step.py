"""Training-step time of `fast_resnet` on Fashion-MNIST-shaped data: the network as built now
(1x1 convolutions where a stage's image is 1x1) against the same network with 3x3 kernels there
(as built before), alternating in one process; and the two networks' outputs from equal weights.

    python benchmarks/recipe/fast_resnet_step.py [--batch 256] [--rounds 7] [--steps 20]
"""

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import alternate  # noqa: E402
from harness import ratio_lines  # noqa: E402
from kadapt import environment  # noqa: E402

environment.load_tensorflow()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from kadapt.recipes import training  # noqa: E402
from kadapt.recipes.config import FastFitConfig  # noqa: E402

module = importlib.import_module("kadapt.models.fast_resnet")  # the module, not the function it exports
CURRENT = module._combination


def three_by_three(x, filters, pool=False, *, identity_init, freeze_bn_scale, bias_lr_multiplier):
    """The combination layer before the change: 3x3 kernels at every resolution."""
    initializer = module.PartialIdentity() if identity_init else "glorot_uniform"
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=initializer)(x)
    if pool:
        x = keras.layers.MaxPooling2D()(x)
    return module._normalize_and_activate(x, freeze_bn_scale, bias_lr_multiplier)


def build(combination, images, seed=0):
    module._combination = combination
    try:
        keras.utils.set_random_seed(seed)
        model = training.recipe_network(FastFitConfig(), images, 10)
    finally:
        module._combination = CURRENT
    return training.compile_recipe(model, FastFitConfig(optimizer="sgd"), 1000)  # the recipe's for fast_resnet


def synthetic_batch(batch):
    """5,000 Fashion-MNIST-shaped random images (the whitening's sample), and `batch` of them with
    one-hot labels of 10 classes."""
    rng = np.random.default_rng(0)
    images = rng.random((5000, 28, 28, 1), dtype=np.float32)
    return images, images[:batch], training.one_hot(rng.integers(0, 10, batch), 10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    images, x, y = synthetic_batch(args.batch)
    models = {"1x1 at 1x1 images (now)": build(CURRENT, images), "3x3 everywhere (before)": build(three_by_three, images)}
    now, before = models.values()
    weights = [w[1:2, 1:2] if w.shape[:2] == (3, 3) and v.shape[:2] == (1, 1) else w
               for w, v in zip(before.get_weights(), now.get_weights(), strict=True)]
    same_init = all(np.array_equal(a, b) for a, b in zip(weights, now.get_weights(), strict=True))
    now.set_weights(weights)
    gap = np.max(np.abs(now.predict(x, verbose=0) - before.predict(x, verbose=0)))
    print(f"same initial values: {same_init}; outputs from equal weights differ by at most {gap:.2e}")
    times = alternate(models, x, y, args.rounds, args.steps, warmup_steps=3)
    for name, median, fastest, slowest, ratio in ratio_lines(times, "3x3 everywhere (before)"):
        print(f"{name:26s} {1000 * median:7.1f} ms per step of {args.batch} "
              f"(spread {1000 * fastest:.1f}-{1000 * slowest:.1f}), {ratio:.3f}x")


if __name__ == "__main__":
    main()
