"""The training problem of tests/test_multi_worker.py, shared by the workers and the oracle:
71 rows (the last batch of 16 has 7, split 4/3 over two workers; micro-batches of 3 leave
ragged tails), SGD with momentum and a cosine schedule counted in logical steps."""

import keras
import numpy as np

import kadapt

ROWS, BATCH, MICRO, EPOCHS = 71, 16, 3, 3
STEPS = EPOCHS * -(-ROWS // BATCH)


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, 5)).astype("float32"), rng.integers(0, 3, ROWS).astype("int32")


def network():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


def compile_model(model):
    schedule = kadapt.CosineAnnealing(lr_max=0.2, lr_min=0.01, total_steps=STEPS)
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
