"""A judged restart (`kadapt.meta.RestartTrial` run by the `AdjustmentRunner`): the branch against NumPy descent."""

import keras
import numpy as np
import pytest

import kadapt
from kadapt.meta import AdjustmentPolicy
from kadapt.meta import RestartTrial
from kadapt.meta import Trigger
from kadapt.meta.live.adjustment_runner import AdjustmentRunner
from kadapt.meta.live.adjustment_runner import Progress
from kadapt.meta.live.decision_log import DecisionLog
from kadapt.meta.model.actions import ACTIONS
from kadapt.meta.model.actions import KEEP
from kadapt.meta.model.actions import optimizer_mask
from kadapt.optimizers.live_variables import applied_learning_rate

pytestmark = pytest.mark.backends("tensorflow", "jax")

LR_DOWN_10 = 0  # index into kadapt.meta.actions.ACTIONS
RATE, MOMENTUM, ROWS = 0.1, 0.9, 8
INITIAL = 0.2


def regression_data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1).astype("float32")


def linear_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer=keras.initializers.Constant(INITIAL))])
    model.compile(optimizer=kadapt.optimizers.SGD(RATE, momentum=MOMENTUM), loss="mse")
    return model


def numpy_descent(w, rates):
    """Keras' SGD with momentum on the mean squared error, one full batch a step, from `w` at rest."""
    x, y = regression_data()
    velocity = np.zeros_like(w)
    for rate in rates:
        velocity = MOMENTUM * velocity - rate * 2.0 / len(x) * x.T @ (x @ w - y)
        w = w + velocity
    return w, velocity


def mse(w):
    x, y = regression_data()
    return float(np.mean((x @ w - y) ** 2))


def judged_run(model, observed=True):
    """A runner whose predictor cuts x0.1, with a restart trial on the full batch (validation: the
    same rows); two steps trained, then three observations at half the first loss: a plateau at
    the third, 10% into the budget, the run's first change: a judged restart."""
    charged = []
    x, y = regression_data()
    differences = np.ones(len(ACTIONS))
    differences[KEEP], differences[LR_DOWN_10] = 0.0, -0.5
    policy = AdjustmentPolicy(lambda window: differences, optimizer_mask(model.optimizer))
    trial = RestartTrial(x, y, validation_data=(x, y), batch_size=ROWS, seed=0)
    runner = AdjustmentRunner(model, policy, Trigger(patience=2, cooldown=0), DecisionLog(None, verbose=0),
                              restart_trial=trial, charge=lambda steps, kept: charged.append((steps, kept)))
    first = None
    for _ in range(2):
        loss = float(model.train_on_batch(x, y))
        first = loss if first is None else first
        runner.after_step(loss)
    return runner, charged, first


def observe_plateau(runner, first):
    for _ in range(3):
        runner.observe(first / 2, None, first / 2, measured_now=False,
                       progress=Progress(step=2, total_steps=20, budget_used=0.1))


def host_values(variables):
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in variables]


def test_a_branch_that_beats_the_run_is_where_the_run_goes_on(observed_on):
    model = linear_model()
    runner, charged, first = judged_run(model)
    bad = np.full((3, 1), 5.0, "float32")  # the run as it is now: far off
    model.layers[0].kernel.assign(bad)

    observe_plateau(runner, first)

    # The branch: from the initial weights at rest, two steps (the run's so far) at the cut rate.
    expected, velocity = numpy_descent(np.full((3, 1), INITIAL), [0.1 * RATE] * 2)
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)
    (slot,) = [v for v in model.optimizer.variables if v.name.endswith("_velocity")]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(slot), velocity, rtol=1e-5)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4  # the branch's steps trained
    assert applied_learning_rate(model.optimizer) == pytest.approx(0.1 * RATE)
    assert charged == [(2, 2)]  # trained, none charged
    (decision,) = runner.log.decisions
    assert decision["action"] == "lr x0.1, from the start" and decision["restart"] and decision["applied"]
    detail = decision["restart_trial"]
    assert detail["steps"] == 2 and detail["taken"] is True
    assert detail["held_loss_now"] == pytest.approx(mse(bad), rel=1e-5)
    assert detail["held_loss_restarted"] == pytest.approx(mse(expected), rel=1e-5)
    # A later divergence returns to the branch's end, not to the state before the trial.
    model.layers[0].kernel.assign(bad)
    runner.observe(float("nan"), None, float("nan"), measured_now=False,
                   progress=Progress(step=4, total_steps=20, budget_used=0.2))
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)


def test_a_branch_that_loses_leaves_the_run_as_it_was_with_the_cut_and_its_steps_charged():
    model = linear_model()
    runner, charged, first = judged_run(model)
    before = host_values(model.variables) + host_values(model.optimizer.variables)
    now, _ = numpy_descent(np.full((3, 1), INITIAL), [RATE] * 2)
    branch, _ = numpy_descent(np.full((3, 1), INITIAL), [0.1 * RATE] * 2)
    assert mse(now) < mse(branch)  # the premise: two steps at the rate beat two at a tenth of it

    observe_plateau(runner, first)

    after = host_values(model.variables) + host_values(model.optimizer.variables)
    names = [v.name for v in model.variables] + [v.name for v in model.optimizer.variables]
    for name, value, saved in zip(names, after, before, strict=True):
        if "multiplier" not in name:
            np.testing.assert_array_equal(value, saved, err_msg=name)
    assert applied_learning_rate(model.optimizer) == pytest.approx(0.1 * RATE)  # the cut, where the run is
    assert charged == [(2, 0)]
    (decision,) = runner.log.decisions
    assert decision["action"] == "lr x0.1" and "restart" not in decision
    assert decision["restart_trial"]["taken"] is False
    assert decision["restart_trial"]["held_loss_now"] == pytest.approx(mse(now), rel=1e-5)
    assert decision["restart_trial"]["held_loss_restarted"] == pytest.approx(mse(branch), rel=1e-5)


def test_without_a_trial_the_judged_restart_is_a_plain_cut():
    model = linear_model()
    x, y = regression_data()
    differences = np.ones(len(ACTIONS))
    differences[KEEP], differences[LR_DOWN_10] = 0.0, -0.5
    runner = AdjustmentRunner(model, AdjustmentPolicy(lambda window: differences, optimizer_mask(model.optimizer)),
                              Trigger(patience=2, cooldown=0), DecisionLog(None, verbose=0))
    first = None
    for _ in range(2):
        loss = float(model.train_on_batch(x, y))
        first = loss if first is None else first
        runner.after_step(loss)
    weights = model.get_weights()[0]

    observe_plateau(runner, first)

    np.testing.assert_array_equal(model.get_weights()[0], weights)
    (decision,) = runner.log.decisions
    assert decision["action"] == "lr x0.1" and "restart_trial" not in decision


def test_the_branch_trains_as_many_steps_as_the_run_did_at_most_share_of_the_budget():
    x, y = regression_data()
    trial = RestartTrial(x, y, share=0.1)
    assert [trial.num_steps(s, 200) for s in (0, 5, 20, 60)] == [1, 5, 20, 20]
    assert trial.num_steps(7, None) == 7
    train, held = trial.batches(3)
    held_rows = np.concatenate([b[0] for b in held])
    train_rows = np.concatenate([b[0] for b in train])
    assert len(train) == 3 and len(held_rows) == 2  # without validation data a quarter of the rows is held
    assert len(np.unique(train_rows, axis=0)) == ROWS - 2
    assert not any((row == train_rows).all(axis=1).any() for row in held_rows)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"x": iter([1, 2]), "y": None}, TypeError, "Argument `x` must be an array"),
    ({"y": np.zeros((5, 1))}, ValueError, "as many rows"),
    ({"validation_data": np.zeros((3, 3))}, TypeError, "validation_data"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"share": 1.5}, ValueError, "share"),
])
def test_bad_restart_trial_arguments(kwargs, error, message):
    x, y = regression_data()
    with pytest.raises(error, match=message):
        RestartTrial(**{"x": x, "y": y, **kwargs})


def test_the_adjuster_takes_only_a_restart_trial():
    with pytest.raises(TypeError, match="Argument `restart_trial` must be \"auto\", a kadapt.meta.RestartTrial or None"):
        kadapt.MetaAdjuster(restart_trial=(np.zeros((4, 3)), np.zeros((4, 1))))
