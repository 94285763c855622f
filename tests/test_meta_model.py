"""Record collection, decision data, the meta-model search and its file."""

import dataclasses
import math

import numpy as np
import pytest
from helpers import constant_meta_model

from kadapt.meta import AdjustmentRecord
from kadapt.meta import CollectionConfig
from kadapt.meta import RecordStore
from kadapt.meta import load_meta_model
from kadapt.meta import train_meta_model
from kadapt.meta import collect
from kadapt.meta.model.actions import ACTIONS
from kadapt.meta.model.actions import SUGGESTION_ACTIONS
from kadapt.meta.model.actions import KEEP
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import WINDOW
from kadapt.meta.model.meta_model import MaskedScoreError
from kadapt.meta.model.meta_model import choose_from
from kadapt.meta.model.meta_model import decision_data
from kadapt.meta.model.meta_model import evaluate_policies
from kadapt.meta.records import tasks
from kadapt.meta.records.collect import Snapshot
from kadapt.meta.records.collect import TaskRun
from kadapt.meta.start.range_test_start import RangeTestStart
from kadapt.optimizers.live_variables import applied_learning_rate

TINY = CollectionConfig(total_epochs=4, horizon_epochs=1, explore=0.0)  # iris: 3 steps per epoch


def record(run_id, step, action, score, family="a", window=None):
    window = np.zeros((WINDOW, len(FEATURE_NAMES))) if window is None else window
    return AdjustmentRecord(run_id=run_id, task=run_id, family=family, step=step, features=window,
                            hyperparameters={}, adjustment={"action": action, **ACTIONS[action]},
                            outcome={"score": score})


def test_collect_branches_every_action_and_resumes(tmp_path):
    store = RecordStore(tmp_path / "records.sqlite")
    task = tasks.make_task("iris", 0, learning_rate=0.01, optimizer="sgd")
    appended = collect(store, [task], TINY, progress=False)
    steps = sorted({r.step for r in store})
    tested = {r.hyperparameters["range_test_rate"] is not None for r in store}
    assert len(tested) == 1  # a task is range-tested from its start, or not at all
    # The moves to a suggestion need one, and are branched only where they move the rate.
    least, most = len(ACTIONS) - len(SUGGESTION_ACTIONS), len(ACTIONS) if tested.pop() else None
    assert steps == [6, 9] and appended == store.count()
    assert all(least <= sum(r.step == step for r in store) <= (most or least) for step in steps)
    assert collect(store, [task], TINY, progress=False) == 0  # resumed: nothing recomputed


def test_a_branch_restores_the_snapshot_exactly():
    task = tasks.make_task("iris", 0, learning_rate=0.05, optimizer="adam", schedule="constant")
    run = TaskRun(task, TINY, np.random.default_rng(0))
    run.train(2 * run.observe_every, run.history)
    base = Snapshot.take(run.model, run.batches, run.step, run.history.last_val_loss)
    rate = applied_learning_rate(run.model.optimizer)
    first = run.branch(base, 4)[1]
    again = run.branch(base, 4)[1]
    keep = run.branch(base, KEEP)[1]
    assert first["val_loss"] == again["val_loss"] != keep["val_loss"]
    assert first["short_val_loss"] == again["short_val_loss"] != keep["short_val_loss"]
    assert first["continue"].step == base.step + run.horizon  # the main line continues there
    assert first["hyperparameters"]["learning_rate"] == rate  # recorded before the action
    assert first["continue_history"].window()[-1, FEATURE_NAMES.index("log_learning_rate")] == pytest.approx(
        math.log10(rate * 10) / 4, rel=1e-5)


def test_a_range_tested_task_records_its_suggestion_against_the_live_rate():
    task = tasks.make_task("iris", 0, learning_rate=1e-4, optimizer="sgd", schedule="constant")
    run = TaskRun(task, CollectionConfig(total_epochs=8, horizon_epochs=1), np.random.default_rng(0))
    reference = RangeTestStart(task.data[0], task.data[1], task.batch_size, seed=task.seed, judge="always")
    weights = run.model.get_weights()
    suggestion = run.range_test()
    for before, after in zip(weights, run.model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)  # the test left the task's start as it was
    assert suggestion == float(reference.run(run.model, reference.num_steps(run.total_steps)).suggestion)
    run.range_test_rate = suggestion
    run.train(run.observe_every, run.history)
    row = run.history.window()[-1]
    assert row[FEATURE_NAMES.index("range_test_known")] == 1.0
    assert row[FEATURE_NAMES.index("range_test_gap")] == pytest.approx(
        np.clip(math.log10(suggestion / 1e-4) / 4, -1, 1), rel=1e-5)


def test_decision_data_groups_records_and_targets_score_differences_to_keep():
    records = [record("r", 10, 0, 0.2), record("r", 10, 2, -0.1), record("r", 20, 2, 0.0),
               record("r", 30, 0, 0.5)]  # step 30 never tried keep: nothing to compare with, left out
    data = decision_data(records)
    assert len(data) == 2
    expected = np.full((2, len(ACTIONS)), np.nan)
    expected[0, [0, KEEP]] = [0.3, 0.0]
    expected[1, KEEP] = 0.0
    np.testing.assert_allclose(data.targets(), expected, rtol=1e-6)


def test_decision_data_can_score_by_the_short_horizon():
    records = [record("r", 10, 0, 0.2), record("r", 10, 2, -0.1)]
    records[0].outcome["score_short"], records[1].outcome["score_short"] = -0.4, 0.0
    np.testing.assert_allclose(decision_data(records, score="score_short").scores[0, [0, KEEP]], [-0.4, 0.0])
    np.testing.assert_allclose(decision_data(records).scores[0, [0, KEEP]], [0.2, -0.1])


def test_masked_score_error_against_numpy_over_the_tried_candidates():
    rng = np.random.default_rng(0)
    predicted = rng.normal(size=(5, len(ACTIONS))).astype("float32") * 2
    targets = rng.normal(size=(5, len(ACTIONS))).astype("float32")
    targets[rng.random(targets.shape) < 0.4] = np.nan
    targets[:, KEEP] = 0.0
    error = np.abs(predicted - targets)
    huber = np.where(error <= 1.0, 0.5 * error**2, error - 0.5)
    expected = np.mean([np.nanmean(row) for row in huber])
    loss = float(MaskedScoreError()(targets, predicted))
    assert loss == pytest.approx(expected, rel=1e-5)
    import tensorflow as tf

    variable = tf.Variable(predicted)
    with tf.GradientTape() as tape:
        value = MaskedScoreError()(targets, variable)
    gradient = tape.gradient(value, variable).numpy()
    assert np.all(np.isfinite(gradient)) and np.all(gradient[np.isnan(targets)] == 0)


@pytest.mark.parametrize("differences, allowed, min_gain, expected", [
    ([0.3, -0.02, 0.0, 0.5, 0.5, 0.1, 0.1, 0.2, 0.3], None, 0.05, (KEEP, 0.02, 1)),  # too small a gain: keep
    ([0.3, -0.2, 0.0, 0.5, 0.5, 0.1, 0.1, 0.2, 0.3], None, 0.05, (1, 0.2, 1)),  # clearly better: applied
    ([0.3, -0.02, 0.0, 0.5, 0.5, 0.1, 0.1, 0.2, 0.3], None, 0.0, (1, 0.02, 1)),  # no threshold
    ([0.3, 0.2, 0.0, -0.5, 0.5, 0.1, 0.1, 0.2, 0.3], [1, 1, 1, 0, 1, 1, 1, 1, 1], 0.05, (KEEP, 0.0, KEEP)),  # best not allowed
    ([0.3, 0.2, 0.0, -0.5, 0.5, 0.1, 0.1, 0.2, 0.3], [1, 1, 0, 0, 0, 0, 0, 0, 0], 0.05, (1, -0.2, 1)),  # keep not allowed
    ([0.3, 0.2, 0.0, -0.5, 0.5, 0.1, 0.1, 0.2, 0.3], [0] * 9, 0.05, (KEEP, 0.0, KEEP)),  # nothing allowed
    ([0.3, -0.04, 0.0, 0.5, 0.5, 0.1, 0.1, 0.2, 0.3], None, [0.03, 0.03] + [0.1] * 7, (1, 0.04, 1)),  # its own threshold
    ([0.3, 0.5, 0.0, -0.04, 0.5, 0.1, 0.1, 0.2, 0.3], None, [0.03, 0.03] + [0.1] * 7, (KEEP, 0.04, 3)),
])
def test_choose_abstains_unless_the_predicted_gain_is_clear(differences, allowed, min_gain, expected):
    choice = choose_from(np.asarray(differences), allowed, min_gain)
    assert (choice.action, choice.considered) == (expected[0], expected[2])
    assert choice.gain == pytest.approx(expected[1])
    assert choice.abstained == (expected[0] != expected[2])


def test_regret_against_the_best_candidate():
    records = [record("r", 10, a, s) for a, s in [(0, -0.5), (2, 0.0), (3, 0.3)]]
    report = evaluate_policies(decision_data(records), constant_meta_model(3))
    assert report["keep"] == {"accuracy": 0.0, "regret": pytest.approx(0.5)}
    assert report["meta_model"] == {"accuracy": 0.0, "regret": pytest.approx(0.8)}


def test_empty_store_is_refused(tmp_path):
    with pytest.raises(ValueError, match="The record store is empty: collect records first"):
        train_meta_model(RecordStore(tmp_path / "empty.sqlite"), tmp_path / "tuner")


def test_one_family_is_refused():
    with pytest.raises(ValueError, match=r"needs records from at least 2 task families .* \['a'\]"):
        train_meta_model([record("r", 10, 2, 0.0)], "unused")


def test_search_saves_a_model_that_loads_with_its_spec(tmp_path):
    rng = np.random.default_rng(0)
    records = []
    for index in range(40):
        window = rng.normal(size=(WINDOW, len(FEATURE_NAMES)))
        best = 0 if window[-1, 0] > 0 else 4  # learnable from the last row
        records += [record(f"r{index}", 10, a, 0.0 if a == best else 1.0, family="ab"[index % 2],
                           window=window) for a in (0, 2, 4)]
    _, report = train_meta_model(records, tmp_path / "tuner", tmp_path / "meta.keras",
                                 max_trials=1, epochs=2)
    assert report["decisions"] == 40 and report["families"] == ["a", "b"]
    assert set(report["held_out"]["a"]) == {"decisions", "keep", "rule", "meta_model", "regret_by_min_gain"}
    assert set(report["mean"]["meta_model_regret_by_min_gain"]) == {"0", "0.02", "0.05", "0.1", "0.2"}
    assert (tmp_path / "meta.json").is_file()
    model = load_meta_model(tmp_path / "meta.keras")
    assert model.output_shape == (None, len(ACTIONS))


def test_meta_model_path_must_be_a_keras_file(tmp_path):
    with pytest.raises(ValueError, match=r"Received: meta_model='.*model\.h5'"):
        load_meta_model(tmp_path / "model.h5")


def _small(task, rows=96):
    x, y, x_val, y_val = task.data
    return dataclasses.replace(task, data=(x[:rows], y[:rows], x_val[:rows], y_val[:rows]))


@pytest.mark.parametrize("family, architecture, loss, input_shape", [
    ("digits_conv", "conv", "classification", (8, 8, 1)),
    ("waves", "rnn", "classification", (24, 1)),
    ("adding", "rnn", "regression", (20, 2)),
    ("digits_autoencoder", "autoencoder", "reconstruction", (64,)),
])
def test_collection_covers_conv_recurrent_and_reconstruction_tasks(family, architecture, loss, input_shape):
    task = _small(tasks.make_task(family, 0, learning_rate=0.01, optimizer="adam", schedule="cosine"))
    assert (task.architecture, task.loss, task.data[0].shape[1:]) == (architecture, loss, input_shape)
    if loss == "reconstruction":
        np.testing.assert_array_equal(task.data[0], task.data[1])
    run = TaskRun(task, TINY, np.random.default_rng(0))
    records = run.run()
    least = len(ACTIONS) - len(SUGGESTION_ACTIONS)
    most = len(ACTIONS) if run.range_test_rate is not None else least
    assert 2 * least <= len(records) <= 2 * most and {r.hyperparameters["architecture"] for r in records} == {architecture}
    for r in records:  # scored at the end of the budget, with the short horizon's score beside it
        assert r.outcome["horizon"] == run.total_steps - r.step and r.outcome["short_horizon"] == run.horizon
        assert -5 <= r.outcome["score"] <= 5 and -5 <= r.outcome["score_short"] <= 5
    # Under the cosine schedule the rate ahead is lower: the feature is negative, and more so later.
    ahead = [r.features[-1, FEATURE_NAMES.index("schedule_ahead")] for r in records if r.adjustment["action"] == KEEP]
    assert ahead[0] < 0 and ahead[1] < ahead[0]


@pytest.mark.parametrize("schedule", ["constant", "cosine", "triangular"])
def test_task_schedules_follow_the_budget(schedule):
    task = tasks.make_task("iris", 0, learning_rate=0.2, optimizer="sgd", schedule=schedule)
    model = task.build(total_steps=100)
    rate = model.optimizer.learning_rate  # the schedule's value at step 0
    expected = {"constant": 0.2, "cosine": 0.2, "triangular": 0.02}[schedule]
    assert float(rate) == pytest.approx(expected, rel=1e-6)
    if schedule != "constant":
        schedule_object = model.optimizer._learning_rate
        assert float(schedule_object(100)) == pytest.approx(0.0, abs=1e-7)
        assert float(schedule_object(20 if schedule == "triangular" else 0)) == pytest.approx(0.2, rel=1e-6)


def test_a_scheduled_task_needs_its_budget_and_a_known_schedule():
    with pytest.raises(ValueError, match=r"Received: schedule='linear'"):
        tasks.make_task("iris", 0, schedule="linear")
    with pytest.raises(ValueError, match="pass `total_steps`"):
        tasks.make_task("iris", 0, schedule="cosine").build()
