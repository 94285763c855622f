"""`AdjustmentRunner` on its own: a stub predictor, a one-layer model, the weights and the log as the oracle."""

import json

import keras
import numpy as np
import pytest

import kadapt
from kadapt.meta import AdjustmentPolicy
from kadapt.meta import Trigger
from kadapt.meta.live.adjuster_state import load_state
from kadapt.meta.live.adjuster_state import save_state
from kadapt.meta.live.adjustment_runner import AdjustmentRunner
from kadapt.meta.live.adjustment_runner import Progress
from kadapt.meta.live.decision_log import DECISIONS_FILE
from kadapt.meta.live.decision_log import DecisionLog
from kadapt.meta.model.actions import ACTIONS
from kadapt.meta.model.actions import KEEP
from kadapt.meta.model.actions import optimizer_mask
from kadapt.optimizers.live_variables import applied_learning_rate

pytestmark = pytest.mark.backends("tensorflow", "jax")

LR_DOWN_10, LR_UP_3 = 0, 3  # indices into kadapt.meta.actions.ACTIONS
RATE, MOMENTUM = 0.1, 0.9


def predicting(best, gain=0.5):
    """A predictor: `best` ends `gain` below keeping, every other action 1.0 above it."""
    differences = np.ones(len(ACTIONS))
    differences[KEEP], differences[best] = 0.0, -gain
    return lambda window: differences


def regression_data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1).astype("float32")


def linear_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer=keras.initializers.Constant(0.2))])
    model.compile(optimizer=kadapt.optimizers.SGD(RATE, momentum=MOMENTUM), loss="mse")
    return model


def runner_on(model, best, log_dir=None):
    policy = AdjustmentPolicy(predicting(best), optimizer_mask(model.optimizer))
    return AdjustmentRunner(model, policy, Trigger(patience=2, cooldown=0), DecisionLog(log_dir, verbose=0))


def train_steps(model, runner, steps):
    x, y = regression_data()
    for _ in range(steps):
        runner.after_step(float(model.train_on_batch(x, y)))


def host_values(variables):
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in variables]


def slots_by_name(optimizer):
    """The optimizer's variables by name, the kernel's velocity (SGD's one slot) as "velocity"."""
    names = ["velocity" if v.name.endswith("_velocity") else v.name for v in optimizer.variables]
    return dict(zip(names, host_values(optimizer.variables), strict=True))


def numpy_descent(rates):
    """Keras' SGD with momentum on the mean squared error, one full batch a step."""
    x, y = regression_data()
    w, velocity = np.full((3, 1), 0.2), np.zeros((3, 1))
    for rate in rates:
        velocity = MOMENTUM * velocity - rate * 2.0 / len(x) * x.T @ (x @ w - y)
        w = w + velocity
    return w


def test_a_plateau_applies_the_chosen_action_and_writes_its_record(tmp_path):
    model = linear_model()
    runner = runner_on(model, LR_UP_3, tmp_path)
    runner.log.begin()
    train_steps(model, runner, 1)
    for _ in range(3):  # the same loss three times: a plateau at the third (patience 2)
        runner.observe(1.0, None, 1.0, measured_now=False, progress=Progress(step=1, total_steps=10))
    train_steps(model, runner, 1)

    assert applied_learning_rate(model.optimizer) == pytest.approx(3 * RATE)
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent([RATE, 3 * RATE]), rtol=1e-5)
    (decision,) = runner.log.decisions
    assert decision["trigger"] == "plateau" and decision["action"] == "lr x3" and decision["applied"] is True
    assert decision["adjustment"] == {"learning_rate_multiplier": 3.0} and decision["predicted_gain"] == 0.5
    assert decision["learning_rate"] == pytest.approx(3 * RATE) and decision["momentum"] == pytest.approx(MOMENTUM)
    assert decision["step"] == 1 and not decision["rollback"]
    lines = (tmp_path / DECISIONS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [decision]


def test_a_divergence_restores_the_weights_and_slots_of_the_last_good_point_exactly(observed_on):
    model = linear_model()
    runner = runner_on(model, LR_DOWN_10)
    train_steps(model, runner, 1)
    runner.observe(1.0, 1.0, 1.0, measured_now=True, progress=Progress(step=1))  # confirms the state now
    assert (runner.observer is not None) == (observed_on == "device")
    weights, slots = host_values(model.variables), slots_by_name(model.optimizer)
    train_steps(model, runner, 2)
    assert not np.array_equal(model.get_weights()[0], weights[0])

    runner.observe(float("nan"), None, float("nan"), measured_now=False, progress=Progress(step=3))

    for restored, saved in zip(host_values(model.variables), weights, strict=True):
        np.testing.assert_array_equal(restored, saved)
    restored = slots_by_name(model.optimizer)
    np.testing.assert_array_equal(restored["velocity"], slots["velocity"])
    assert np.all(slots["velocity"] != 0)  # a velocity had been built, and it is back
    assert int(restored["iteration"]) == 3  # the step count goes on
    assert applied_learning_rate(model.optimizer) == pytest.approx(0.1 * RATE)
    (decision,) = runner.log.decisions
    assert decision["trigger"] == "divergence" and decision["rollback"] and decision["action"] == "lr x0.1"


def test_a_second_divergence_within_patience_restarts_the_slots_from_zero(observed_on):
    model = linear_model()
    runner = runner_on(model, LR_DOWN_10)
    train_steps(model, runner, 1)
    runner.observe(1.0, 1.0, 1.0, measured_now=True, progress=Progress(step=1))
    weights = host_values(model.variables)
    for step in (2, 3):
        train_steps(model, runner, 1)
        runner.observe(float("nan"), None, float("nan"), measured_now=False, progress=Progress(step=step))

    for restored, saved in zip(host_values(model.variables), weights, strict=True):
        np.testing.assert_array_equal(restored, saved)
    np.testing.assert_array_equal(slots_by_name(model.optimizer)["velocity"], np.zeros((3, 1)))
    assert applied_learning_rate(model.optimizer) == pytest.approx(0.01 * RATE)
    assert [d["action"] for d in runner.log.decisions] == ["lr x0.1", "lr x0.1"]


def test_the_last_observation_rolls_back_but_adjusts_nothing(observed_on):
    model = linear_model()
    runner = runner_on(model, LR_DOWN_10)
    train_steps(model, runner, 1)
    runner.observe(1.0, 1.0, 1.0, measured_now=True, progress=Progress(step=1))
    weights = host_values(model.variables)
    train_steps(model, runner, 1)

    runner.observe(float("nan"), None, float("nan"), measured_now=False, progress=Progress(step=2, final=True))

    np.testing.assert_array_equal(host_values(model.variables)[0], weights[0])
    assert applied_learning_rate(model.optimizer) == pytest.approx(RATE)
    assert [d["action"] for d in runner.log.decisions] == ["rollback (training ends)"]


def first_loss():
    x, y = regression_data()
    return float(np.mean((x @ np.full((3, 1), 0.2) - y) ** 2))


@pytest.mark.parametrize("resumed", [False, True])
def test_a_first_early_cut_near_the_starting_loss_starts_again_from_the_initial_state(observed_on, resumed, tmp_path):
    model = linear_model()
    runner = runner_on(model, LR_DOWN_10)
    initial = host_values(model.trainable_variables)
    train_steps(model, runner, 3)
    if resumed:  # the initial state rides in the saved state, through the backup's file
        save_state(tmp_path / "state.npz", runner.get_state())
        runner = runner_on(model, LR_DOWN_10)
        runner.set_state(load_state(tmp_path / "state.npz"))
    watched = 0.9 * first_loss()  # most of the starting loss kept

    for _ in range(3):  # the same loss three times: a plateau at the third (patience 2)
        runner.observe(watched, watched, watched, measured_now=True, progress=Progress(step=3, budget_used=0.1))

    np.testing.assert_array_equal(host_values(model.trainable_variables)[0], initial[0])
    slots = slots_by_name(model.optimizer)
    np.testing.assert_array_equal(slots["velocity"], np.zeros((3, 1)))
    assert int(slots["iteration"]) == 3  # the step count goes on
    (decision,) = runner.log.decisions
    assert decision["action"] == "lr x0.1, from the start" and decision["restart"] and not decision["rollback"]
    train_steps(model, runner, 2)  # from the initial weights at the cut rate, the velocity built anew
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent([0.1 * RATE] * 2), rtol=1e-5)


def test_a_cut_after_the_run_learned_keeps_its_weights():
    model = linear_model()
    runner = runner_on(model, LR_DOWN_10)
    train_steps(model, runner, 3)
    watched = 0.7 * first_loss()

    for _ in range(3):
        runner.observe(watched, watched, watched, measured_now=True, progress=Progress(step=3, budget_used=0.1))

    np.testing.assert_allclose(model.get_weights()[0], numpy_descent([RATE] * 3), rtol=1e-5)
    (decision,) = runner.log.decisions
    assert decision["action"] == "lr x0.1" and "restart" not in decision
    assert runner.start is not None  # held until the restart window has passed
    runner.observe(watched, watched, watched, measured_now=True, progress=Progress(step=4, budget_used=0.31))
    assert runner.start is None


def test_arguments_are_checked():
    model = linear_model()
    policy = AdjustmentPolicy(predicting(KEEP))
    with pytest.raises(TypeError, match=r"Argument `trigger` must be a kadapt.meta.Trigger. Received: trigger=3"):
        AdjustmentRunner(model, policy, 3, DecisionLog())
    with pytest.raises(TypeError, match=r"Argument `policy` must be a kadapt.meta.AdjustmentPolicy. Received: policy=<function"):
        AdjustmentRunner(model, predicting(KEEP), Trigger(), DecisionLog())
