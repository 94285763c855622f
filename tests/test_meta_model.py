"""Record collection, decision data, the meta-model search and its file."""

import math

import numpy as np
import pytest
from helpers import constant_meta_model

from kadapt.meta import AdjustmentRecord
from kadapt.meta import CollectionConfig
from kadapt.meta import RecordStore
from kadapt.meta import collect
from kadapt.meta import load_meta_model
from kadapt.meta import tasks
from kadapt.meta import train_meta_model
from kadapt.meta.actions import ACTIONS
from kadapt.meta.actions import KEEP
from kadapt.meta.collect import Snapshot
from kadapt.meta.collect import TaskRun
from kadapt.meta.features import FEATURE_NAMES
from kadapt.meta.features import WINDOW
from kadapt.meta.meta_model import TEMPERATURE
from kadapt.meta.meta_model import decision_data
from kadapt.meta.meta_model import evaluate_policies
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
    assert steps == [6, 9] and appended == store.count() == 2 * len(ACTIONS)
    assert collect(store, [task], TINY, progress=False) == 0  # resumed: nothing recomputed


def test_a_branch_restores_the_snapshot_exactly():
    task = tasks.make_task("iris", 0, learning_rate=0.05, optimizer="adam")
    run = TaskRun(task, TINY, np.random.default_rng(0))
    run.run()
    base = Snapshot.take(run.model, run.batches, run.step, run.history.last_val_loss)
    rate = applied_learning_rate(run.model.optimizer)
    first = run.branch(base, 4)[1]
    again = run.branch(base, 4)[1]
    keep = run.branch(base, KEEP)[1]
    assert first["val_loss"] == again["val_loss"] != keep["val_loss"]
    assert first["hyperparameters"]["learning_rate"] == rate  # recorded before the action
    assert first["history"].window()[-1, FEATURE_NAMES.index("log_learning_rate")] == pytest.approx(
        math.log10(rate * 10) / 4, rel=1e-5)


def test_decision_data_groups_records_and_makes_soft_targets():
    records = [record("r", 10, 0, 0.2), record("r", 10, 2, -0.1), record("r", 20, 2, 0.0)]
    data = decision_data(records)
    assert len(data) == 2
    expected = np.zeros(len(ACTIONS))
    expected[[0, 2]] = np.exp(-np.array([0.3, 0.0]) / TEMPERATURE)
    np.testing.assert_allclose(data.targets()[0], expected / expected.sum(), rtol=1e-6)
    np.testing.assert_allclose(data.targets()[1], np.eye(len(ACTIONS))[2])


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
    assert set(report["held_out"]["a"]) == {"decisions", "keep", "rule", "meta_model"}
    assert (tmp_path / "meta.json").is_file()
    model = load_meta_model(tmp_path / "meta.keras")
    assert model.output_shape == (None, len(ACTIONS))


def test_meta_model_path_must_be_a_keras_file(tmp_path):
    with pytest.raises(ValueError, match=r"Received: meta_model='.*model\.h5'"):
        load_meta_model(tmp_path / "model.h5")
