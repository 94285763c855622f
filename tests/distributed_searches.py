"""One process of the two distributed searches of tests/test_distributed_search.py,
the same script in the chief and in each worker, KerasTuner's `KERASTUNER_*`
variables telling them apart: `kadapt meta train`, then an
`AccumulatingHyperModel` search. Both searches share the processes, so that
each pays TensorFlow's import once.

Run: `python tests/distributed_searches.py DIRECTORY MAX_TRIALS META_PORT PORT
KADAPT_ARGUMENTS...`: `kadapt KADAPT_ARGUMENTS` (its search served on META_PORT),
then the `AccumulatingHyperModel` search on PORT. Every process marks each
trial of the latter it ends in DIRECTORY/ran/ (`<trial id>.<tuner id>`); the
chief saves its best model as DIRECTORY/best.keras.
"""

import os
import socket
import sys
import time
from pathlib import Path

from kadapt import environment

environment.configure_tensorflow()

import keras  # noqa: E402
import keras_tuner  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt import cli  # noqa: E402

MICRO_BATCH_SIZE = 4
BATCH_SIZES = [8, 16, 32]
ROWS = 64
VALIDATION_SPLIT = 0.25  # Keras holds out the last rows
CHIEF_WAIT_SECONDS = 120  # the chief reports and saves the meta-model before it serves the second search


class MarkingSearch(keras_tuner.RandomSearch):
    """`RandomSearch` that leaves a file for each trial this process ends."""

    def __init__(self, *args, marks, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks = marks

    def on_trial_end(self, trial):
        super().on_trial_end(trial)
        (self.marks / f"{trial.trial_id}.{self.tuner_id}").touch()


def build_model(hp):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(hp.Choice("learning_rate", [0.05, 0.2])),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, 4)).astype("float32"), rng.integers(0, 3, ROWS)


def wait_until_listening(port):
    # A worker that finds the port closed retries after a growing gRPC
    # backoff, and the other worker may meanwhile take every trial.
    deadline = time.monotonic() + CHIEF_WAIT_SECONDS
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            sys.exit(f"the chief did not serve on port {port} within {CHIEF_WAIT_SECONDS} s")
        time.sleep(0.1)


def accumulating_search(directory, max_trials, worker):
    x, y = data()
    (directory / "ran").mkdir(parents=True, exist_ok=True)
    hyper_model = kadapt.tuning.AccumulatingHyperModel(build_model, MICRO_BATCH_SIZE, BATCH_SIZES)
    tuner = MarkingSearch(hyper_model, objective="val_loss", max_trials=max_trials, seed=0,
                          directory=directory, project_name="batch_size", overwrite=not worker,
                          marks=directory / "ran")
    tuner.search(x, y, epochs=2, validation_split=VALIDATION_SPLIT, verbose=0)
    if not worker:
        tuner.get_best_models(1)[0].save(directory / "best.keras")
        print(f"{tuner.tuner_id} saved {directory / 'best.keras'}", flush=True)


def main(directory, max_trials, meta_port, port, kadapt_arguments):
    os.environ["KERASTUNER_ORACLE_PORT"] = meta_port
    status = cli.main(kadapt_arguments)
    if status:
        sys.exit(status)
    os.environ["KERASTUNER_ORACLE_PORT"] = port
    worker = not kadapt.tuning.distributed_search().is_chief
    if worker:
        wait_until_listening(int(port))
    accumulating_search(directory, max_trials, worker)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:])
