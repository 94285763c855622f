"""`plan_training`: each `kadapt train` setting decided once, on the data's facts, into a frozen plan."""

import dataclasses

import numpy as np
import pytest

from kadapt.recipes.optimizer_choice import MEASURED
from kadapt.recipes.task import Task
from kadapt.run.config import RunConfig
from kadapt.run.data import TrainingData
from kadapt.run.errors import UsageError
from kadapt.run.train_plan import WORKERS_PRECISION
from kadapt.run.train_plan import plan_training

FOUND = {"learning_rate": 0.0123, "rule": "valley", "steps_run": 90, "diverged": True}


def _table(rows=40):
    x, y = np.zeros((rows, 3), "float32"), np.arange(rows) % 2
    return TrainingData(x, y, x[:4], y[:4], x[:4], y[:4], Task(outputs=2))


def test_a_table_plans_an_mlp_with_adam_at_its_measured_rate_and_the_last_weights():
    plan = plan_training(RunConfig(data="x.npy,y.npy"), _table())
    assert (plan.network, plan.config.batch_size) == ("mlp", 16)
    chosen = ("adam", *MEASURED["adam"])
    assert (plan.optimizer.optimizer, plan.optimizer.learning_rate, plan.optimizer.schedule) == chosen
    assert (plan.recipe.optimizer, plan.recipe.learning_rate, plan.recipe.schedule) == chosen
    assert not plan.recipe.restore_best_weights and not plan.recipe.augments
    assert plan.precision is None  # --precision auto in one process: measured on the network
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.network = "small_cnn"


def test_the_printed_optimizer_line_is_the_plans_choice():
    plan = plan_training(RunConfig(data="x.npy,y.npy", recipe={"optimizer": "sgd", "schedule": "cosine"}), _table())
    assert plan.optimizer.text() == "sgd, learning rate 0.2, cosine schedule (--optimizer sgd)"


def test_a_resumed_run_plans_with_the_rate_and_precision_it_recorded():
    precision = {"policy": "mixed_bfloat16", "seconds_per_step": {"float32": 0.2}, "reason": "measured"}
    config = RunConfig(data="x.npy,y.npy", recipe={"learning_rate": "auto"})
    plan = plan_training(config, _table(), recorded={"range_test": FOUND, "precision": precision})
    assert plan.recipe.learning_rate == 0.0123 and plan.range_test == FOUND
    assert plan.optimizer.learning_rate == "auto"  # as the flags chose it: what the run prints and records
    assert plan.record()["range_test"] == FOUND and plan.record()["recipe"]["learning_rate"] == 0.0123
    assert plan.precision.policy == "mixed_bfloat16"


def test_a_new_auto_rate_waits_for_the_range_test():
    plan = plan_training(RunConfig(data="x.npy,y.npy", recipe={"learning_rate": "auto"}), _table())
    assert plan.recipe.learning_rate == "auto" and plan.range_test is None
    assert plan.with_found_rate(FOUND).recipe.learning_rate == 0.0123


def test_workers_plan_float32_for_auto_precision_and_refuse_an_auto_rate(monkeypatch):
    monkeypatch.delenv("KADAPT_PRECISION", raising=False)
    plan = plan_training(RunConfig(data="x.npy,y.npy", batch_size=16), _table(), workers=2)
    assert (plan.precision.policy, plan.precision.reason) == ("float32", WORKERS_PRECISION)
    with pytest.raises(UsageError, match=r"^--learning-rate auto runs a range test in each worker"):
        plan_training(RunConfig(data="x.npy,y.npy", recipe={"learning_rate": "auto"}), _table(), workers=2)
    with pytest.raises(UsageError, match=r"^--batch-size 15 is the global batch of 2 workers: use a multiple of 2"):
        plan_training(RunConfig(data="x.npy,y.npy", batch_size=15), _table(), workers=2)
