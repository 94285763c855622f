"""The MetaAdjuster's range-test start, proven by the weights against a run started at the found rate,
and the judge of its suggestion: its rule on numbers, its branches by the state they leave."""

import math

import keras
import numpy as np
import pytest
from helpers import constant_meta_model

import kadapt
from kadapt.batching.training_state import state_variables
from kadapt.cli.meta_evaluation import StopAfterSteps
from kadapt.meta import MetaAdjuster
from kadapt.meta import RangeTestStart
from kadapt.meta import Trigger
from kadapt.meta.model.actions import KEEP
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.start.branch_trials import branch_scores
from kadapt.meta.start.start_judge import StartJudge
from kadapt.range_test import curve
from kadapt.range_test import find

pytestmark = pytest.mark.backends("tensorflow", "jax")

ROWS, BATCH, EPOCHS, TEST_STEPS = 64, 8, 10, 16  # 80 steps; the test's 16 leave 8 whole epochs


def data(learnable=True):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]])).astype("float32")
    return (x, y) if learnable else (np.zeros_like(x), np.ones_like(y))


def linear_model(learning_rate):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer=keras.initializers.Constant(0.2))])
    model.compile(optimizer=kadapt.optimizers.SGD(learning_rate, momentum=0.5), loss="mse")
    return model


def silent_adjuster(x, y, judge="always", **options):
    """Acts only on the range test: its trigger never fires."""
    start = RangeTestStart(x, y, batch_size=BATCH, max_steps=TEST_STEPS, seed=0, judge=judge, **options)
    return MetaAdjuster(constant_meta_model(KEEP), monitor="loss", verbose=0, range_test=start, rescue=False,
                        trigger=Trigger(patience=10**9, cooldown=0, explode_factor=1e300))


def test_a_mis_set_rate_moves_to_the_suggestion_and_trains_as_if_started_there():
    x, y = data()
    model, adjuster = linear_model(1e-5), silent_adjuster(x, y)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    suggestion = decision["range_test"]["suggestion"]
    assert decision["trigger"] == "range_test" and decision["range_test"]["steps_run"] == TEST_STEPS
    assert adjuster.get_state()["range_test_steps"] == TEST_STEPS  # a resume counts them, and does not test again
    assert adjuster.get_state()["range_test_rate"] == suggestion  # and the meta-model keeps seeing it
    gap = adjuster.history.window()[-1, FEATURE_NAMES.index("range_test_gap")]
    assert adjuster.history.window()[-1, FEATURE_NAMES.index("range_test_known")] == 1.0
    assert gap == pytest.approx(0.0, abs=1e-6)  # the live rate was moved onto the suggestion
    assert decision["action"] == f"range test: lr x{suggestion / 1e-5:.3g}"
    # The test's steps were charged: fit trained the rest of the 80 steps, the weights restored before.
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * ROWS // BATCH - TEST_STEPS
    reference = linear_model(suggestion)
    reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS - TEST_STEPS * BATCH // ROWS, shuffle=False, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0], reference.get_weights()[0], rtol=1e-5)


def test_a_curve_that_never_falls_keeps_the_rate_and_says_why():
    x, y = data(learnable=False)  # zero inputs, one target: the loss is 1 at every rate
    model, adjuster = linear_model(0.01), silent_adjuster(x, y)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    assert decision["action"] == "keep" and "never fell" in decision["range_test"]["why"]
    assert float(model.optimizer.learning_rate_multiplier.numpy()) == 1.0
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * ROWS // BATCH - TEST_STEPS


def test_a_rate_near_the_suggestion_is_kept():
    start = RangeTestStart(np.zeros((4, 1)), np.zeros((4, 1)), factor=3.0)
    assert start.choose(1e-5, 0.01) == 0.01 and start.choose(0.1, 0.01) == 0.01
    assert start.choose(0.02, 0.01) is None and start.choose(0.004, 0.01) is None


def test_the_test_takes_at_most_half_the_budget():
    start = RangeTestStart(np.zeros((4, 1)), np.zeros((4, 1)), judge="always")
    steps = [start.num_steps(budget) for budget in (80, 1000, None, 19, 20)]
    assert steps == [40, 100, 100, None, find.MIN_STEPS]


def test_judged_the_test_takes_30_percent_and_the_branches_20():
    start = RangeTestStart(np.zeros((4, 1)), np.zeros((4, 1)))
    assert [start.num_steps(budget) for budget in (80, 1000, None, 33, 34)] == [24, 100, 100, None, 10]
    judge = start.judge
    assert [judge.steps_per_branch(budget, 4) for budget in (80, 720, None, 19)] == [4, 10, 10, 0]


def test_short_sweeps_smooth_over_half_their_length():
    assert [curve.sweep_smoothing(n) for n in (4, 10, 40, 100, 400)] == pytest.approx([0.5, 0.8, 0.95, 0.98, 0.98])


@pytest.mark.parametrize("num_steps", [40, 100])
def test_smoothing_a_linear_curve_matches_its_closed_form(num_steps):
    # The debiased average of l_t = t: t - (1-b) / (1-b^(t+1)) * sum_j j b^j, the sum in closed form.
    beta, t = curve.sweep_smoothing(num_steps), np.arange(num_steps, dtype=float)
    weighted = beta * (1 - (t + 1) * beta**t + t * beta ** (t + 1)) / (1 - beta) ** 2
    expected = t - (1 - beta) / (1 - beta ** (t + 1)) * weighted
    smoothed = curve.smooth(t, beta)
    np.testing.assert_allclose(smoothed, expected, rtol=1e-12, atol=1e-12)
    # The lag at the sweep's end is the same share of the sweep whatever its length; 0.98 at 40
    # steps lags further behind.
    assert (t[-1] - smoothed[-1]) / num_steps == pytest.approx(0.32, abs=0.03)
    assert t[-1] - curve.smooth(np.arange(40.0), 0.98)[-1] > 0.4 * 40


def test_the_candidates_are_the_live_rate_the_suggestion_and_between():
    judge = StartJudge()
    assert judge.candidates(1e-4, 0.01) == pytest.approx((1e-4, 0.01, 1e-3))
    # Between 0.1 and 0.04 is 0.063, within 2x of 0.1: dropped.
    assert judge.candidates(0.1, 0.04) == pytest.approx((0.1, 0.04))
    assert judge.candidates(0.1, 0.1) == pytest.approx((0.1,))
    assert judge.candidates(math.nan, 0.01) == pytest.approx((0.01,))  # no usable live rate


@pytest.mark.parametrize("scores, chosen", [
    ({0.1: 0.9, 0.01: 0.85, 1.0: 0.81}, None),  # gains 0.1 / 0.15 / 0.19: not twice the live rate's
    ({0.1: 0.9, 0.01: 0.85, 1.0: 0.79}, 1.0),  # 0.21 > 2 x 0.1: move
    ({0.1: 0.5, 0.01: 0.9, 1.0: 0.7}, None),  # the live rate gains most
    ({0.1: 0.999, 0.01: 0.99, 1.0: 1.2}, 0.01),  # a rate too low to move the loss: a small gain is 10x its
    ({0.1: 3.0, 0.01: 1.5, 1.0: 1.2}, None),  # every candidate loses: keep
    ({0.1: 3.0, 0.01: 0.9, 1.0: 1.2}, 0.01),  # the live rate loses, one gains: move
    ({0.1: 4.9e21, 0.01: 0.99, 1.0: 1.2}, 0.01),  # an exploding loss: 0.01 does not vanish beside it
    ({0.1: math.inf, 0.01: 1.1, 1.0: math.nan}, 0.01),  # a diverging live rate gives way to any finite one
    ({0.1: math.nan, 0.01: math.inf}, None),  # every branch diverged: keep (the rollback handles it)
])
def test_the_judge_keeps_the_live_rate_unless_a_candidate_gains_clearly_more(scores, chosen):
    assert StartJudge(margin=1.0).choose(0.1, 1.0, scores) == chosen


@pytest.mark.parametrize("scores, chosen", [
    ({0.1: 1.2, 0.01: 0.9, 1.0: 1.1}, None),  # the live rate rose 0.2, not blew up (< 2x); 0.01 gains only 0.1
    ({0.1: 1.2, 0.01: 0.7, 1.0: 1.1}, 0.01),  # 0.01 gains 0.3, more than the live rate lost
    ({0.1: 2.1, 0.01: 0.9, 1.0: 1.1}, 0.01),  # the live rate blew up (> 2x): any gain moves
    ({0.1: 0.9, 0.01: 0.85, 1.0: 1.1}, None),  # the live rate gained: the rule without blowup (0.15 < 2 x 0.1)
])
def test_with_blowup_a_live_rate_that_rose_a_little_yields_only_to_a_larger_gain(scores, chosen):
    assert StartJudge(margin=1.0, blowup=2.0).choose(0.1, 1.0, scores) == chosen
    assert StartJudge(margin=1.0).choose(0.1, 1.0, {0.1: 1.2, 0.01: 0.9}) == 0.01  # without: any gain moves


@pytest.mark.parametrize("scores, refuted", [
    ({0.1: 0.5, 0.01: 0.9}, True),  # the live rate gains 0.5, the suggestion 0.1: more than 2x
    ({0.1: 0.85, 0.01: 0.9}, False),  # 0.15 against 0.1: not 2x
    ({0.1: 1.1, 0.01: 0.9}, False),  # the live rate lost: it refutes nothing
    ({0.1: 0.9, 0.01: math.inf}, True),  # the suggestion diverged, the live rate gained
    ({0.1: 0.9, 0.01: 1.2}, True),  # the suggestion lost, the live rate gained
    ({0.1: 0.9}, False),  # the suggestion was not branched
])
def test_a_kept_live_rate_refutes_the_suggestion_only_when_its_gain_is_clearly_larger(scores, refuted):
    assert StartJudge(margin=1.0, refute=True).refutes(0.1, 1.0, scores, 0.01) is refuted
    assert StartJudge().refutes(0.1, 1.0, scores, 0.01) is False  # off by default


def test_a_lower_blowup_treats_a_smaller_rise_as_divergence():
    assert StartJudge(blowup=1.1).choose(0.1, 1.0, {0.1: 1.2, 0.01: 0.9}) == 0.01
    assert StartJudge(blowup=2.0).choose(0.1, 1.0, {0.1: 1.2, 0.01: 0.9}) is None


def test_without_a_live_rate_the_best_candidate_is_chosen():
    assert StartJudge().choose(math.nan, 1.0, {0.01: 0.9, 0.1: 0.8}) == 0.1


def test_branches_leave_the_state_bit_identical_and_score_on_held_batches():
    x, y = data()
    model = linear_model(0.01)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # slots and iterations not zero
    before = [np.array(v.numpy()) for v in state_variables(model)]
    train, held = [(x[:8], y[:8]), (x[8:16], y[8:16])], [(x[48:56], y[48:56]), (x[56:], y[56:])]

    def set_rate(rate):
        model.optimizer.learning_rate = rate

    trials = branch_scores(model, [0.01, 0.1], set_rate, train, held)
    for variable, value in zip(state_variables(model), before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)
    # The score at 0.1 is the held loss of the same state trained two steps at 0.1, by hand.
    weights, velocity = model.get_weights()[0], model.optimizer.variables[-1].numpy()  # SGD's one slot

    def held_loss(w):
        return np.mean([np.mean((hx @ w - hy) ** 2) for hx, hy in held])

    assert trials.start == pytest.approx(held_loss(weights), rel=1e-5)
    for batch_x, batch_y in train:
        gradient = 2 * batch_x.T @ (batch_x @ weights - batch_y) / len(batch_x)
        velocity = 0.5 * velocity - 0.1 * gradient
        weights = weights + velocity
    assert trials.scores[0.1] == pytest.approx(held_loss(weights), rel=1e-5)
    assert math.isinf(branch_scores(model, [1e6], set_rate, train * 20, held).scores[1e6])  # diverged


def test_branch_ends_kept_are_the_first_rate_and_the_best_scoring_other():
    x, y = data()
    model = linear_model(0.01)
    train, held = [(x[:8], y[:8]), (x[8:16], y[8:16])], [(x[48:56], y[48:56])]

    def set_rate(rate):
        model.optimizer.learning_rate = rate

    trials = branch_scores(model, [1e-4, 0.1, 0.01, 1e6], set_rate, train * 10, held, keep_ends=True)
    best_other = min((0.1, 0.01), key=trials.scores.get)
    assert set(trials.ends) == {1e-4, best_other} and math.isinf(trials.scores[1e6])
    metrics = {id(v) for v in model.metrics_variables}
    assert not any(id(variable) in metrics for variable, _ in trials.ends[best_other])
    assert branch_scores(model, [1e-4, 0.1], set_rate, train, held).ends == {}  # kept only when asked


def test_arrays_hold_rows_out_of_the_branches_training():
    x = np.arange(64, dtype="float32").reshape(64, 1)
    start = RangeTestStart(x, x, batch_size=BATCH, seed=0)
    train, held = start.branch_batches(12, 4)
    held_rows = np.concatenate([hx for hx, _ in held]).ravel()
    train_rows = np.concatenate([tx for tx, _ in train]).ravel()
    assert len(held_rows) == 16 and len(train) == 12  # a quarter of the rows at most
    assert not set(held_rows) & set(train_rows) and len(set(train_rows)) == 48


def plain_fit_reference(learning_rate, x, y, branch_steps, fit_steps):
    """A fresh model at `learning_rate` that trained the branches' batches, then fit's first
    `fit_steps` batches, in plain `fit` steps: the oracle of a continued branch."""
    train, _ = RangeTestStart(x, y, batch_size=BATCH, seed=0).branch_batches(branch_steps, StartJudge().held_batches)
    reference = linear_model(learning_rate)
    reference.fit(np.concatenate([bx for bx, _ in train]), np.concatenate([by for _, by in train]),
                  batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    history = reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                            callbacks=[StopAfterSteps(fit_steps)])
    return reference, history


def test_a_judged_start_moves_a_diverging_rate_and_goes_on_from_its_best_branch():
    x, y = data()
    model, adjuster = linear_model(2.0), silent_adjuster(x, y, judge="branches")
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    detail = decision["range_test"]
    scores = {b["learning_rate"]: b["held_loss"] for b in detail["branches"]}
    assert len(scores) == 3 and detail["branch_steps"] == 5  # 20% of 80 steps over 3 candidates
    live = detail["learning_rate"]
    assert scores[live] > 100 * detail["held_loss"]  # exploding
    chosen = StartJudge().choose(live, detail["held_loss"], scores)
    assert chosen is not None and decision["action"] == f"range test: lr x{chosen / live:.3g}"
    assert detail["continued_from"] == chosen
    # The test's 16 steps and the two other branches' 10 were charged; the chosen branch's 5 are
    # the run's: fit trained the rest, 80 - 31, on from the branch's end.
    charged = TEST_STEPS + 10
    assert adjuster.get_state()["range_test_steps"] == charged
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * ROWS // BATCH - charged
    reference, reference_history = plain_fit_reference(chosen, x, y, 5, EPOCHS * ROWS // BATCH - charged - 5)
    np.testing.assert_allclose(model.get_weights()[0], reference.get_weights()[0], rtol=1e-5)
    np.testing.assert_allclose(model.optimizer.variables[-1].numpy(), reference.optimizer.variables[-1].numpy(),
                               rtol=1e-5, atol=1e-7)  # the momentum too
    # fit's metrics count fit's own steps: its first epoch's loss is the reference's
    assert history.history["loss"][0] == pytest.approx(reference_history.history["loss"][0], rel=1e-5)


@pytest.mark.parametrize("continue_branch", [True, False])
def test_a_judged_start_keeps_a_well_set_rate_and_goes_on_from_its_branch(continue_branch):
    x, y = data()
    model = linear_model(0.1)
    start_judge = StartJudge(refute=True)
    adjuster = silent_adjuster(x, y, judge=start_judge, continue_branch=continue_branch)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    assert decision["action"] == "keep" and "more than 2x the live rate's" in decision["range_test"]["why"]
    assert float(model.optimizer.learning_rate_multiplier.numpy()) == 1.0
    detail, charged = decision["range_test"], adjuster.get_state()["range_test_steps"]
    steps, candidates = detail["branch_steps"], len(detail["branches"])
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * ROWS // BATCH - charged
    if not continue_branch:  # the branches undone, all their steps charged: as if never branched
        assert charged == TEST_STEPS + steps * candidates and "continued_from" not in detail
        reference = linear_model(0.1)
        reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                      callbacks=[StopAfterSteps(EPOCHS * ROWS // BATCH - charged)])
        np.testing.assert_array_equal(model.get_weights()[0], reference.get_weights()[0])
        return
    # Where the live rate's branch refuted the reading, the meta-model sees the live rate as the test's.
    scores = {b["learning_rate"]: b["held_loss"] for b in detail["branches"]}
    refuted = start_judge.refutes(detail["learning_rate"], detail["held_loss"], scores, detail["suggestion"])
    assert detail.get("suggestion_refuted", False) is refuted
    seen = detail["learning_rate"] if refuted else detail["suggestion"]
    assert adjuster.get_state()["range_test_rate"] == pytest.approx(seen)
    # The live branch's steps are the run's: only the test's and the other branches' are charged.
    assert charged == TEST_STEPS + steps * (candidates - 1) and detail["continued_from"] == pytest.approx(0.1)
    reference, reference_history = plain_fit_reference(0.1, x, y, steps, EPOCHS * ROWS // BATCH - charged - steps)
    np.testing.assert_allclose(model.get_weights()[0], reference.get_weights()[0], rtol=1e-5)
    np.testing.assert_allclose(model.optimizer.variables[-1].numpy(), reference.optimizer.variables[-1].numpy(),
                               rtol=1e-5, atol=1e-7)
    assert history.history["loss"][0] == pytest.approx(reference_history.history["loss"][0], rel=1e-5)


def test_a_judged_start_near_the_suggestion_runs_no_branch():
    x, y = data()
    start = RangeTestStart(x, y, batch_size=BATCH, max_steps=TEST_STEPS, seed=0)
    suggestion = start.run(linear_model(0.1), TEST_STEPS).suggestion  # the fit's test reads the same
    model, adjuster = linear_model(1.5 * suggestion), silent_adjuster(x, y, judge="branches")
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    assert decision["action"] == "keep" and decision["range_test"]["why"] == "within 2x of the suggestion"
    assert "branches" not in decision["range_test"] and adjuster.get_state()["range_test_steps"] == TEST_STEPS


def test_bad_arguments():
    with pytest.raises(ValueError, match="Argument `factor` must be"):
        RangeTestStart(np.zeros((4, 1)), factor=1.0)
    with pytest.raises(ValueError, match="Argument `rule` must be one of"):
        RangeTestStart(np.zeros((4, 1)), rule="lowest")
    with pytest.raises(ValueError, match="Argument `judge` must be one of"):
        RangeTestStart(np.zeros((4, 1)), judge="never")
    with pytest.raises(TypeError, match="Argument `continue_branch` must be True or False"):
        RangeTestStart(np.zeros((4, 1)), continue_branch="yes")
    with pytest.raises(ValueError, match="Argument `margin` must be"):
        StartJudge(margin=-0.1)
    with pytest.raises(ValueError, match="Argument `blowup` must be"):
        StartJudge(blowup=1.0)
    with pytest.raises(TypeError, match="Argument `refute` must be True or False"):
        StartJudge(refute="no")
    with pytest.raises(TypeError, match="Argument `range_test` must be a kadapt.meta.RangeTestStart"):
        MetaAdjuster(constant_meta_model(KEEP), range_test=True)


class _InterruptAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 3:
            raise KeyboardInterrupt


def _fit_with_backup(directory, interrupt=False):
    from kadapt.run.backup import InterruptSafeBackup

    x, y = data()
    model = linear_model(0.1)
    backup = InterruptSafeBackup(backup_dir=str(directory / "backup"))
    adjuster = silent_adjuster(x, y, judge="branches")
    adjuster.backup_dir = directory / "backup"
    middle = [_InterruptAtEpochEnd()] if interrupt else []
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[backup, adjuster, *middle, backup.committer])
    return model, adjuster


def test_a_run_resumed_after_a_continued_start_ends_as_the_uninterrupted_one(tmp_path):
    whole, whole_adjuster = _fit_with_backup(tmp_path / "whole")
    assert "continued_from" in whole_adjuster.decisions[0]["range_test"]
    with pytest.raises(KeyboardInterrupt):
        _fit_with_backup(tmp_path / "resumed", interrupt=True)
    resumed, adjuster = _fit_with_backup(tmp_path / "resumed")  # no second test: the count is in the state
    assert adjuster.decisions == whole_adjuster.decisions
    assert int(resumed.optimizer.iterations.numpy()) == int(whole.optimizer.iterations.numpy())
    np.testing.assert_allclose(resumed.get_weights()[0], whole.get_weights()[0], rtol=1e-6)
