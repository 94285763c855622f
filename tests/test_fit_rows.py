"""`FitRows`: the rows a callback samples from fit's batches are fit's own rows, every one alike likely,
and training is bit for bit what it is untapped."""

import keras
import numpy as np
import pytest

from kadapt.meta.live.fit_rows import FitRows


class Tap(keras.callbacks.Callback):
    """Samples the first epoch, as the MetaAdjuster does."""

    def __init__(self, max_rows):
        super().__init__()
        self.rows = FitRows(max_rows=max_rows, seed=0)

    def on_train_begin(self, logs=None):
        self.original = self.model.train_function
        self.rows.tap(self.model)

    def on_epoch_end(self, epoch, logs=None):
        self.rows.untap()


def model(jit_compile=False):
    keras.utils.set_random_seed(0)
    network = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    network.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", jit_compile=jit_compile,
                    steps_per_execution=3)
    return network


def rows():
    """Row i is (i, -i) with label i % 3: a row and its label can be checked against each other."""
    index = np.arange(100)
    return np.stack([index, -index], axis=1).astype("float32"), index % 3


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_sample_holds_fits_rows_with_their_targets_and_training_is_unchanged(jit_compile):
    x, y = rows()
    untapped = model(jit_compile)
    untapped.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    tapped, tap = model(jit_compile), Tap(max_rows=50)
    tapped.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[tap])
    for a, b in zip(tapped.get_weights(), untapped.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert tapped.train_function is tap.original  # put back after the first epoch
    sample_x, sample_y = tap.rows.arrays()
    assert (tap.rows.seen, tap.rows.rows, tap.rows.batch_size) == (100, 50, 8)
    index = sample_x[:, 0].astype(int)
    np.testing.assert_array_equal(sample_x[:, 1], -index)
    np.testing.assert_array_equal(sample_y, index % 3)
    assert len(set(index)) == 50 and index.max() >= 50  # a reservoir over the epoch, not its first rows


def test_a_generator_sorted_by_class_is_sampled_across_the_epoch():
    """The generator yields 60 rows of class 0, then 60 of class 1: a reservoir of 30 holds both."""
    x = np.zeros((120, 2), "float32")
    y = np.repeat([0, 1], 60)

    def batches():
        while True:
            for start in range(0, 120, 10):
                yield x[start:start + 10], y[start:start + 10]

    tap = Tap(max_rows=30)
    model().fit(batches(), steps_per_epoch=12, epochs=1, verbose=0, callbacks=[tap])
    counts = np.bincount(tap.rows.arrays()[1], minlength=2)
    assert counts.sum() == 30 and counts.min() >= 5
