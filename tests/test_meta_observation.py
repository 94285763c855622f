"""One observation for the MetaAdjuster and the record collector: the trainable weights, in both."""

import types

import keras
import numpy as np
from helpers import constant_meta_model

import kadapt
from kadapt.meta import CollectionConfig
from kadapt.meta import MetaAdjuster
from kadapt.meta import Trigger
from kadapt.meta.actions import KEEP
from kadapt.meta.collect import TaskRun
from kadapt.meta.observation import observe_model

EPOCHS, ROWS, BATCH = 3, 8, 4


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
    adjuster = MetaAdjuster(constant_meta_model(KEEP), trigger=Trigger(patience=10**6), verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, validation_data=(x, y),
              validation_batch_size=ROWS, callbacks=[adjuster, _Collector(run)])
    assert len(adjuster.history) == len(run.history) == EPOCHS
    np.testing.assert_allclose(adjuster.history.window(), run.history.window(), rtol=1e-5, atol=1e-6)
