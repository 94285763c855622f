"""`kadapt.meta.observe.host_reads`: host copies equal to the variables, and unmoved by later updates."""

import keras
import numpy as np
import pytest

import kadapt
from kadapt.meta.observe import host_reads
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum

pytestmark = pytest.mark.backends("tensorflow", "jax")


@pytest.mark.parametrize("count", [3, host_reads._BATCHED_FROM + 4], ids=["one_by_one", "in_one_call"])
def test_copies_equal_the_variables_and_stay_put_when_they_change(count):
    rng = np.random.default_rng(0)
    expected = [rng.normal(size=(i + 1, 3)).astype("float32") for i in range(count)]
    variables = [keras.Variable(value) for value in expected]
    copies = host_reads.read_to_host(variables)
    for variable in variables:
        variable.assign(variable + 1.0)
    for copy, value in zip(copies, expected, strict=True):
        np.testing.assert_array_equal(copy, value)
    again = host_reads.read_to_host(variables)  # the cached reader sees the new values
    for copy, value in zip(again, expected, strict=True):
        np.testing.assert_array_equal(copy, value + 1.0)


def test_no_variables():
    assert host_reads.read_to_host([]) == []


def _rates_one_by_one(optimizer):
    """The old host path: one eager read per rate."""
    return (float(keras.ops.convert_to_numpy(optimizer.learning_rate)), applied_learning_rate(optimizer),
            current_momentum(optimizer))


def _sgd_with_multiplier():
    return kadapt.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5), momentum=0.9)


@pytest.mark.parametrize("make_optimizer", [
    _sgd_with_multiplier,  # a schedule, a live multiplier and momentum variable
    lambda: keras.optimizers.SGD(0.05, momentum=0.8),  # a float momentum, read on the host
    lambda: keras.optimizers.Adam(0.01, beta_1=0.85),
    lambda: keras.optimizers.RMSprop(0.01),  # its momentum is a float 0.0
], ids=["kadapt_sgd_schedule", "keras_sgd", "keras_adam", "keras_rmsprop"])
def test_read_model_equals_the_variables_and_rates_read_one_by_one(make_optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=make_optimizer(), loss="mse")
    x = np.linspace(-1, 1, 24, dtype="float32").reshape(8, 3)
    for step in range(3):  # the schedule's rate, the slots and the weights move; the reader must follow
        model.train_on_batch(x, x[:, :1])
        if hasattr(model.optimizer, "learning_rate_multiplier"):
            model.optimizer.learning_rate_multiplier = 0.5 + step
            model.optimizer.momentum.assign(0.5 + 0.1 * step)
        reading = host_reads.read_model(model)
        for value, variable in zip(reading.variables + reading.optimizer,
                                   model.variables + model.optimizer.variables, strict=True):
            np.testing.assert_array_equal(value, keras.ops.convert_to_numpy(variable))
        read = (reading.scheduled_rate, reading.learning_rate, reading.momentum)
        assert read == _rates_one_by_one(model.optimizer)


def test_read_model_copies_stay_put_when_later_steps_move_the_variables():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=kadapt.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    x = np.linspace(-1, 1, 24, dtype="float32").reshape(8, 3)
    model.train_on_batch(x, x[:, :1])
    reading = host_reads.read_model(model)
    expected = [np.array(keras.ops.convert_to_numpy(v)) for v in model.variables + model.optimizer.variables]
    model.train_on_batch(x, x[:, :1])  # every weight, statistic and slot moves
    for kept, value in zip(expected, reading.variables + reading.optimizer, strict=True):
        np.testing.assert_array_equal(value, kept)
