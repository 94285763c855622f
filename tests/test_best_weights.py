"""`kadapt.callbacks.BestWeights`: the best epoch's weights at the end, across a resume too."""

import keras
import numpy as np
import pytest

from kadapt.callbacks import BestWeights
from kadapt.callbacks.best_weights import STATE_FILE


def _model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _epoch(callback, model, epoch, loss, value):
    model.set_weights([np.full(w.shape, value, "float32") for w in model.get_weights()])
    callback.on_epoch_end(epoch, {"loss": loss})


def test_a_resumed_run_ends_with_the_best_epoch_of_the_whole_run(tmp_path):
    model = _model()
    first = BestWeights(monitor="loss", backup_dir=tmp_path)
    first.set_model(model)
    first.on_train_begin()
    _epoch(first, model, 0, 1.0, 1.0)
    _epoch(first, model, 1, 0.5, 2.0)  # the best epoch
    _epoch(first, model, 2, 0.8, 3.0)
    assert (tmp_path / STATE_FILE).is_file()
    # Interrupted here. The resumed run starts afresh and reads the state back.
    resumed = BestWeights(monitor="loss", backup_dir=tmp_path)
    resumed.set_model(model)
    resumed.on_train_begin()
    assert (resumed.best, resumed.best_epoch) == (0.5, 1)
    _epoch(resumed, model, 3, 0.7, 4.0)  # worse than epoch 1
    resumed.on_train_end()
    assert resumed.best_epoch == 1
    for weight in model.get_weights():
        np.testing.assert_array_equal(weight, 2.0)


def test_without_a_directory_a_later_improvement_wins():
    model = _model()
    callback = BestWeights(monitor="loss")
    callback.set_model(model)
    callback.on_train_begin()
    _epoch(callback, model, 0, 1.0, 1.0)
    _epoch(callback, model, 1, 0.2, 5.0)
    callback.on_train_end()
    assert callback.best_epoch == 1 and callback.best == pytest.approx(0.2)
    for weight in model.get_weights():
        np.testing.assert_array_equal(weight, 5.0)
