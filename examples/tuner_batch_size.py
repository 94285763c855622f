"""Search the logical batch size (and learning rate) with KerasTuner while the
micro-batch, and so the memory, stays fixed.

Run: `.venv/bin/python examples/tuner_batch_size.py` (KerasTuner: `pip install "kadapt[tuner]"`;
`make install` has it)
"""

import tempfile

import keras
import keras_tuner

import kadapt

MICRO_BATCH_SIZE = 64
BATCH_SIZES = [64, 256, 1024]
TRAIN_ROWS = 12_000
MAX_TRIALS = 4


def build_model(hp):
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            keras.layers.Dense(hp.Choice("units", [64, 256]), activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(hp.Float("learning_rate", 1e-3, 1e-2, sampling="log")),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main():
    (x_train, y_train), _ = kadapt.datasets.fashion_mnist()
    x = x_train[:TRAIN_ROWS].astype("float32") / 255.0
    y = y_train[:TRAIN_ROWS]
    hyper_model = kadapt.tuning.AccumulatingHyperModel(
        build_model, micro_batch_size=MICRO_BATCH_SIZE, batch_sizes=BATCH_SIZES
    )
    with tempfile.TemporaryDirectory() as directory:
        tuner = keras_tuner.RandomSearch(
            hyper_model,
            objective="val_accuracy",
            max_trials=MAX_TRIALS,
            directory=directory,
            seed=0,
        )
        tuner.search(x, y, epochs=2, validation_split=0.2, verbose=0)
        tuner.results_summary(num_trials=MAX_TRIALS)


if __name__ == "__main__":
    main()
