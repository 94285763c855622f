"""A run with the MetaAdjuster on, interrupted and resumed, ends as the uninterrupted run."""

import json

import keras
import numpy as np
import pytest
from helpers import constant_meta_model

import kadapt
from kadapt.meta import MetaAdjuster
from kadapt.meta import Trigger
from kadapt.meta.live.adjuster import STATE_FILE
from kadapt.meta.live.adjuster_state import load_state
from kadapt.meta.live.adjuster_state import save_state
from kadapt.run.backup import InterruptSafeBackup

LR_DOWN_3 = 1  # index into kadapt.meta.actions.ACTIONS
EPOCHS, INTERRUPTED_AT = 6, 3


class _InterruptAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == INTERRUPTED_AT:
            raise KeyboardInterrupt


class _ExplodeAtEpochBegin(keras.callbacks.Callback):
    """Multiplies the rate by 1000 when the first resumed epoch begins: its loss explodes, and the
    adjuster rolls back to the weights of its last good observation but one (epoch 1: a training
    loss is measured before the last updates), saved before the interruption."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == INTERRUPTED_AT:
            self.model.optimizer.learning_rate_multiplier = 1000.0


def _fit(directory, interrupt=False, keep_state=True, explode=False):
    """Plateaus fire at epochs 2 and 4 (0-based): with patience 2 the trigger fires at the third
    observation, and again two observations after each adjustment. The interrupt lands after
    the adjuster saved epoch 3's state and before the backup checkpointed that epoch."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=kadapt.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    backup = InterruptSafeBackup(backup_dir=str(directory / "backup"))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_3), monitor="loss", verbose=0, log_dir=directory, rescue=False,
                            trigger=Trigger(patience=2, cooldown=0, min_delta=0.99),
                            backup_dir=directory / "backup" if keep_state else None)
    x = np.linspace(-1, 1, 24, dtype="float32").reshape(8, 3)
    middle = ([_InterruptAtEpochEnd()] if interrupt else []) + ([_ExplodeAtEpochBegin()] if explode else [])
    model.fit(x, x @ np.array([[1.0], [-2.0], [0.5]], "float32"), batch_size=4, epochs=EPOCHS, shuffle=False,
              verbose=0, callbacks=[backup, adjuster, *middle, backup.committer])
    # The features (the update's size and direction among them) as the last observation saw them.
    return model.get_weights(), adjuster.decisions, adjuster.history.window()


def _interrupted(directory):
    with pytest.raises(KeyboardInterrupt):
        _fit(directory, interrupt=True)
    assert InterruptSafeBackup.checkpointed_epoch(directory / "backup") == INTERRUPTED_AT


def test_a_resumed_run_ends_with_the_weights_and_decisions_of_the_uninterrupted_one(tmp_path, observed_on):
    whole_weights, whole_decisions, whole_window = _fit(tmp_path / "whole")
    assert [d["epoch"] for d in whole_decisions] == [2, 4]  # the state matters: one decision after the resume
    _interrupted(tmp_path / "resumed")
    weights, decisions, window = _fit(tmp_path / "resumed")
    assert decisions == whole_decisions
    np.testing.assert_allclose(window, whole_window, atol=1e-5)
    logged = [json.loads(line) for line in (tmp_path / "resumed" / "meta_decisions.jsonl").read_text().splitlines()]
    assert logged == whole_decisions  # the interrupted epoch's decision is not logged twice
    for got, want in zip(weights, whole_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_divergence_after_the_resume_rolls_back_to_the_point_saved_before_it(tmp_path, observed_on):
    whole_weights, whole_decisions, _ = _fit(tmp_path / "whole", explode=True)
    assert [(d["epoch"], d["rollback"], d["action"]) for d in whole_decisions] == [
        (2, False, "lr x0.3"), (3, True, "lr x0.3"), (4, True, "lr x0.1")]  # the second divergence: the largest cut
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path / "resumed", interrupt=True, explode=True)
    weights, decisions, _ = _fit(tmp_path / "resumed", explode=True)
    assert decisions == whole_decisions
    for got, want in zip(weights, whole_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_without_its_state_the_resumed_adjuster_ends_elsewhere(tmp_path):
    whole_weights, whole_decisions, _ = _fit(tmp_path / "whole")
    _interrupted(tmp_path / "resumed")
    weights, decisions, _ = _fit(tmp_path / "resumed", keep_state=False)
    assert [d["epoch"] for d in decisions] != [d["epoch"] for d in whole_decisions]
    assert not np.allclose(weights[0], whole_weights[0], rtol=1e-6)


def test_a_corrupt_state_is_a_clear_error(tmp_path):
    _interrupted(tmp_path)
    (tmp_path / "backup" / STATE_FILE.format(epoch=INTERRUPTED_AT)).write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="MetaAdjuster state .* is unusable: it cannot be read"):
        _fit(tmp_path)


def test_states_round_trip_and_foreign_files_are_refused(tmp_path):
    state = {"epoch": 2, "point": {"weights": [np.arange(3.0)], "optimizer": [None]}, "best": float("inf")}
    save_state(tmp_path / "state.npz", state)
    loaded = load_state(tmp_path / "state.npz")
    np.testing.assert_array_equal(loaded["point"]["weights"][0], np.arange(3.0))
    assert (loaded["epoch"], loaded["point"]["optimizer"], loaded["best"]) == (2, [None], float("inf"))
    np.savez(tmp_path / "foreign.npz", weights=np.zeros(3))
    with pytest.raises(ValueError, match="foreign.npz is unusable"):
        load_state(tmp_path / "foreign.npz")
    np.savez(tmp_path / "other.npz", __tree__=np.array(json.dumps({"format": "other", "version": 1})))
    with pytest.raises(ValueError, match="it is not a kadapt.MetaAdjuster state of version 1"):
        load_state(tmp_path / "other.npz")


def test_a_state_saved_by_another_model_is_refused():
    from kadapt.meta.observe import rollback

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=kadapt.optimizers.SGD(0.1, momentum=0.5), loss="mse")
    model.optimizer.build(model.trainable_variables)
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    other.compile(optimizer=kadapt.optimizers.SGD(0.1, momentum=0.5), loss="mse")
    other.optimizer.build(other.trainable_variables)
    with pytest.raises(ValueError, match=r"model variables of shapes \[\(4, 2\), \(2,\)\].*this model has "
                                         r"\[\(3, 2\), \(2,\)\].*saved by another model"):
        rollback.from_state(rollback.to_state(rollback.take(other)), model)
