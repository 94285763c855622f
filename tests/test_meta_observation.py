"""One observation for the MetaAdjuster and the record collector: the trainable weights, in both."""

import math
import types

import keras
import numpy as np
import pytest
from helpers import constant_meta_model

import kadapt
from kadapt.meta import CollectionConfig
from kadapt.meta import MetaAdjuster
from kadapt.meta import Trigger
from kadapt.meta.model.actions import KEEP
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import FeatureHistory
from kadapt.meta.observe.observation import observe_model
from kadapt.meta.records.collect import TaskRun
from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum

EPOCHS, ROWS, BATCH = 3, 8, 4
COLUMN = {name: index for index, name in enumerate(FEATURE_NAMES)}


def _batch_norm_model():
    """BatchNorm's moving statistics are weights no gradient moves: where "all" and "trainable" differ."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=kadapt.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    return model


def _data():
    x = np.linspace(-1, 1, 3 * ROWS, dtype="float32").reshape(ROWS, 3)
    return x, x @ np.array([[1.0], [-2.0], [0.5]], "float32")


def test_the_observation_holds_the_trainable_weights_only():
    model = _batch_norm_model()
    weights = observe_model(model, step=0, loss=1.0, val_loss=None, budget_used=0.0, total_steps=None).weights
    expected = np.concatenate([np.ravel(w) for w in (model.layers[0].kernel, model.layers[0].bias,
                                                     model.layers[1].gamma, model.layers[1].beta,
                                                     model.layers[2].kernel, model.layers[2].bias)])
    np.testing.assert_array_equal(weights, expected)
    assert len(weights) == 29 and sum(w.size for w in model.get_weights()) == 37  # moving mean, variance


class _Collector(keras.callbacks.Callback):
    """At each epoch end, the collector's observation of the same model after the adjuster's."""

    def __init__(self, run):
        super().__init__()
        self.run = run

    def on_epoch_end(self, epoch, logs=None):
        self.run.step = (epoch + 1) * self.run.observe_every
        self.run.observe(logs["loss"], self.run.history)


def test_one_run_gives_the_adjuster_and_the_collector_the_same_windows():
    model = _batch_norm_model()
    x, y = _data()
    task = types.SimpleNamespace(data=(x, y, x, y), batch_size=BATCH, seed=0, build=lambda total_steps: model)
    run = TaskRun(task, CollectionConfig(total_epochs=EPOCHS), np.random.default_rng(0))
    adjuster = MetaAdjuster(constant_meta_model(KEEP), trigger=Trigger(patience=10**6), verbose=0, rescue=False)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, validation_data=(x, y),
              validation_batch_size=ROWS, callbacks=[adjuster, _Collector(run)])
    assert len(adjuster.history) == len(run.history) == EPOCHS
    np.testing.assert_allclose(adjuster.history.window(), run.history.window(), rtol=1e-5, atol=1e-6)


def _old_host_rows(snapshots, losses):
    """The feature columns this module's reads feed, computed as the old host path did: weights read
    one variable at a time, float64 `np.sum` norms, `np.polyfit` slopes, `np.std`, `np.clip`."""
    rows, train, previous, previous_update = [], [], None, None
    for (weights, rate, momentum), loss in zip(snapshots, losses, strict=True):
        train.append(math.log(loss / losses[0]))
        recent = np.asarray(train[-4:])
        slope = np.clip(np.polyfit(np.arange(len(recent)), recent, 1)[0], -5, 5) if len(recent) > 1 else 0.0
        size, cosine = -3.0, 0.0
        if previous is not None:
            update = weights - previous
            size = math.log10(np.sqrt(np.sum(update * update)) / np.sqrt(np.sum(weights * weights))) / 4
            if previous_update is not None:
                cosine = np.sum(update * previous_update) / np.sqrt(
                    np.sum(update * update) * np.sum(previous_update * previous_update))
            previous_update = update
        previous = weights
        rows.append([train[-1], slope, np.clip(np.std(recent), 0, 5), math.log10(rate) / 4, momentum, size, cosine])
    return np.asarray(rows)


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("optimizer", ["kadapt_sgd", "keras_adam"])
def test_one_read_gives_the_features_of_the_old_host_reads(optimizer):
    model = _batch_norm_model()
    if optimizer == "keras_adam":
        model.compile(optimizer=keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.05, 3, 0.7)),
                      loss="mse")
    x, y = _data()
    history, snapshots, losses = FeatureHistory(), [], []
    for step in range(1, 7):
        losses.append(float(model.train_on_batch(x, y)))
        trainable = [np.asarray(keras.ops.convert_to_numpy(v), "float64").ravel() for v in model.trainable_variables]
        snapshots.append((np.concatenate(trainable), applied_learning_rate(model.optimizer),
                          current_momentum(model.optimizer)))
        history.observe(observe_model(model, step, losses[-1], None, step / 6, 6))
    columns = [COLUMN[name] for name in ("train_loss", "train_slope", "train_variability", "log_learning_rate",
                                         "momentum", "update_size", "update_cosine")]
    rows = np.stack(history.get_state()["rows"])[:, columns]
    np.testing.assert_allclose(rows, _old_host_rows(snapshots, losses), rtol=1e-5, atol=1e-6)
    assert len({round(float(v), 4) for v in rows[2:, -1]}) > 1  # the cosines moved: a real comparison
