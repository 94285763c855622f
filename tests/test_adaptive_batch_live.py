"""AdaptiveBatchSize.dataset: the batch size changes inside a running fit."""

import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt

ROWS = 600


class _Scripted(kadapt.AdaptiveBatchSize):
    """Takes its sizes from a script instead of the goodput model."""

    def __init__(self, sizes, **kwargs):
        super().__init__(32, 512, initial_batch_size=sizes[0], **kwargs)
        self.script = list(sizes[1:])

    def candidates(self):
        return [self.script.pop(0) if self.script else self.batch_size]

    def step_cost(self):
        return 1.0, 1.0


class _Record(keras.layers.Layer):
    """Passes its input through and appends it to `seen` (row ids)."""

    def __init__(self, seen):
        super().__init__()
        self.append = seen.extend  # a bound method: Keras would copy a list attribute

    def call(self, ids):
        recorded = tf.py_function(self._record, [ids], tf.float32)
        recorded.set_shape(ids.shape)
        return recorded

    def _record(self, ids):
        self.append(ids.numpy().ravel().astype(int).tolist())
        return ids

    def compute_output_shape(self, input_shape):
        return input_shape


def _recording_model(seen):
    """A model whose input is the row id; every row trained is recorded."""
    inputs = keras.Input((1,))
    recorded = _Record(seen)(inputs)
    model = kadapt.AccumulatingModel(inputs, keras.layers.Dense(1)(recorded), micro_batch_size=16,
                                     measure_noise=True)
    model.compile(optimizer=kadapt.optimizers.SGD(0.0), loss="mse")
    return model


@pytest.mark.parametrize("sizes", [[32, 64, 128, 512], [512, 256, 64, 32, 32, 64]], ids=["growing", "shrinking"])
def test_every_row_is_trained_once_per_pass_while_the_batch_changes(sizes):
    seen = []
    model = _recording_model(seen)
    adaptive = _Scripted(sizes, interval=3)
    ids = np.arange(ROWS, dtype="float32")[:, None]
    model.fit(adaptive.dataset(ids, np.zeros_like(ids), seed=0), epochs=4, verbose=0, callbacks=[adaptive])
    trained = sorted({b for b, _ in adaptive.step_times})
    assert len(trained) >= 3  # the size did change inside the fit
    passes = [seen[i:i + ROWS] for i in range(0, len(seen), ROWS)]
    assert len(passes) >= 3
    for rows in passes[:-1]:
        assert sorted(rows) == list(range(ROWS))
    assert len(set(passes[-1])) == len(passes[-1])  # a pass cut short: nothing twice
    assert passes[0] != passes[1]  # a new order every pass


def test_each_size_gets_its_learning_rate_from_its_first_step():
    seen = []

    class Rates(keras.callbacks.Callback):
        """(rows the step trained, as the model saw them; its learning rate)."""

        def __init__(self):
            super().__init__()
            self.steps = []

        def on_train_batch_begin(self, batch, logs=None):
            self.rate, self.before = float(self.model.optimizer.learning_rate_multiplier.numpy()), len(seen)

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append((len(seen) - self.before, self.rate))

    model = _recording_model(seen)
    adaptive = _Scripted([32, 128, 64, 512], interval=2)
    rates = Rates()
    ids = np.arange(ROWS, dtype="float32")[:, None]
    model.fit(adaptive.dataset(ids, np.zeros_like(ids), seed=0), epochs=2, verbose=0,
              callbacks=[adaptive, rates])
    assert {32, 128, 512, 64} <= {rows for rows, _ in rates.steps}
    for rows, rate in rates.steps:  # sqrt rule from B0 = 32, ragged last batches included
        assert rate == pytest.approx(math.sqrt(rows / 32), rel=1e-6)


def test_dataset_refuses_mismatched_rows():
    adaptive = kadapt.AdaptiveBatchSize(32, 64)
    with pytest.raises(ValueError, match=r"same number \(> 0\) of rows. Received: x.shape=\(10, 2\), y.shape=\(9,\)"):
        adaptive.dataset(np.zeros((10, 2)), np.zeros(9))
    with pytest.raises(ValueError, match=r"`interval` must be in \[1, None\]. Received: interval=0"):
        kadapt.AdaptiveBatchSize(32, 64, interval=0)


def test_a_dataset_read_ahead_or_capped_is_refused():
    ids = np.arange(ROWS, dtype="float32")[:, None]
    adaptive = _Scripted([32], interval=3)
    with pytest.raises(ValueError, match=r"was read ahead of training .* pass it to `fit` as it is"):
        _recording_model([]).fit(adaptive.dataset(ids, np.zeros_like(ids), seed=0).prefetch(4), epochs=1,
                                 verbose=0, callbacks=[adaptive])
    adaptive = _Scripted([32], interval=3)
    with pytest.raises(ValueError, match=r"without `steps_per_epoch`. Received: steps_per_epoch=5"):
        _recording_model([]).fit(adaptive.dataset(ids, np.zeros_like(ids), seed=0), steps_per_epoch=5,
                                 verbose=0, callbacks=[adaptive])
    adaptive = _Scripted([32], interval=3)
    model = _recording_model([])
    model.compile(optimizer=kadapt.optimizers.SGD(0.0), loss="mse", steps_per_execution=2)
    with pytest.raises(ValueError, match=r"compile with `steps_per_execution=1`. Received: steps_per_execution=2"):
        model.fit(adaptive.dataset(ids, np.zeros_like(ids), seed=0), verbose=0, callbacks=[adaptive])


def test_a_live_fit_warns_of_nothing_and_leaves_warning_filters_as_they_were():
    model = _recording_model([])
    adaptive = _Scripted([64, 128], interval=2)
    ids = np.arange(200, dtype="float32")[:, None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(adaptive.dataset(ids, np.zeros_like(ids), seed=0), epochs=2, verbose=0,
                  callbacks=[adaptive])
        user_warnings = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert user_warnings == []  # neither "ran out of data" nor "shuffle is ignored"
        warnings.warn("Your input ran out of data", UserWarning)
        assert str(caught[-1].message) == "Your input ran out of data"  # the filter ended with the fit
