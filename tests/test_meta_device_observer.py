"""`DeviceObserver`: the update's sums and the rollback buffers on the device, NumPy on the host copies as the oracle."""

import keras
import numpy as np
import pytest

import kadapt
from kadapt.meta.observe import device_observer
from kadapt.meta.observe.device_observer import DeviceObserver
from kadapt.optimizers.live_variables import applied_learning_rate

pytestmark = pytest.mark.backends("tensorflow", "jax")

RATE, MOMENTUM = 0.05, 0.9


def small_model():
    keras.utils.set_random_seed(0)
    # BatchNorm's moving statistics and Dropout's seed: variables a rollback restores, not trainable ones.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.BatchNormalization(), keras.layers.Dropout(0.1), keras.layers.Dense(1)])
    model.compile(optimizer=kadapt.optimizers.SGD(RATE, momentum=MOMENTUM), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def train(model, steps):
    x = np.linspace(-1, 1, 24, dtype="float32").reshape(8, 3)
    for _ in range(steps):
        model.train_on_batch(x, x @ np.array([[1.0], [-2.0], [0.5]], "float32"))


def flat(model):
    return np.concatenate([np.ravel(keras.ops.convert_to_numpy(v)) for v in model.trainable_variables]).astype("float64")


def test_the_sums_are_those_of_the_weights_between_observations():
    model = small_model()
    observer = DeviceObserver(model)
    train(model, 1)
    first, w0 = observer.observe(), flat(model)
    train(model, 2)
    second, w1 = observer.observe(), flat(model)
    train(model, 3)
    third, w2 = observer.observe(), flat(model)

    assert first.sums.square == pytest.approx(w0 @ w0, rel=1e-6) and first.sums.finite
    assert first.sums.update_square is None and first.sums.update_dot is None  # nothing before it
    assert second.sums.update_square == pytest.approx((w1 - w0) @ (w1 - w0), rel=1e-5)
    assert second.sums.update_dot is None  # one update seen: no cosine yet
    assert third.sums.update_square == pytest.approx((w2 - w1) @ (w2 - w1), rel=1e-5)
    assert third.sums.update_dot == pytest.approx((w2 - w1) @ (w1 - w0), rel=1e-5)
    assert third.learning_rate == pytest.approx(applied_learning_rate(model.optimizer))
    assert third.momentum == pytest.approx(MOMENTUM) and third.scheduled_rate == pytest.approx(RATE)


def test_a_nonfinite_observation_is_flagged_and_the_next_update_is_from_the_last_finite_weights():
    model = small_model()
    observer = DeviceObserver(model)
    train(model, 1)
    observer.observe()
    good = flat(model)
    kernel = model.trainable_variables[0]
    saved = keras.ops.convert_to_numpy(kernel)
    kernel.assign(np.full(saved.shape, np.nan, "float32"))
    assert not observer.observe().sums.finite
    kernel.assign(saved)
    train(model, 1)

    after = observer.observe()

    now = flat(model)
    assert after.sums.finite and after.sums.update_square == pytest.approx((now - good) @ (now - good), rel=1e-5)


def test_a_snapshot_comes_back_as_the_state_it_copied():
    model = small_model()
    observer = DeviceObserver(model)
    train(model, 2)
    saved = [np.array(keras.ops.convert_to_numpy(v)) for v in model.variables]
    velocity = [np.array(keras.ops.convert_to_numpy(v)) for v in model.optimizer.variables]
    observer.snapshot(1)
    train(model, 2)

    weights, slots = observer.buffered(1)

    for got, want in zip(weights, saved, strict=True):
        np.testing.assert_array_equal(got, want)
    for variable, got, want in zip(model.optimizer.variables, slots, velocity, strict=True):
        if variable.name in ("iteration", "learning_rate", "learning_rate_multiplier", "momentum"):
            assert got is None  # a rollback leaves the step count and the live channels alone
        else:
            np.testing.assert_array_equal(got, want)
    assert DeviceObserver.free_slot({1}) == 0 and DeviceObserver.free_slot(set()) == 0


def test_where_it_observes_on_the_device(monkeypatch):
    assert DeviceObserver.attach(small_model()) is None  # a small model on a CPU: the host reads it faster
    monkeypatch.setattr(device_observer, "DEVICE_FROM", 0)
    # On JAX's CPU the host reads any model faster.
    assert (DeviceObserver.attach(small_model()) is None) == (keras.backend.backend() == "jax")
    monkeypatch.setattr(device_observer, "CPU_BACKENDS", ("tensorflow", "jax"))
    model = small_model()
    observer = DeviceObserver.attach(model)
    assert isinstance(observer, DeviceObserver)
    assert DeviceObserver.attach(model) is observer  # a later fit of the model: its copies, not new ones
    # On an accelerator, only where the copies fit in a share of its free memory.
    monkeypatch.setattr(device_observer, "_device", lambda model: "GPU:0")
    copies = device_observer._copies_bytes(model)
    monkeypatch.setattr(device_observer, "_free_bytes", lambda device: copies / device_observer.MEMORY_SHARE)
    assert isinstance(DeviceObserver.attach(small_model()), DeviceObserver)
    monkeypatch.setattr(device_observer, "_free_bytes", lambda device: copies / device_observer.MEMORY_SHARE - 1)
    assert DeviceObserver.attach(small_model()) is None


def test_a_later_run_starts_without_an_update_before_its_first_observation(monkeypatch):
    monkeypatch.setattr(device_observer, "DEVICE_FROM", 0)
    monkeypatch.setattr(device_observer, "CPU_BACKENDS", ("tensorflow", "jax"))
    model = small_model()
    observer = DeviceObserver.attach(model)
    for _ in range(2):
        train(model, 1)
        observer.observe()
    assert observer.had_update

    again = DeviceObserver.attach(model)

    assert again is observer and again.observe().sums.update_square is None


@pytest.mark.backends("tensorflow")
def test_a_distributed_model_is_read_on_the_host(monkeypatch, mirrored_strategy):
    monkeypatch.setattr(device_observer, "DEVICE_FROM", 0)
    monkeypatch.setattr(device_observer, "CPU_BACKENDS", ("tensorflow", "jax"))
    with mirrored_strategy.scope():
        model = small_model()
    assert DeviceObserver.attach(model) is None  # each replica holds its own copy


def test_the_weights_an_update_is_measured_from_carry_over_to_a_resumed_observer():
    model = small_model()
    observer = DeviceObserver(model)
    for _ in range(2):
        train(model, 1)
        observer.observe()
    resumed = DeviceObserver(model)
    resumed.set_previous(*observer.previous_on_host())
    train(model, 1)

    original, carried = observer.observe().sums, resumed.observe().sums

    assert carried.update_square == pytest.approx(original.update_square, rel=1e-6)
    assert carried.update_dot == pytest.approx(original.update_dot, rel=1e-6)


def test_a_new_schedule_on_the_optimizer_gets_an_observer_that_reads_it(monkeypatch):
    monkeypatch.setattr(device_observer, "DEVICE_FROM", 0)
    monkeypatch.setattr(device_observer, "CPU_BACKENDS", ("tensorflow", "jax"))
    model = small_model()
    first = DeviceObserver.attach(model)
    model.optimizer.learning_rate = keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=1, decay_rate=0.5)
    train(model, 2)

    second = DeviceObserver.attach(model)

    assert second is not first
    assert second.observe().scheduled_rate == pytest.approx(0.2 * 0.5**2)
