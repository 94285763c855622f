"""Embeddings (IndexedSlices gradients) under adaptive optimizers: exact.

Keras' Adam, RMSprop and AdamW square each slice of a sparse gradient before
summing duplicate rows, so the update depends on how the slices are grouped,
not only on their sum. kadapt hands the optimizer the full batch's slices.
"""

import keras
import numpy as np
import pytest

import kadapt

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.05),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.01),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
}


@keras.saving.register_keras_serializable(package="kadapt_tests")
class AddPositions(keras.layers.Layer):
    """Adds a learned vector per position: one lookup of rows 0..length-1
    whatever the data, so its gradient slices sum over all rows."""

    def build(self, input_shape):
        self.positions = keras.layers.Embedding(input_shape[1], input_shape[2])

    def call(self, x):
        return x + self.positions(keras.ops.arange(keras.ops.shape(x)[1]))


def _model():
    """Token embeddings (six tokens over 60 lookups: many duplicates) and positions."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,), dtype="int32")
    x = AddPositions()(keras.layers.Embedding(6, 4)(inputs))
    outputs = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, outputs)


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(0, 6, size=(24, 5)), rng.normal(size=(24, 1)).astype("float32")


def _train(optimizer, jit_compile, micro_batch_size=None, reverse=False):
    model = _model()
    x, y = _data()
    if reverse:  # the same batches of 12, their rows in reverse order
        x, y = (np.concatenate([a[:12][::-1], a[12:][::-1]]) for a in (x, y))
    trainer = model if micro_batch_size is None else kadapt.accumulate(model, micro_batch_size)
    trainer.compile(OPTIMIZERS[optimizer](), "mse", jit_compile=jit_compile)
    trainer.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


def _largest_difference(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))


def _check(optimizer, jit_compile):
    """Within 1e-6 of the full batch, or of plain Keras' own float noise with
    each batch's rows reordered (10x)."""
    full = _train(optimizer, jit_compile)
    difference = _largest_difference(full, _train(optimizer, jit_compile, micro_batch_size=5))  # 5 + 5 + 2
    if difference > 1e-6:
        assert difference <= 10 * _largest_difference(full, _train(optimizer, jit_compile, reverse=True))


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_embeddings_train_as_on_the_full_batch(optimizer):
    _check(optimizer, jit_compile=False)


def test_embeddings_train_as_on_the_full_batch_under_xla():
    _check("adam", jit_compile=True)
