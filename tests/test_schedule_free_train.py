"""Schedule-Free in a recipe's run: the weights kept by the best-weights keeper are x (the average),
BatchNorm statistics are recomputed at x, the live multiplier reaches the step when the
MetaAdjuster or the dead-run rescue changes it (proved against the NumPy transcription of
schedulefree 1.4.1 in test_schedule_free), and `kadapt train --optimizer schedule_free_*` trains,
saves x, records it and resumes as if uninterrupted."""

import json

import keras
import numpy as np
import pytest

import kadapt
from helpers import constant_meta_model
from helpers import write_separable_rows
from kadapt.callbacks import BestWeights
from kadapt.callbacks import ScheduleFreeEvaluation
from kadapt.meta import DeadRunRescue
from kadapt.meta import MetaAdjuster
from kadapt.meta import Trigger
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.meta.model.actions import ACTIONS
from test_schedule_free import _data
from test_schedule_free import _fit
from test_schedule_free import _loss
from test_schedule_free import _model
from test_schedule_free import _reference

LR_DOWN_10 = ACTIONS.index({"learning_rate_multiplier": 0.1})


class RecordsX(keras.callbacks.Callback):
    """At each epoch end (the model at y): x = y + (1 - 1 / beta) (z - y), from the optimizer's z."""

    def __init__(self):
        super().__init__()
        self.points = []

    def on_epoch_end(self, epoch, logs=None):
        optimizer = self.model.optimizer
        assert not optimizer.at_evaluation_point
        beta = optimizer._interpolation
        z = [np.array(optimizer._z[kadapt.optimizers.live_variables.slot_key(v)]) for v in
             self.model.trainable_variables]
        y = [np.array(v) for v in self.model.trainable_variables]
        self.points.append([p + (1 - 1 / beta) * (zp - p) for p, zp in zip(y, z)])


@pytest.mark.backends("tensorflow", "jax")
def test_the_best_weights_kept_are_x_of_the_best_epoch():
    """Validation targets half-way between the initial predictions and the training targets: the
    run passes them, so the best epoch is neither the first nor the last; the model ends with that
    epoch's x, not its y."""
    model = _model(kadapt.optimizers.ScheduleFreeAdamW(0.1))
    x, y = _data()
    held = (x, (x @ np.ones((3, 1), "float32") + y) / 2)
    recorder, best = RecordsX(), BestWeights(monitor="val_loss")
    history = model.fit(x, y, batch_size=4, epochs=8, verbose=0, shuffle=False, validation_data=held,
                        callbacks=[recorder, best, ScheduleFreeEvaluation()])
    losses = history.history["val_loss"]
    assert 0 < int(np.argmin(losses)) < len(losses) - 1, losses  # not trivially the first or the last
    kept = recorder.points[best.best_epoch]
    for ours, theirs in zip(model.get_weights(), kept):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.backends("tensorflow", "jax")
def test_batch_statistics_are_recomputed_at_x_at_the_end_of_fit():
    """Dense then BatchNorm: the moving statistics after fit are the mean of the first two batches'
    statistics of x-weights' activations (NumPy), not what training at y gathered."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(kadapt.optimizers.ScheduleFreeSGD(0.5), loss="mse")
    x, y = _data()
    batches = [x[:8], x[8:]]
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False,
              callbacks=[ScheduleFreeEvaluation(batches, steps=2)])
    kernel, bias = (np.asarray(w, "float64") for w in model.layers[0].get_weights())
    activations = [b @ kernel + bias for b in batches]
    norm = model.layers[1]
    np.testing.assert_allclose(np.array(norm.moving_mean), np.mean([a.mean(0) for a in activations], 0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(norm.moving_variance), np.mean([a.var(0) for a in activations], 0),
                               rtol=1e-4, atol=1e-6)


def fires_once_at_step_3():
    """Never "improves" after the first loss: with patience 2 it fires at the third observation."""
    return Trigger(patience=2, cooldown=0, min_delta=0.99)


@pytest.mark.backends("tensorflow", "jax")
def test_a_meta_adjustment_changes_the_rate_schedule_free_applies():
    model = _model(kadapt.optimizers.ScheduleFreeSGD(0.2))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), verbose=0)
    _fit(model, 5, [adjuster])
    assert [(d["step"], d["action"]) for d in adjuster.decisions] == [(3, "lr x0.1")]
    _, x = _reference(5, 0.2, 0.9, adam=False, multipliers=[1.0] * 3 + [0.1] * 2)
    for ours, theirs in zip(model.get_weights(), x):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.backends("tensorflow", "jax")
def test_a_rescue_restarts_schedule_free_from_its_start_at_the_new_rate():
    """SGD-Schedule-Free at 3.0 diverges in its first epoch (4 steps); the rescue restores the
    initial state (z included: the start, not zeros) and scales the rate x0.1: the second epoch
    equals 4 reference steps at 0.3 from the start."""
    model = _model(kadapt.optimizers.ScheduleFreeSGD(3.0))
    rescue = DeadRunRescue(DeadRunRule(chance_loss=1e6), monitor="loss", verbose=False)
    x, y = _data()
    model.fit(np.concatenate([x] * 4), np.concatenate([y] * 4), batch_size=len(x), epochs=2, verbose=0,
              shuffle=False, callbacks=[rescue])
    [decision] = rescue.decisions
    assert (decision["trigger"], decision["epoch"]) == ("diverged", 0)
    assert float(model.optimizer.learning_rate_multiplier.numpy()) == pytest.approx(0.1)
    _, expected = _reference(4, 0.3, 0.9, adam=False)
    assert _loss(expected) < _loss([np.ones((3, 1)), np.zeros(1)])
    for ours, theirs in zip(model.get_weights(), expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def x_of(optimizer, variables):
    """x from the optimizer's state once `fit` left the model at x: y (kept in its slot) and z."""
    beta = optimizer._interpolation
    keys = [kadapt.optimizers.live_variables.slot_key(v) for v in variables]
    return [np.array(optimizer._y[k]) + (1 - 1 / beta) * (np.array(optimizer._z[k]) - np.array(optimizer._y[k]))
            for k in keys]


@pytest.mark.parametrize("name, rate, kind", [("schedule_free_adamw", 0.0025, "ScheduleFreeAdamW"),
                                              ("schedule_free_sgd", 1.0, "ScheduleFreeSGD")])
def test_kadapt_train_with_schedule_free_trains_at_its_reference_defaults_and_saves_x(
        tmp_path, monkeypatch, name, rate, kind):
    from kadapt import load_model
    from kadapt.run.pipeline import start_run
    from kadapt.run.pipeline import train

    monkeypatch.chdir(tmp_path)
    data = write_separable_rows(tmp_path, scale=1)
    run = start_run({"data": data, "model": "mlp", "optimizer": name, "epochs": 3, "meta": "off",
                     "restore_best_weights": False}, str(tmp_path / "run"))
    record = train(run, echo=lambda line: None, verbose=0)
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert resolved["optimizer"]["optimizer"] == name
    assert (resolved["recipe"]["learning_rate"], resolved["recipe"]["schedule"]) == (rate, "constant")
    optimizer = run.model.optimizer
    assert type(optimizer).__name__ == kind and optimizer.at_evaluation_point
    assert record["test_accuracy"] > 0.9
    x = x_of(optimizer, run.model.trainable_variables)
    assert not np.allclose(x[0], np.array(optimizer._y[kadapt.optimizers.live_variables.slot_key(
        run.model.trainable_variables[0])]), atol=1e-4)  # x is not y
    saved = load_model(tmp_path / "run" / "model.keras").get_weights()
    for weight in x:
        assert any(w.shape == weight.shape and np.allclose(w, weight, rtol=1e-6, atol=1e-7) for w in saved)


def test_kadapt_train_refuses_a_schedule_with_schedule_free_naming_the_fix(tmp_path, monkeypatch):
    from kadapt import cli

    monkeypatch.chdir(tmp_path)
    data = write_separable_rows(tmp_path, scale=1)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", data, "--optimizer", "schedule_free_sgd", "--schedule", "cosine",
                  "--out", "run"])
    assert str(raised.value) == (
        "kadapt: error: Argument --schedule must be 'constant' with --optimizer='schedule_free_sgd': Schedule-Free "
        "averages its iterates instead of annealing the rate. Pass --schedule='constant'. "
        "Received: --schedule='cosine'")
    assert not (tmp_path / "run").exists()


def test_kadapt_train_with_schedule_free_resumes_as_if_uninterrupted(tmp_path, monkeypatch):
    from kadapt import cli
    from kadapt import load_model
    from helpers import epochs_done
    from test_cli_train import ctrl_c_after

    monkeypatch.chdir(tmp_path)
    data = write_separable_rows(tmp_path, scale=1)
    args = ["--data", data, "--model", "mlp", "--optimizer", "schedule_free_adamw", "--batch-size", "32",
            "--meta", "off", "--epochs", "3", "--out"]
    with ctrl_c_after(10):  # 204 training rows in batches of 32: 7 steps an epoch, stopped in the second
        assert cli.main(["train", *args, "interrupted"]) == 130
    assert epochs_done(tmp_path / "interrupted") == [0]
    assert cli.main(["train", "--resume", "--out", "interrupted"]) == 0
    assert cli.main(["train", *args, "whole"]) == 0
    histories = [json.loads((tmp_path / run / "history.json").read_text()) for run in ("interrupted", "whole")]
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(histories[0][key], histories[1][key], rtol=1e-5)
    weights = [load_model(tmp_path / run / "model.keras").get_weights() for run in ("interrupted", "whole")]
    for got, want in zip(*weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("changes, message", [
    ({}, r"`schedule` must be 'constant' with optimizer='schedule_free_adamw'.*Pass schedule='constant'. "
         r"Received: schedule='triangular'"),
    ({"schedule": "constant", "ema_momentum": 0.99, "restore_best_weights": False},
     r"`ema_momentum` must be None with optimizer='schedule_free_adamw'.*averages the weights itself"),
])
def test_the_recipe_refuses_what_schedule_free_replaces(changes, message):
    from kadapt.recipes.config import FastFitConfig

    with pytest.raises(ValueError, match=message):
        FastFitConfig(optimizer="schedule_free_adamw", **changes)


def test_the_recipe_leaves_x_with_batch_statistics_of_its_training_batches():
    """`fit_recipe` with Schedule-Free: after training, BatchNorm's moving mean is the mean over the
    recipe's training batches (here all 8 of the stream, under the reference's 50) of the batch means
    of the first layer's output at x (NumPy)."""
    from kadapt.recipes import training
    from kadapt.recipes.config import FastFitConfig

    config = FastFitConfig(optimizer="schedule_free_sgd", schedule="constant", learning_rate=0.5, flip=False,
                           translate=0.0, label_smoothing=0.0, restore_best_weights=False)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                              keras.layers.Dense(2)])
    training.compile_recipe(model, config, total_steps=8)
    x, _ = _data()
    x = np.concatenate([x, x * 0.5])
    y = (x[:, 0] > 0).astype(int)
    batches = training.shuffled_batches(x, y, 8, 2, seed=0, epochs=2)
    training.fit_recipe(model, batches, config, epochs=2, steps_per_epoch=4, total_steps=8, seed=0,
                        arrange_callbacks=lambda schedule, best: list(schedule))
    assert model.optimizer.at_evaluation_point
    kernel, bias = (np.asarray(w, "float64") for w in model.layers[0].get_weights())
    means = [(np.asarray(rows, "float64") @ kernel + bias).mean(0) for rows, _ in batches]
    assert len(means) == 8
    np.testing.assert_allclose(np.array(model.layers[1].moving_mean), np.mean(means, 0), rtol=1e-5, atol=1e-6)
