"""One fit step is one logical batch; the micro-batch size changes live."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import classification_data
from helpers import compile_classifier
from helpers import max_relative_difference
from helpers import mlp

pytestmark = pytest.mark.backends("tensorflow", "jax")


class BatchCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


class CallCounter(keras.layers.Layer):
    """Identity layer that counts its training calls (one per micro-batch)."""

    def build(self, input_shape):
        self.calls = self.add_weight(
            shape=(), initializer="zeros", dtype="int32", trainable=False
        )

    def call(self, inputs, training=None):
        if training:
            self.calls.assign_add(1)
        return inputs


def test_iterations_callbacks_history_and_schedule_count_logical_steps():
    x, y = classification_data()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=1, decay_rate=0.5)

    def build():
        model = mlp()
        model.compile(
            optimizer=keras.optimizers.SGD(schedule),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    plain = build()
    accumulated = kadapt.accumulate(build(), 4)
    counter = BatchCounter()
    plain.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    history = accumulated.fit(
        x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=[counter]
    )
    assert int(accumulated.optimizer.iterations) == 6
    assert counter.batches == 6
    assert len(history.history["loss"]) == 2
    # The schedule advanced once per logical batch, so the learning rates
    # (and so the weights) match the plain run's.
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5


def _counting_model(micro_batch_size):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    counted = CallCounter()(inputs)
    outputs = keras.layers.Dense(3)(counted)
    model = kadapt.AccumulatingModel(inputs, outputs, micro_batch_size=micro_batch_size)
    return compile_classifier(model), model.layers[1]


def test_micro_batch_size_change_takes_effect_at_the_next_step():
    x, y = classification_data(rows=24)

    class Shrink(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.model.micro_batch_size = 6

    model, counter = _counting_model(micro_batch_size=4)
    model.fit(x, y, batch_size=12, epochs=1, verbose=0, shuffle=False, callbacks=[Shrink()])
    # Step 1: 12 rows in micro-batches of 4 (3 calls); step 2: of 6 (2 calls).
    assert int(counter.calls.numpy()) == 3 + 2
    model.micro_batch_size = 5
    model.fit(x[:12], y[:12], batch_size=12, epochs=1, verbose=0, shuffle=False)
    assert int(counter.calls.numpy()) == 5 + 3  # 5 + 5 + a ragged 2


def test_ragged_tail_and_single_micro_batch_call_counts():
    x, y = classification_data(rows=12)
    model, counter = _counting_model(micro_batch_size=12)
    model.fit(x, y, batch_size=12, epochs=1, verbose=0)
    assert int(counter.calls.numpy()) == 1
    model, counter = _counting_model(micro_batch_size=50)
    model.fit(x, y, batch_size=12, epochs=1, verbose=0)
    assert int(counter.calls.numpy()) == 1


@pytest.mark.parametrize(
    "compile_kwargs", [{"jit_compile": True}, {"steps_per_execution": 3}], ids=["xla", "steps3"]
)
def test_jit_compile_and_steps_per_execution_match_plain(compile_kwargs):
    x, y = classification_data()
    plain = compile_classifier(mlp(), **compile_kwargs)
    accumulated = compile_classifier(
        kadapt.AccumulatingModel(*_functional_graph(), micro_batch_size=3), **compile_kwargs
    )
    for model in (plain, accumulated):
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    assert int(accumulated.optimizer.iterations) == 6
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5


def _functional_graph():
    model = mlp()
    return model.inputs, model.outputs


def test_batch_norm_moving_statistics_keep_the_logical_step_horizon():
    momentum, micro, rows = 0.9, 4, 12
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    normalized = keras.layers.BatchNormalization(momentum=momentum)(inputs)
    outputs = keras.layers.Dense(1)(normalized)
    model = kadapt.AccumulatingModel(inputs, outputs, micro_batch_size=micro)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(rows, 3)).astype("float32")
    model.fit(x, np.zeros((rows, 1)), batch_size=rows, epochs=1, verbose=0, shuffle=False)

    # Oracle: each micro-batch updates with momentum ** (1 / k), k = 3.
    per_micro = momentum ** (1 / 3)
    mean, variance = np.zeros(3), np.ones(3)
    for chunk in np.split(x.astype("float64"), rows // micro):
        mean = mean * per_micro + chunk.mean(0) * (1 - per_micro)
        variance = variance * per_micro + chunk.var(0) * (1 - per_micro)
    layer = model.layers[1]
    np.testing.assert_allclose(layer.moving_mean.numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), variance, rtol=1e-5)
    assert layer.momentum == momentum  # the config is untouched
