"""One process of a distributed `AccumulatingHyperModel` search, for
tests/test_distributed_search.py: the same script in the chief and in each
worker, KerasTuner's `KERASTUNER_*` variables telling them apart.

Run: `python tests/distributed_accumulating_search.py DIRECTORY MAX_TRIALS`.
Every process marks each trial it ends in DIRECTORY/ran/ (`<trial id>.<tuner
id>`); the chief saves the best model as DIRECTORY/best.keras.
"""

import sys
from pathlib import Path

from kadapt import environment

environment.configure_tensorflow()

import keras  # noqa: E402
import keras_tuner  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402

MICRO_BATCH_SIZE = 4
BATCH_SIZES = [8, 16, 32]
ROWS = 64
VALIDATION_SPLIT = 0.25  # Keras holds out the last rows


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


def main(directory, max_trials):
    x, y = data()
    search = kadapt.tuning.distributed_search()
    worker = search is not None and not search.is_chief
    (directory / "ran").mkdir(parents=True, exist_ok=True)
    hyper_model = kadapt.tuning.AccumulatingHyperModel(build_model, MICRO_BATCH_SIZE, BATCH_SIZES)
    tuner = MarkingSearch(hyper_model, objective="val_loss", max_trials=max_trials, seed=0,
                          directory=directory, project_name="batch_size", overwrite=not worker,
                          marks=directory / "ran")
    tuner.search(x, y, epochs=2, validation_split=VALIDATION_SPLIT, verbose=0)
    if not worker:
        tuner.get_best_models(1)[0].save(directory / "best.keras")
        print(f"{tuner.tuner_id} saved {directory / 'best.keras'}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
