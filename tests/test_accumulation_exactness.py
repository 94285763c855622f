"""k micro-batches in one step == one full-batch step (the oracle is plain Keras)."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import classification_data
from helpers import compile_classifier
from helpers import max_relative_difference
from helpers import mlp

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _fit_pair(micro_batch_size, batch_size, epochs=1, jit_compile="auto", **fit_kwargs):
    x, y = classification_data()
    plain = compile_classifier(mlp(), jit_compile=jit_compile)
    accumulated = kadapt.accumulate(compile_classifier(mlp(), jit_compile=jit_compile), micro_batch_size)
    kwargs = dict(batch_size=batch_size, epochs=epochs, verbose=0, shuffle=False)
    kwargs.update(fit_kwargs)
    plain_history = plain.fit(x, y, **kwargs)
    accumulated_history = accumulated.fit(x, y, **kwargs)
    return plain, accumulated, plain_history, accumulated_history


# XLA: as Keras runs the step on a GPU (`jit_compile="auto"` is True there).
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_one_step_with_ragged_tail_sample_weights_and_regularizer(jit_compile):
    rng = np.random.default_rng(1)
    weights = rng.uniform(0.1, 2.0, size=37).astype("float32")
    plain, accumulated, _, _ = _fit_pair(4, 37, jit_compile=jit_compile, sample_weight=weights)
    assert accumulated.jit_compile == jit_compile
    assert int(accumulated.optimizer.iterations) == 1
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-6


def test_several_epochs_with_class_weights():
    class_weight = {0: 0.5, 1: 2.0, 2: 1.0}
    plain, accumulated, _, _ = _fit_pair(3, 16, epochs=4, class_weight=class_weight)
    assert int(accumulated.optimizer.iterations) == 4 * 3
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5


def test_reported_loss_and_metrics_equal_full_batch():
    _, _, plain_history, accumulated_history = _fit_pair(5, 16, epochs=2)
    assert plain_history.history.keys() == accumulated_history.history.keys()
    for key, values in plain_history.history.items():
        np.testing.assert_allclose(accumulated_history.history[key], values, rtol=1e-6)


def test_activity_regularizer_and_multiple_outputs():
    def build():
        keras.utils.set_random_seed(3)
        inputs = keras.Input((5,))
        hidden = keras.layers.Dense(8, activation="relu", activity_regularizer="l2")(inputs)
        first = keras.layers.Dense(3, name="first")(hidden)
        second = keras.layers.Dense(1, name="second")(hidden)
        return inputs, [first, second]

    x, y = classification_data()
    targets = [y, np.linspace(-1, 1, len(y)).astype("float32")]
    compile_kwargs = dict(
        optimizer="adam",
        loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
        loss_weights=[1.0, 0.5],
    )
    plain = keras.Model(*build())
    plain.compile(**compile_kwargs)
    accumulated = kadapt.AccumulatingModel(*build(), micro_batch_size=6)
    accumulated.compile(**compile_kwargs)
    for model in (plain, accumulated):
        model.fit(x, targets, batch_size=37, epochs=3, verbose=0, shuffle=False)
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5
