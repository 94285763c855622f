"""The training problem of tests/test_multi_worker.py, shared by the workers and the oracle:
71 rows (the last batch of 16 has 7, split 4/3 over two workers; micro-batches of 3 leave
ragged tails), reshuffled every epoch (seeded), SGD with momentum and a cosine schedule counted
in logical steps."""

import keras
import numpy as np
import tensorflow as tf

import kadapt

ROWS, BATCH, MICRO, EPOCHS = 71, 16, 3, 3
NOISE_MICRO = 4  # each worker's 8 rows as 2 micro-batches: the same micro-batches as one process's 16 in 4
STEPS = EPOCHS * -(-ROWS // BATCH)


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, 5)).astype("float32"), rng.integers(0, 3, ROWS).astype("int32")


def training_batches(x, y):
    """Batches in a new seeded order every epoch: the first epoch must see the first order (a
    batch drawn before training, e.g. to build the model, would shift every epoch by one)."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.shuffle(ROWS, seed=0, reshuffle_each_iteration=True).batch(BATCH)


def network():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


def compile_model(model):
    schedule = kadapt.CosineAnnealing(lr_max=0.2, lr_min=0.01, total_steps=STEPS)
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def noise_statistics(model):
    """The noise scale's averages (trace, |G|^2, their square, the weights' sums), its result and error."""
    noise = model.noise_scale
    values = [*noise.variables, noise.result(), noise.squared_norm_error()]
    return np.array([float(keras.ops.convert_to_numpy(value)) for value in values])
