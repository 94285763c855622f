"""Peak memory of an accumulating step is that of one micro-batch."""

import keras
import numpy as np
import tensorflow as tf

import kadapt

MICRO = 32
MEASURED_STEPS = 5  # a CPU step's peak varies from run to run; the median of five is steady


def _cnn(micro_batch_size):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1))
    hidden = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    hidden = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(hidden)
    hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    outputs = keras.layers.Dense(10)(hidden)
    model = kadapt.AccumulatingModel(inputs, outputs, micro_batch_size=micro_batch_size)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _peak_bytes(model, rows):
    """Median over `MEASURED_STEPS` (already traced) train steps of the bytes a step adds on CPU:0.

    The peak counts everything alive in the process (tensors left by earlier tests in the same
    worker included), so the step's own memory is the peak less what was in use before it.
    """
    x = np.random.default_rng(0).normal(size=(rows, 28, 28, 1)).astype("float32")
    y = np.zeros(rows, "int32")
    model.train_on_batch(x, y)
    peaks = []
    for _ in range(MEASURED_STEPS):
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        model.train_on_batch(x, y)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
    return float(np.median(peaks))


def test_peak_at_four_micro_batches_stays_within_twenty_percent():
    one = _peak_bytes(_cnn(MICRO), MICRO)
    four = _peak_bytes(_cnn(MICRO), 4 * MICRO)
    # The measurement sees activations: one big batch of 4m needs far more.
    big = _peak_bytes(_cnn(4 * MICRO), 4 * MICRO)
    assert big > 2.0 * one
    assert four <= 1.2 * one
