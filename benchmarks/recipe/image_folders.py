"""`kadapt train` on Fashion-MNIST written as PNG class folders, against the same rows as arrays.

Arms (the same `kadapt train` flags, the same seed; each a subprocess):
  arrays    `--data fm.npz`: the rows as uint8 arrays (kadapt scales them to [0, 1])
  folders   `--data train/ --test test/`: the rows as PNG files `train/C_NAME/ROW.png`, decoded by
            kadapt's tf.data pipeline (decode -> Resizing -> Rescaling), the size chosen from the files
  streamed  the folders arm with `--stream on`: the decoded images written to a scratch file and
            trained from it a window of blocks at a time, as a folder larger than memory is
The arrays arm gets its training rows in the order the folders arm's seeded file order gives them, so
both train the same rows in the same order and hold out the same validation rows; the class folders
are named `0_t-shirt` ... `9_ankle-boot` so their sorted names are the integer classes.
Figures: test accuracy, the data phase (reading; the folders arm decodes every file there, once),
the seconds per epoch, and what the decoding adds per epoch of this run (data phase difference / epochs).

    python benchmarks/recipe/image_folders.py        # ~2 minutes on 2 cores
    python benchmarks/recipe/image_folders.py --seeds 6   # and folders vs streamed over seeds 0-5 (~5 minutes)
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TRAIN_ROWS, TEST_ROWS = 6000, 1000
ROUNDS = 3  # the arms alternate round by round; the table holds medians (a shared 2-core host is noisy)
EPOCHS, SEED, MODEL = 2, 0, "small_cnn"
CLASS_NAMES = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot")
# Adam: the recipe's SGD at 0.2 (measured on fast_resnet, with BatchNorm) left small_cnn at chance (10.5%)
# in both arms on 2026-12-06; the comparison is of the data path, so both arms take a rate that learns.
OPTIMIZER = "adam"
FLAGS = ["--model", MODEL, "--epochs", str(EPOCHS), "--seed", str(SEED), "--meta", "off", "--fit-verbose", "2",
         "--precision", "float32", "--optimizer", OPTIMIZER]
ROOT = Path(__file__).resolve().parents[2]


def write_folders(folder, x, y):
    """`folder/C_NAME/ROW.png` for each row; returns the paths in row order."""
    import tensorflow as tf

    paths = []
    for row, (image, label) in enumerate(zip(x, y)):
        path = folder / f"{label}_{CLASS_NAMES[label]}" / f"{row:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_png(image[..., None]).numpy())
        paths.append(path)
    return paths


def folder_order(folder):
    """The rows of `folder` in the order the folders arm trains them (its seeded file order)."""
    from kadapt.run.image_folders import class_folder_files
    from kadapt.run.image_folders import seeded_file_split

    files, labels = class_folder_files(folder)
    (train, _), _ = seeded_file_split(files, labels, SEED, test_fraction=0)
    return np.array([int(Path(f).stem) for f in train])


def train(arm, data, out, seed=SEED):
    flags = [str(seed) if i and FLAGS[i - 1] == "--seed" else flag for i, flag in enumerate(FLAGS)]
    command = [sys.executable, "-m", "kadapt", "train", *data, *flags, "--out", str(out)]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        sys.exit(f"{arm}: {done.stderr[-3000:]}")
    record = json.loads((out / "run.json").read_text())
    seconds = record["seconds"]
    images = [line for line in done.stdout.splitlines() if line.startswith("images:")]
    return {"arm": arm, "accuracy": record["test_accuracy"], "data_s": seconds["data"],
            "epoch_s": (seconds["first step"] + seconds["epochs"]) / EPOCHS, "wall_s": time.time() - started,
            "size": images[0] if images else ""}


def main():
    from kadapt.datasets import fashion_mnist

    (x, y), (x_test, y_test) = fashion_mnist()
    x, y, x_test, y_test = x[:TRAIN_ROWS], y[:TRAIN_ROWS], x_test[:TEST_ROWS], y_test[:TEST_ROWS]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        started = time.time()
        write_folders(scratch / "train", x, y)
        write_folders(scratch / "test", x_test, y_test)
        print(f"wrote {TRAIN_ROWS + TEST_ROWS} PNGs in {time.time() - started:.1f} s")
        order = folder_order(scratch / "train")
        np.savez(scratch / "fm.npz", x_train=x[order], y_train=y[order], x_test=x_test, y_test=y_test)
        arms = {"arrays": ["--data", str(scratch / "fm.npz")],
                "folders": ["--data", str(scratch / "train"), "--test", str(scratch / "test")],
                "streamed": ["--data", str(scratch / "train"), "--test", str(scratch / "test"), "--stream", "on"]}
        rounds = [[train(arm, data, scratch / f"{arm}{r}") for arm, data in arms.items()] for r in range(ROUNDS)]
        if "--seeds" in sys.argv:  # the streamed arm's accuracy against the folders arm's over seeds 0..N-1
            seeds = range(int(sys.argv[sys.argv.index("--seeds") + 1]))
            for arm in ("folders", "streamed"):
                accuracies = [train(arm, arms[arm], scratch / f"{arm}-seed{seed}", seed)["accuracy"] for seed in seeds]
                print(f"{arm}, seeds 0-{len(seeds) - 1}: {' / '.join(f'{a:.4f}' for a in accuracies)}, "
                      f"mean {statistics.mean(accuracies):.4f}")
    print("| arm | test accuracy (each round) | data phase, s | fit s per epoch (each round) | run wall, s |")
    print("|---|---|---|---|---|")
    medians = {}
    for i, arm in enumerate(arms):
        runs = [one[i] for one in rounds]
        medians[arm] = {key: statistics.median(r[key] for r in runs) for key in ("data_s", "epoch_s", "wall_s")}
        accuracies = " / ".join(f"{r['accuracy']:.4f}" for r in runs)
        epochs = " / ".join(f"{r['epoch_s']:.1f}" for r in runs)
        m = medians[arm]
        print(f"| {arm} | {accuracies} | {m['data_s']:.1f} | {m['epoch_s']:.1f} ({epochs}) | {m['wall_s']:.0f} |")
    once = medians["folders"]["data_s"] - medians["arrays"]["data_s"]
    print(f"decoding adds {once / EPOCHS:.2f} s per epoch of this {EPOCHS}-epoch run ({once:.1f} s once, medians of "
          f"{ROUNDS} rounds); {rounds[0][1]['size']}")


if __name__ == "__main__":
    main()
