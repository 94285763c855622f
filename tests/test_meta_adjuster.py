"""MetaAdjuster inside model.fit, proven by the weights against a NumPy oracle."""

import json

import keras
import keras_tuner
import numpy as np
import pytest
from helpers import constant_meta_model

import kadapt
from kadapt.meta import MetaAdjuster
from kadapt.meta import MetaSpec
from kadapt.meta import Trigger
from kadapt.meta.model.actions import ACTIONS
from kadapt.meta.model.actions import KEEP as KEEP_INDEX
from kadapt.meta.model.features import FEATURE_NAMES

LR_UP, LR_DOWN_10, MOMENTUM_HIGH = 3, 0, 6  # indices into kadapt.meta.actions.ACTIONS
ROWS = 8


def regression_data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1).astype("float32")


def linear_model(optimizer, accumulate=False):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer=keras.initializers.Constant(0.2))])
    if accumulate:
        model = kadapt.accumulate(model, micro_batch_size=3)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def fires_once_at_step_3():
    """Never "improves" after the first loss, so with patience 2 it fires at the third
    observation; after that the patience restarts and the fit ends before it fires again."""
    return Trigger(patience=2, cooldown=0, min_delta=0.99)


def numpy_descent(x, y, rates, momenta):
    w, velocity = np.full((3, 1), 0.2), np.zeros((3, 1))
    for rate, momentum in zip(rates, momenta, strict=True):
        gradient = 2.0 / len(x) * x.T @ (x @ w - y)
        velocity = momentum * velocity - rate * gradient
        w = w + velocity
    return w


def fit(model, adjuster, epochs=4):
    x, y = regression_data()
    return model.fit(x, y, batch_size=ROWS, epochs=epochs, shuffle=False, verbose=0, callbacks=[adjuster])


@pytest.mark.parametrize("accumulate", [False, True])
def test_learning_rate_multiplier_reaches_the_compiled_step_under_a_schedule(accumulate):
    # A rising (warmup-like) schedule: a slowdown under an annealing one is left alone.
    schedule = kadapt.schedules.PiecewiseLinear([0, 4], [0.02, 0.06])
    model = linear_model(kadapt.optimizers.SGD(schedule), accumulate)
    adjuster = MetaAdjuster(constant_meta_model(LR_UP), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), verbose=0)
    fit(model, adjuster)
    x, y = regression_data()
    rates = [(0.02 + 0.01 * t) * (3.0 if t == 3 else 1.0) for t in range(4)]
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent(x, y, rates, [0.0] * 4), rtol=1e-5)
    assert [d["step"] for d in adjuster.decisions] == [3]
    assert adjuster.decisions[0]["trigger"] == "plateau"


def test_stock_keras_optimizer_gets_its_float_learning_rate_set():
    model = linear_model(keras.optimizers.SGD(0.01))
    adjuster = MetaAdjuster(constant_meta_model(LR_UP), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), verbose=0)
    fit(model, adjuster)
    x, y = regression_data()
    np.testing.assert_allclose(model.get_weights()[0],
                               numpy_descent(x, y, [0.01, 0.01, 0.01, 0.03], [0.0] * 4), rtol=1e-5)


def test_an_unclear_gain_is_considered_and_logged_but_not_applied(tmp_path):
    model = linear_model(kadapt.optimizers.SGD(0.01, momentum=0.0))
    adjuster = MetaAdjuster(constant_meta_model(LR_UP, gain=0.04), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), log_dir=tmp_path, verbose=0)
    fit(model, adjuster)
    x, y = regression_data()
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent(x, y, [0.01] * 4, [0.0] * 4), rtol=1e-5)
    logged = [json.loads(line) for line in (tmp_path / "meta_decisions.jsonl").read_text().splitlines()]
    assert [(d["step"], d["action"], d["applied"], d["adjustment"]) for d in logged] == [
        (3, "keep (considered lr x3)", False, {})]
    assert logged[0]["predicted_gain"] == pytest.approx(0.04)
    # The same prediction with a lower threshold is applied.
    model = linear_model(kadapt.optimizers.SGD(0.01, momentum=0.0))
    fit(model, MetaAdjuster(constant_meta_model(LR_UP, gain=0.04), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), verbose=0, min_gain=0.03))
    np.testing.assert_allclose(model.get_weights()[0],
                               numpy_descent(x, y, [0.01, 0.01, 0.01, 0.03], [0.0] * 4), rtol=1e-5)


def test_the_window_says_where_the_schedule_is():
    # A linear decay from 0.05 (step 0) to 0.01 (step 4, then flat) over a budget of 5 steps. The
    # observation after step t looks a quarter of the budget (1 step) ahead: 0.05 - 0.01 (t + 1)
    # over 0.05 - 0.01 t, until the schedule is flat. Under a constant rate the feature is 0.
    schedule = kadapt.schedules.PiecewiseLinear([0, 4], [0.05, 0.01])
    decaying = [np.log10(0.03 / 0.04) / 4, np.log10(0.02 / 0.03) / 4, np.log10(0.01 / 0.02) / 4, 0.0, 0.0]
    for optimizer, expected in [(kadapt.optimizers.SGD(schedule), decaying), (kadapt.optimizers.SGD(0.01), [0.0] * 5)]:
        adjuster = MetaAdjuster(constant_meta_model(KEEP_INDEX), monitor="loss", check_every=1,
                                trigger=Trigger(patience=10**6), verbose=0)
        fit(linear_model(optimizer), adjuster, epochs=5)
        column = adjuster.history.window()[-5:, FEATURE_NAMES.index("schedule_ahead")]
        np.testing.assert_allclose(column, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("restart", [True, False])
def test_a_first_early_cut_near_the_starting_loss_starts_the_fit_again(restart):
    # At 0.001 three steps keep nearly all of the starting loss; the cut at step 3 of 12 (25%
    # of the budget) sends the run back to its initial weights unless `restart=False`.
    model = linear_model(kadapt.optimizers.SGD(0.001, momentum=0.0))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                            trigger=Trigger(patience=2, cooldown=100, min_delta=0.99), verbose=0, restart=restart,
                            rescue=False, restart_trial=None)
    fit(model, adjuster, epochs=12)
    x, y = regression_data()
    rates = [0.0001] * 9 if restart else [0.001] * 3 + [0.0001] * 9
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent(x, y, rates, [0.0] * len(rates)), rtol=1e-5)
    assert [(d["step"], d["action"]) for d in adjuster.decisions] == [
        (3, "lr x0.1, from the start" if restart else "lr x0.1")]


@pytest.mark.backends("tensorflow", "jax")  # on JAX fit holds the state between steps: the branch must see it
@pytest.mark.parametrize("check_every", ["epoch", 1])  # 1: observed at a batch's end, in the epoch
@pytest.mark.parametrize("rate, taken", [(1.4, True), (0.001, False)])
def test_a_judged_restart_goes_on_from_its_branch_or_charges_its_steps(rate, taken, check_every):
    # One step an epoch, 12 in the budget; a scheduled consultation every 2 observations without
    # an adjustment cuts x0.1 (epochs 2, 4, 6; not at the last). The first, 25% into the budget,
    # is a judged restart: a branch trains 3 steps (share 1: all the run's) from the initial
    # weights at the cut rate. At 1.4 the run climbs (2.4 -> 4.4) and the branch wins: the run goes
    # on from its end, those steps trained. At 0.001 the run is ahead: it takes the cut where it
    # is, and the 3 steps are charged. Either way fit ends once 12 steps are counted.
    model = linear_model(kadapt.optimizers.SGD(rate, momentum=0.0))
    x, y = regression_data()
    trial = kadapt.meta.RestartTrial(x, y, validation_data=(x, y), batch_size=ROWS, share=1.0)
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=check_every,
                            trigger=Trigger(patience=100, cooldown=0, consult_every=2), verbose=0,
                            restart_trial=trial, rescue=False)
    fit(model, adjuster, epochs=12)
    first = [0.1 * rate] * 3 if taken else [rate] * 3  # the branch's steps, or the run's before the cut
    rates = first + [0.1 * rate] * 2 + [0.01 * rate] * 2 + [0.001 * rate] * 2
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent(x, y, rates, [0.0] * 9), rtol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == (12 if taken else 9)
    assert [(d["step"], d["trigger"], d["action"]) for d in adjuster.decisions] == [
        (3, "scheduled", "lr x0.1, from the start" if taken else "lr x0.1"),
        (8, "scheduled", "lr x0.1"), (10, "scheduled", "lr x0.1")]
    assert adjuster.decisions[0]["restart_trial"]["taken"] is taken
    assert adjuster.decisions[0]["restart_trial"]["steps"] == 3


def test_a_second_fit_counts_its_budget_from_its_own_first_step():
    # The same adjuster, two fits of 12 one-step epochs at 0.001; in each the judged restart at
    # step 3 is refused and its 3 steps charged, so each fit trains 9 steps (the second's budget
    # does not count the first's steps).
    model = linear_model(kadapt.optimizers.SGD(0.001, momentum=0.0))
    x, y = regression_data()
    trial = kadapt.meta.RestartTrial(x, y, validation_data=(x, y), batch_size=ROWS, share=1.0)
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every="epoch",
                            trigger=Trigger(patience=100, cooldown=0, consult_every=2), verbose=0,
                            restart_trial=trial, rescue=False)
    fit(model, adjuster, epochs=12)
    assert int(model.optimizer.iterations.numpy()) == 9
    fit(model, adjuster, epochs=12)
    assert int(model.optimizer.iterations.numpy()) == 18
    assert adjuster.decisions[0]["restart_trial"]["taken"] is False


def test_min_gain_must_be_a_non_negative_number():
    with pytest.raises(ValueError, match="min_gain"):
        MetaAdjuster(constant_meta_model(LR_UP), min_gain=-0.1)
    with pytest.raises(ValueError, match="min_cut_gain"):
        MetaAdjuster(constant_meta_model(LR_UP), min_cut_gain=-0.1)
    with pytest.raises(TypeError, match="Argument `restart` must be True or False. Received: restart='yes'"):
        MetaAdjuster(constant_meta_model(LR_UP), restart="yes")


def test_momentum_reaches_the_compiled_step():
    model = linear_model(kadapt.optimizers.SGD(0.01, momentum=0.0))
    adjuster = MetaAdjuster(constant_meta_model(MOMENTUM_HIGH), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), verbose=0)
    fit(model, adjuster)
    x, y = regression_data()
    np.testing.assert_allclose(model.get_weights()[0],
                               numpy_descent(x, y, [0.01] * 4, [0.0, 0.0, 0.0, 0.95]), rtol=1e-5)


@pytest.mark.parametrize("check_every", [1, "epoch"])
def test_no_decision_at_the_last_observation(check_every):
    # One step per epoch: the trigger fires at the third observation, the run's last.
    model = linear_model(kadapt.optimizers.SGD(0.01, momentum=0.0))
    adjuster = MetaAdjuster(constant_meta_model(MOMENTUM_HIGH), monitor="loss", check_every=check_every,
                            trigger=fires_once_at_step_3(), verbose=0)
    fit(model, adjuster, epochs=3)
    assert adjuster.decisions == []
    x, y = regression_data()
    np.testing.assert_allclose(model.optimizer.momentum.numpy(), 0.0)
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent(x, y, [0.01] * 3, [0.0] * 3), rtol=1e-5)


def test_a_decision_before_the_last_observation_still_applies():
    model = linear_model(kadapt.optimizers.SGD(0.01, momentum=0.0))
    adjuster = MetaAdjuster(constant_meta_model(MOMENTUM_HIGH), monitor="loss", check_every="epoch",
                            trigger=fires_once_at_step_3(), verbose=0)
    fit(model, adjuster, epochs=4)
    assert [d["step"] for d in adjuster.decisions] == [3]
    np.testing.assert_allclose(model.optimizer.momentum.numpy(), 0.95)


def test_a_slowdown_while_the_schedule_anneals_is_left_to_the_schedule():
    # The rate falls every step, so the plateau at the third observation is the schedule's doing.
    rates = [0.05, 0.04, 0.03, 0.02, 0.01]
    schedule = kadapt.schedules.PiecewiseLinear(list(range(5)), rates)
    model = linear_model(kadapt.optimizers.SGD(schedule, momentum=0.0))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), verbose=0)
    fit(model, adjuster, epochs=5)
    assert adjuster.decisions == []
    x, y = regression_data()
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent(x, y, rates, [0.0] * 5), rtol=1e-5)


class OscillatesAtStep3(Trigger):
    """Reports an oscillation at the third observation (and nothing else)."""

    def update(self, loss):
        super().update(loss)
        return "oscillation" if len(self.losses) == 3 else None


def test_an_oscillation_while_the_schedule_anneals_is_left_to_the_schedule():
    rates = [0.05, 0.04, 0.03, 0.02, 0.01]
    model = linear_model(kadapt.optimizers.SGD(kadapt.schedules.PiecewiseLinear(list(range(5)), rates)))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                            trigger=OscillatesAtStep3(patience=10**6), verbose=0)
    fit(model, adjuster, epochs=5)
    assert adjuster.decisions == []
    x, y = regression_data()
    np.testing.assert_allclose(model.get_weights()[0], numpy_descent(x, y, rates, [0.0] * 5), rtol=1e-5)
    # Under a constant rate the same oscillation is acted on.
    model = linear_model(kadapt.optimizers.SGD(0.05))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                            trigger=OscillatesAtStep3(patience=10**6), verbose=0)
    fit(model, adjuster, epochs=5)
    assert [(d["step"], d["trigger"], d["action"]) for d in adjuster.decisions] == [(3, "oscillation", "lr x0.1")]


def test_a_slowdown_under_a_constant_rate_is_acted_on():
    model = linear_model(kadapt.optimizers.SGD(0.05, momentum=0.0))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                            trigger=fires_once_at_step_3(), verbose=0)
    fit(model, adjuster, epochs=5)
    assert [(d["step"], d["trigger"]) for d in adjuster.decisions] == [(3, "plateau")]
    x, y = regression_data()
    np.testing.assert_allclose(model.get_weights()[0],
                               numpy_descent(x, y, [0.05] * 3 + [0.005] * 2, [0.0] * 5), rtol=1e-5)


def test_a_diverging_run_is_rolled_back_and_its_learning_rate_lowered(tmp_path):
    x, y = regression_data()
    constant = linear_model(kadapt.optimizers.SGD(10.0))
    constant.fit(x, y, batch_size=ROWS, epochs=60, shuffle=False, verbose=0)
    assert not np.all(np.isfinite(constant.get_weights()[0]))  # the setting really diverges

    model = linear_model(kadapt.optimizers.SGD(10.0))
    # The meta-model prefers raising the LR; after a rollback only reductions are allowed.
    adjuster = MetaAdjuster(constant_meta_model(4), monitor="loss", check_every=1, log_dir=tmp_path, verbose=0,
                            rescue=False)
    history = fit(model, adjuster, epochs=60)
    divergences = [d for d in adjuster.decisions if d["trigger"] == "divergence"]
    assert divergences and all(d["adjustment"]["learning_rate_multiplier"] < 1 for d in divergences)
    diverged_rate = divergences[0]["learning_rate"] / divergences[0]["adjustment"]["learning_rate_multiplier"]
    later = adjuster.decisions[adjuster.decisions.index(divergences[0]) + 1:]
    assert later and all(d["learning_rate"] <= diverged_rate / 2 for d in later)  # raises capped
    assert np.all(np.isfinite(model.get_weights()[0]))
    assert history.history["loss"][-1] < 0.02  # from 2.4; the no-bias fit cannot go below ~0.01
    lines = (tmp_path / "meta_decisions.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(adjuster.decisions))


def test_target_stops_training_and_logs_reach_history():
    model = linear_model(kadapt.optimizers.SGD(0.01))
    adjuster = MetaAdjuster(constant_meta_model(2), monitor="loss", target=1e9, verbose=0)
    history = fit(model, adjuster, epochs=5)
    assert len(history.history["loss"]) == 1
    assert adjuster.decisions[-1]["trigger"] == "target"
    assert history.history["meta_learning_rate"] == [pytest.approx(0.01)]
    assert history.history["meta_adjustments"] == [1]


def test_inside_a_keras_tuner_search(tmp_path):
    x, y = regression_data()

    def build(hp):
        return linear_model(kadapt.optimizers.SGD(hp.Choice("learning_rate", [0.01, 0.02])))

    tuner = keras_tuner.RandomSearch(build, objective="val_loss", max_trials=2, directory=tmp_path, seed=0)
    adjuster = MetaAdjuster(constant_meta_model(LR_UP), trigger=Trigger(patience=2, cooldown=0), verbose=0)
    tuner.search(x, y, validation_data=(x, y), epochs=4, callbacks=[adjuster], verbose=0)
    assert len(tuner.oracle.trials) == 2


def test_unknown_meta_model():
    with pytest.raises(ValueError, match=r"must be \"default\" or the path of an existing \.keras file\. "
                                         r"Received: meta_model='nope'"):
        MetaAdjuster("nope")


def test_meta_model_file_without_feature_spec(tmp_path):
    path = tmp_path / "plain.keras"
    keras.Sequential([keras.Input((8, 12)), keras.layers.Flatten(), keras.layers.Dense(7)]).save(path)
    with pytest.raises(ValueError, match="has no feature spec"):
        MetaAdjuster(str(path))


def test_meta_model_file_with_another_feature_spec(tmp_path):
    path = tmp_path / "other.keras"
    inputs = keras.Input((8, 12))
    outputs = keras.layers.Dense(7)(keras.layers.Flatten()(MetaSpec(spec={"format": 0})(inputs)))
    keras.Model(inputs, outputs).save(path)
    with pytest.raises(ValueError, match="was trained on different features or actions"):
        MetaAdjuster(str(path))


def test_optimizer_that_cannot_change_live_fails_at_fit_start():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9)
    model = linear_model(keras.optimizers.SGD(schedule))
    before = model.get_weights()[0].copy()
    with pytest.raises(ValueError, match="MetaAdjuster cannot change anything on optimizer SGD"):
        fit(model, MetaAdjuster(constant_meta_model(2), monitor="loss", verbose=0))
    np.testing.assert_array_equal(model.get_weights()[0], before)


def test_missing_monitor_names_the_logs():
    with pytest.raises(ValueError, match=r"monitors `val_loss`, which is not in the epoch logs \(\['loss'\]\)"):
        fit(linear_model(kadapt.optimizers.SGD(0.01)), MetaAdjuster(constant_meta_model(2), verbose=0))


def test_the_default_meta_model_ships_with_the_current_spec():
    adjuster = MetaAdjuster()  # "default": kadapt/meta/model/pretrained/default.keras, loaded in safe mode
    assert adjuster.meta_model.output_shape == (None, len(ACTIONS))


def test_the_default_trigger_also_consults_on_schedule():
    adjuster = MetaAdjuster(constant_meta_model(2), monitor="loss", verbose=0)
    fit(linear_model(kadapt.optimizers.SGD(0.01)), adjuster, epochs=1)
    assert adjuster.trigger.consult_every == 3
    given = Trigger(patience=4)
    adjuster = MetaAdjuster(constant_meta_model(2), monitor="loss", trigger=given, verbose=0)
    fit(linear_model(kadapt.optimizers.SGD(0.01)), adjuster, epochs=1)
    assert adjuster.trigger.consult_every is None and adjuster.trigger.patience == 4


def test_repeated_cuts_stop_at_max_change():
    from kadapt.meta.model import actions

    live, stock = kadapt.optimizers.SGD(0.5), keras.optimizers.SGD(0.01)
    for _ in range(6):
        actions.apply(live, {"learning_rate_multiplier": 0.1})
        actions.apply(stock, {"learning_rate_multiplier": 0.1}, initial_learning_rate=0.01)
    assert float(live.learning_rate_multiplier.numpy()) == pytest.approx(1e-4)
    assert float(stock.learning_rate.numpy()) == pytest.approx(1e-6)


def test_decisions_reach_a_tensorboard_callback_placed_after_it(tmp_path):
    import tensorflow as tf

    model = linear_model(kadapt.optimizers.SGD(0.01))
    adjuster = MetaAdjuster(constant_meta_model(LR_UP), monitor="loss", trigger=fires_once_at_step_3(), verbose=0)
    x, y = regression_data()
    model.fit(x, y, batch_size=ROWS, epochs=4, shuffle=False, verbose=0,
              callbacks=[adjuster, keras.callbacks.TensorBoard(tmp_path)])
    tags = set()
    for path in (tmp_path / "train").glob("events.out.tfevents.*"):
        for raw in tf.data.TFRecordDataset(str(path)):
            tags |= {value.tag for value in tf.compat.v1.Event.FromString(raw.numpy()).summary.value}
    assert {"epoch_meta_learning_rate", "epoch_meta_adjustments"} <= tags


@pytest.mark.parametrize("stock", [False, True])
def test_a_move_to_the_suggestion_makes_the_optimizer_apply_it_now(stock):
    from kadapt.meta.model import actions

    schedule = keras.optimizers.schedules.CosineDecay(0.5, decay_steps=100)
    optimizer = keras.optimizers.SGD(0.004) if stock else kadapt.optimizers.SGD(schedule)
    optimizer.iterations.assign(30)
    live_multiplier = 1.0 if stock else 0.01
    if not stock:
        optimizer.learning_rate_multiplier = live_multiplier
    actions.apply(optimizer, {"learning_rate_to_suggestion": 3.0}, suggestion=0.02)
    # The oracle: cosine decay at step 30 in closed form, times the multiplier the move set.
    scheduled = 0.5 * 0.5 * (1 + np.cos(np.pi * 30 / 100))
    applied = (float(optimizer.learning_rate.numpy()) if stock
               else scheduled * float(optimizer.learning_rate_multiplier.numpy()))
    assert applied == pytest.approx(0.06, rel=1e-5)
    with pytest.raises(ValueError, match="needs a range test's suggestion"):
        actions.apply(optimizer, {"learning_rate_to_suggestion": 1.0}, suggestion=None)
