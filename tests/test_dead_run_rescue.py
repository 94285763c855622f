"""`DeadRunRescue` on real runs: a run that dies is rolled back and restarted at the new rate (proved by
the weights it ends with), a healthy one is untouched bit for bit, and `kadapt train` rescues one."""

import json
import types

import keras
import numpy as np
import pytest

from helpers import classification_data
from helpers import mlp
from helpers import write_separable_rows
from kadapt.meta import DeadRunRescue
from kadapt.meta.live.chance_loss import chance_loss
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.optimizers import SGD


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def scalar_regression(learning_rate):
    """w * x with x = 1 and target 3, from w = 0: a step multiplies the error (w - 3) by 1 - 2 lr."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(SGD(learning_rate), loss="mse")
    return model, np.ones((4, 1), "float32"), np.full((4, 1), 3.0, "float32")


def test_a_diverged_run_restarts_from_its_initial_weights_at_a_tenth_of_the_rate(tmp_path):
    """Epoch 1 at lr 1.5: the error doubles each step (losses 9, 36, 144, 576: 21x the first). The
    rescue puts w = 0 back and the rate at 0.15; epoch 2's four steps leave w = 3 (1 - 0.7^4)."""
    model, x, y = scalar_regression(1.5)
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1.0), monitor="loss", log_dir=tmp_path, verbose=False)
    model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0, callbacks=[rescue])
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.7**4)]], rtol=1e-6)
    [decision] = read_jsonl(tmp_path / "meta_decisions.jsonl")
    assert decision["trigger"] == "diverged" and decision["rollback"] and decision["epoch"] == 0
    assert decision["adjustment"] == {"learning_rate_multiplier": pytest.approx(0.1)}
    assert decision["features"]["loss"] == pytest.approx(191.25)


def test_a_run_that_diverges_later_returns_to_its_best_healthy_epoch_on_its_schedule():
    """Eight steps at 0.15 (the error x0.7 each), then the schedule jumps to 1.5 (x-2 each): epoch 2's
    mean loss is ~37x epoch 1's. The rescue returns to epoch 1's w = 3 (1 - 0.7^8) and scales the
    schedule's 1.5 by 0.1; epoch 3 ends at w = 3 (1 - 0.7^16)."""
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([7], [0.15, 1.5])  # steps 0-7, then 8 on
    model, x, y = scalar_regression(schedule)
    x, y = np.ones((8, 1), "float32"), np.full((8, 1), 3.0, "float32")
    rescue = DeadRunRescue(DeadRunRule(chance_loss=100.0), monitor="loss", verbose=False)
    model.fit(x, y, batch_size=1, epochs=3, shuffle=False, verbose=0, callbacks=[rescue])
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.7**16)]], rtol=1e-5)
    [decision] = rescue.decisions
    assert (decision["trigger"], decision["epoch"]) == ("diverged", 1)
    assert decision["action"].startswith("rollback to the best healthy weights, lr x0.1")


class HalveAtEpochEnd(keras.callbacks.Callback):
    """Halves the rate at every epoch end, before the rescue: as the MetaAdjuster cuts a diverging rate."""

    def on_epoch_end(self, epoch, logs=None):
        self.model.optimizer.learning_rate_multiplier = 0.5 * float(self.model.optimizer.learning_rate_multiplier)


@pytest.mark.backends("tensorflow", "jax")  # the multiplier and the schedule's rate read on either backend
def test_the_cut_is_from_the_rate_that_diverged_not_from_a_cut_made_at_the_same_epoch_end():
    """As the first test, a callback before the rescue halving the rate at epoch 1's end: the rescue's
    multiplier is a tenth of the epoch's 1.0 (lr 0.15, w = 3 (1 - 0.7^4)), not of the halved 0.5."""
    model, x, y = scalar_regression(1.5)
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1.0), monitor="loss", verbose=False)
    model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0, callbacks=[HalveAtEpochEnd(), rescue])
    assert rescue.decisions[0]["adjustment"] == {"learning_rate_multiplier": pytest.approx(0.1)}
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.7**4)]], rtol=1e-6)


class FixedRangeTest:
    """A range test that suggests `rate` (the rescue's contract: `max_steps`, `run(model, steps)`)."""

    max_steps = 10

    def __init__(self, rate):
        self.rate = rate

    def run(self, model, num_steps):
        return types.SimpleNamespace(suggestion=self.rate)


@pytest.mark.backends("tensorflow", "jax")  # the multiplier and the schedule's rate read on either backend
def test_after_a_divergence_a_rescue_takes_ten_times_the_range_tests_rate_below_a_tenth_of_the_diverged_one():
    """As above, the range test suggesting 0.005: ten times it, 0.05, is below a tenth of the
    diverged 1.5; epoch 2 at 0.05 leaves w = 3 (1 - 0.9^4)."""
    model, x, y = scalar_regression(1.5)
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1.0), monitor="loss", range_test=FixedRangeTest(0.005),
                           verbose=False)
    model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0, callbacks=[rescue])
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.9**4)]], rtol=1e-6)
    assert rescue.decisions[0]["adjustment"] == {"learning_rate_multiplier": pytest.approx(0.05 / 1.5)}


@pytest.mark.backends("tensorflow", "jax")  # the multiplier and the schedule's rate read on either backend
def test_the_range_tests_rate_is_applied_as_suggested_after_a_cut_made_at_the_same_epoch_end():
    """As above, a callback before the rescue halving the multiplier at epoch 1's end (as the
    MetaAdjuster cuts a diverging rate): the schedule's rate is still 1.5, so the multiplier is
    0.05 / 1.5 and epoch 2 trains at 0.05 (w = 3 (1 - 0.9^4)); read against the halved multiplier's
    rate, the suggestion would be applied twice over (0.1: w = 3 (1 - 0.8^4))."""
    model, x, y = scalar_regression(1.5)
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1.0), monitor="loss", range_test=FixedRangeTest(0.005),
                           verbose=False)
    model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0, callbacks=[HalveAtEpochEnd(), rescue])
    assert rescue.decisions[0]["adjustment"] == {"learning_rate_multiplier": pytest.approx(0.05 / 1.5)}
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.9**4)]], rtol=1e-6)


@pytest.mark.backends("tensorflow", "jax")  # the multiplier and the schedule's rate read on either backend
def test_a_run_at_chance_takes_the_range_tests_rate_as_suggested():
    """At 1e-6 the loss sits at 9, above the chance given (8.5), for two epochs: the rescue restarts
    from w = 0 at the suggested 0.05 itself (no bound above it to step in from); epoch 3 leaves
    w = 3 (1 - 0.9^4)."""
    model, x, y = scalar_regression(1e-6)
    rescue = DeadRunRescue(DeadRunRule(chance_loss=8.5), monitor="loss", range_test=FixedRangeTest(0.05),
                           verbose=False)
    model.fit(x, y, batch_size=1, epochs=3, shuffle=False, verbose=0, callbacks=[rescue])
    [decision] = rescue.decisions
    assert (decision["trigger"], decision["epoch"]) == ("at_chance", 1)
    assert decision["adjustment"] == {"learning_rate_multiplier": pytest.approx(0.05 / 1e-6)}
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.9**4)]], rtol=1e-5)


def test_after_a_divergence_the_rate_falls_at_least_tenfold_whatever_the_range_test_says():
    model, x, y = scalar_regression(1.5)
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1.0), monitor="loss", range_test=FixedRangeTest(1.5),
                           verbose=False)
    model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0, callbacks=[rescue])
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.7**4)]], rtol=1e-6)
    assert rescue.decisions[0]["action"].endswith("(range test: 1.5, x10 of it above x0.1 of the diverged rate)")


def test_a_healthy_run_is_untouched_bit_for_bit(tmp_path):
    x, _ = classification_data(rows=40)
    y = x[:, :3].argmax(1)  # learnable: random labels would leave the validation loss at chance

    def trained(callbacks):
        model = mlp(seed=3)
        model.compile(SGD(0.05, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8, epochs=3, validation_split=0.2, shuffle=False, verbose=0, callbacks=callbacks)
        return model.get_weights()

    rescue = DeadRunRescue(DeadRunRule(chance_loss(y[:32], 3)), log_dir=tmp_path, verbose=False)
    rescued = trained([rescue])
    assert rescue.decisions == [] and not (tmp_path / "meta_decisions.jsonl").exists()
    for with_rescue, without in zip(rescued, trained([]), strict=True):
        np.testing.assert_array_equal(with_rescue, without)


def test_keras_own_sgd_is_rescued_through_the_multiplier_installed_on_it():
    """The first test's run on `keras.optimizers.SGD`: the rescue installs the live multiplier at
    train begin and ends at the same w = 3 (1 - 0.7^4)."""
    model, x, y = scalar_regression(1.5)
    model.compile(keras.optimizers.SGD(1.5), loss="mse")
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1.0), monitor="loss", verbose=False)
    model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0, callbacks=[rescue])
    np.testing.assert_allclose(model.get_weights()[0], [[3 * (1 - 0.7**4)]], rtol=1e-6)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.15)


def test_keras_adamw_under_a_schedule_is_rescued():
    """AdamW (Keras', once refused) on a cosine schedule, diverging at lr 50: rolled back, its schedule x0.1."""
    model, x, y = scalar_regression(1.0)
    model.compile(keras.optimizers.AdamW(keras.optimizers.schedules.CosineDecay(50.0, 100)), loss="mse")
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1.0), monitor="loss", verbose=False)
    model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0, callbacks=[rescue])
    [decision] = rescue.decisions
    assert decision["trigger"] == "diverged" and decision["adjustment"] == {"learning_rate_multiplier": pytest.approx(0.1)}
    step = float(model.optimizer.iterations.numpy())
    expected = 0.1 * float(keras.optimizers.schedules.CosineDecay(50.0, 100)(step))
    assert float(model.optimizer.learning_rate) == pytest.approx(expected, rel=1e-5)


def test_kadapt_train_rescues_a_run_that_dies(tmp_path, monkeypatch):
    """SGD at 10 on standardized rows: the first epoch blows up (val loss ~1e8); the rescue rolls
    back, a range test sets the rate, and the run ends well below chance (0.82 against 1.10)."""
    from kadapt.run.pipeline import start_run
    from kadapt.run.pipeline import train

    data = write_separable_rows(tmp_path, scale=3)
    monkeypatch.chdir(tmp_path)
    options = {"data": data, "model": "mlp", "optimizer": "sgd", "learning_rate": 10.0, "epochs": 4,
               "meta": "off", "memory_budget": "256MiB"}
    run = start_run(options, str(tmp_path / "run"))
    train(run, echo=lambda line: None, verbose=0)
    chance = chance_loss(run.data.y_train, 3, label_smoothing=0.1)
    [decision] = read_jsonl(tmp_path / "run" / "meta_decisions.jsonl")
    assert (decision["trigger"], decision["epoch"]) == ("diverged", 0)
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["val_loss"][0] > 1e3 and history["val_loss"][-1] < 0.8 * chance
