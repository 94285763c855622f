"""`kadapt train --data digits` with no other flag against a plain Keras MLP on the same split.

Arms (each over --seeds; the split of scikit-learn's 8x8 digits is the seed's, the same for all arms):
  kadapt        `kadapt train --data digits` with its defaults (what `--augment auto` does to 8x8 images)
  augment_on    the same with `--augment on`: 2/28 random shifts and test-time 1-pixel shifts
  augment_off   the same with `--augment off`
  keras_mlp     plain Keras: Flatten-Dense(128, relu)-Dense(10), Adam 1e-3, batch 32, 30 epochs,
                on all the training rows (kadapt holds out the last 10% for validation)

Each kadapt arm is the command itself, in a subprocess; its test accuracy is the one it writes to
run.json. Prints one row per arm: the test accuracy per seed and the mean.

    python benchmarks/recipe/digits_defaults.py              # seeds 0 1 2, about 3 minutes on 2 cores
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = {"kadapt": [], "augment_on": ["--augment", "on"], "augment_off": ["--augment", "off"]}
MLP_EPOCHS, MLP_BATCH = 30, 32


def kadapt_accuracy(flags, seed, work):
    out = Path(work) / f"{'_'.join(flags) or 'default'}-{seed}"
    command = [sys.executable, "-m", "kadapt.cli", "train", "--data", "digits", "--seed", str(seed),
               "--out", str(out), *flags]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return json.loads((out / "run.json").read_text())["test_accuracy"]


def keras_mlp_accuracy(seed):
    import keras

    from kadapt.run.data import load_arrays

    train, test = load_arrays("digits", seed)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input(train[0].shape[1:]), keras.layers.Flatten(),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(*train, batch_size=MLP_BATCH, epochs=MLP_EPOCHS, verbose=0)
    return model.evaluate(*test, verbose=0)[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    seeds = parser.parse_args().seeds
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        for arm, flags in ARMS.items():
            rows[arm] = [kadapt_accuracy(flags, seed, work) for seed in seeds]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kadapt import environment

    environment.load_tensorflow()
    rows["keras_mlp"] = [keras_mlp_accuracy(seed) for seed in seeds]
    print(f"| arm | {' | '.join(f'seed {seed}' for seed in seeds)} | mean |")
    print(f"|---|{'---|' * (len(seeds) + 1)}")
    for arm, accuracies in rows.items():
        cells = " | ".join(f"{accuracy:.4f}" for accuracy in accuracies)
        print(f"| {arm} | {cells} | {sum(accuracies) / len(accuracies):.4f} |")


if __name__ == "__main__":
    main()
