"""A real, tiny KerasTuner search over logical batch sizes > micro-batch."""

import math

import keras
import keras_tuner
import pytest

import kadapt
from helpers import classification_data
from helpers import mlp

SEEN = []


class RecordSteps(keras.callbacks.Callback):
    def on_train_end(self, logs=None):
        SEEN.append((self.model.micro_batch_size, int(self.model.optimizer.iterations)))


def _build(hp):
    model = mlp()
    model.compile(
        optimizer=keras.optimizers.SGD(hp.Choice("learning_rate", [0.05, 0.2])),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def test_search_over_batch_sizes_larger_than_the_micro_batch(tmp_path):
    SEEN.clear()
    x, y = classification_data(rows=40)
    hyper_model = kadapt.tuning.AccumulatingHyperModel(_build, micro_batch_size=4, batch_sizes=[8, 20, 40])
    tuner = keras_tuner.GridSearch(
        hyper_model, objective="loss", max_trials=3, directory=tmp_path, project_name="t"
    )
    tuner.search(x, y, epochs=1, verbose=0, callbacks=[RecordSteps()])
    trials = [t for t in tuner.oracle.trials.values() if t.status == "COMPLETED"]
    assert len(trials) == 3
    batch_sizes = sorted(t.hyperparameters.get("batch_size") for t in trials)
    steps = sorted(iterations for _, iterations in SEEN)
    # One optimizer step per logical batch: 40 rows at 8, 20 or 40 per batch.
    assert steps == sorted(math.ceil(40 / b) for b in batch_sizes)
    assert all(micro == 4 for micro, _ in SEEN)
    assert all(t.score is not None for t in trials)


def test_bad_hyper_model_arguments():
    with pytest.raises(ValueError, match=r"`batch_sizes` must be a non-empty list.*Received: batch_sizes=\[\]"):
        kadapt.tuning.AccumulatingHyperModel(_build, 4, [])
    with pytest.raises(ValueError, match=r"`batch_sizes` must be a positive int.*Received: batch_sizes=0"):
        kadapt.tuning.AccumulatingHyperModel(_build, 4, [8, 0])
    with pytest.raises(TypeError, match="`build_model` must be a callable"):
        kadapt.tuning.AccumulatingHyperModel("mlp", 4, [8])


def test_the_batch_size_is_in_the_search_space_before_any_trial(tmp_path):
    hyper_model = kadapt.tuning.AccumulatingHyperModel(_build, micro_batch_size=4, batch_sizes=[8, 20, 40])
    tuner = keras_tuner.RandomSearch(hyper_model, objective="loss", max_trials=1, directory=tmp_path)
    space = {hp.name: hp.values for hp in tuner.oracle.get_space().space}
    assert space == {"batch_size": [8, 20, 40], "learning_rate": [0.05, 0.2]}


def test_the_best_model_is_the_best_trials_trained_model(tmp_path):
    x, y = classification_data(rows=40)
    hyper_model = kadapt.tuning.AccumulatingHyperModel(_build, micro_batch_size=4, batch_sizes=[8, 20])
    tuner = keras_tuner.RandomSearch(hyper_model, objective="val_loss", max_trials=2, seed=0,
                                     directory=tmp_path)
    tuner.search(x, y, epochs=2, validation_split=0.25, verbose=0)
    best = tuner.get_best_models(1)[0]
    # Keras validates on the last quarter of the rows.
    assert best.evaluate(x[30:], y[30:], verbose=0) == pytest.approx(
        tuner.oracle.get_best_trials(1)[0].score, rel=1e-5)
