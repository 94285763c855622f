"""`DeadRunRule` and the constant predictor's loss, on simulated loss sequences (pure, no TensorFlow)."""

import math

import numpy as np
import pytest

from kadapt.meta.live.chance_loss import chance_loss
from kadapt.meta.live.chance_loss import regression_chance_loss
from kadapt.meta.live.dead_run import AT_CHANCE
from kadapt.meta.live.dead_run import DIVERGED
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.meta.live.dead_run import RunHealth

WINE_CHANCE = 1.089  # wine's training labels, label smoothing 0.1


def verdicts(rule, initial, epochs):
    """The triggers of `(loss, monitored)` epochs, in order."""
    state, triggers = rule.start(initial), []
    for loss, monitored in epochs:
        verdict = rule.judge(state, loss, monitored)
        state = verdict.state
        triggers.append(verdict.trigger)
    return triggers


def test_chance_loss_of_balanced_classes_is_ln_classes():
    assert chance_loss([0, 1, 2, 0, 1, 2], 3) == pytest.approx(math.log(3), abs=1e-12)


def test_chance_loss_is_the_entropy_of_the_smoothed_frequencies():
    smoothed = [0.9 * 0.75 + 0.05, 0.9 * 0.25 + 0.05]
    expected = -sum(q * math.log(q) for q in smoothed)
    assert chance_loss([0, 0, 0, 1], 2, label_smoothing=0.1) == pytest.approx(expected, abs=1e-12)


def test_chance_loss_counts_a_class_absent_from_the_labels_under_smoothing():
    assert chance_loss([0, 0], 2, label_smoothing=0.2) == pytest.approx(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)))


def test_regression_chance_loss_is_the_variance():
    assert regression_chance_loss([1.0, 2.0, 6.0]) == pytest.approx(14 / 3)


def test_regression_chance_loss_of_several_outputs_is_the_mean_of_their_variances():
    # Columns with different means: the best constant predicts each column's mean, so its mean
    # squared error over the 6 values is (var 1 + var 2 + var 3) / 3, not the variance of all 6.
    targets = np.array([[0.0, 10.0, -4.0], [2.0, 10.0, 4.0]])
    constant = targets.mean(axis=0)
    assert regression_chance_loss(targets) == pytest.approx(np.mean((targets - constant) ** 2))
    assert regression_chance_loss(targets) == pytest.approx((1.0 + 0.0 + 16.0) / 3)
    images = np.arange(24, dtype="float64").reshape(2, 3, 4)  # (N, height, width): per pixel
    assert regression_chance_loss(images) == pytest.approx(36.0)


def test_a_first_epoch_ten_times_up_is_diverged():
    rule = DeadRunRule(WINE_CHANCE)
    assert verdicts(rule, 1.2, [(6369.0, 1.0986)]) == [DIVERGED]


def test_a_non_finite_loss_is_diverged():
    rule = DeadRunRule(WINE_CHANCE)
    assert verdicts(rule, 1.2, [(math.nan, 1.0)]) == [DIVERGED]
    assert verdicts(rule, 1.2, [(0.9, math.inf)]) == [DIVERGED]


def test_a_monitored_loss_ten_times_the_lowest_is_diverged():
    rule = DeadRunRule(1.0)
    assert verdicts(rule, 1.0, [(0.9, 9.99)]) == [None]
    assert verdicts(rule, 1.0, [(0.9, 10.0)]) == [DIVERGED]


def test_a_first_loss_far_above_chance_that_falls_is_healthy():
    """Raw wine, Adam 1e-3: the first batch's loss 38.6, the validation loss 10 (9x chance), then falling."""
    rule = DeadRunRule(WINE_CHANCE)
    epochs = [(29.8, 10.06), (11.6, 8.42), (6.91, 3.35)]
    assert verdicts(rule, 38.6, epochs) == [None] * 3


def test_a_validation_loss_that_rises_above_chance_is_at_chance():
    rule = DeadRunRule(WINE_CHANCE)
    assert verdicts(rule, 38.6, [(29.8, 10.06), (11.6, 15.95)]) == [None, AT_CHANCE]


def test_two_flat_epochs_at_chance_are_at_chance():
    rule = DeadRunRule(WINE_CHANCE)
    assert verdicts(rule, 1.3, [(1.10, 1.095), (1.098, 1.094)]) == [None, AT_CHANCE]


def test_a_warmup_above_chance_that_falls_is_healthy():
    """Measured on wine, Adam 1e-3 on the triangular schedule: above chance after epoch 1, falling."""
    rule = DeadRunRule(WINE_CHANCE)
    epochs = [(1.255, 1.244), (1.146, 1.069), (0.986, 0.917), (0.85, 0.806)]
    assert verdicts(rule, 1.3, epochs) == [None] * 4


def test_a_run_that_learns_its_training_rows_is_not_dead_at_a_validation_loss_at_chance():
    """The public table `fair`, seed 4 (a regression that holds little signal): its epochs' training and
    validation losses, the constant predictor's 0.6348 on the validation rows, 1 on the standardized training ones."""
    epochs = [(1.0164, 0.6592), (0.9625, 0.6387), (0.9358, 0.6426)]
    assert verdicts(DeadRunRule(0.6348), 1.1, epochs) == [None, None, AT_CHANCE]  # the training rows' chance unknown
    assert verdicts(DeadRunRule(0.6348, training_chance_loss=1.0), 1.1, epochs) == [None, None, None]
    dead = [(1.0, 0.6592), (1.0, 0.6387), (1.0, 0.6426)]  # a constant output: the training mean on every row
    assert verdicts(DeadRunRule(0.6348, training_chance_loss=1.0), 1.1, dead) == [None, None, AT_CHANCE]


def test_a_loss_below_chance_is_healthy_however_flat():
    rule = DeadRunRule(WINE_CHANCE)
    assert verdicts(rule, 1.3, [(0.5, 0.4)] * 3) == [None] * 3


def test_a_rise_below_ten_times_is_healthy():
    rule = DeadRunRule(WINE_CHANCE)
    assert verdicts(rule, 1.0, [(0.5, 0.5), (4.9, 0.6)]) == [None, None]
    assert verdicts(rule, 1.0, [(0.5, 0.5), (5.0, 0.6)]) == [None, DIVERGED]


def test_a_validation_loss_far_above_a_training_loss_near_zero_is_not_diverged():
    """A small table learnt by heart: the training loss falls to 0.01 while the validation loss
    stays near 0.3; each is measured against its own lowest (both were once 30x apart)."""
    rule = DeadRunRule(WINE_CHANCE)
    assert verdicts(rule, 1.1, [(0.5, 0.4), (0.02, 0.35), (0.01, 0.3), (0.01, 3.6)]) == [None, None, None, DIVERGED]


def test_no_trigger_after_max_actions():
    rule = DeadRunRule(WINE_CHANCE, max_actions=1)
    state = rule.start(1.0)
    first = rule.judge(state, 100.0, 1.1)
    second = rule.judge(rule.restarted(first.state, 1.0), 100.0, 1.1)
    assert (first.trigger, second.trigger, second.state.actions) == (DIVERGED, None, 1)
    assert second.reason.endswith("no action left (max_actions=1)")


def test_restarted_forgets_the_epoch_at_chance_and_takes_the_restored_loss():
    rule = DeadRunRule(WINE_CHANCE)
    state = rule.restarted(RunHealth(lowest_loss=0.2, previous=1.1, actions=1, lowest_monitored=0.4),
                           restored_loss=1.3)
    assert state == RunHealth(lowest_loss=1.3, previous=None, actions=1, lowest_monitored=0.4)


def test_rule_arguments_are_checked():
    with pytest.raises(ValueError, match="Argument `chance_loss`"):
        DeadRunRule(0.0)
    with pytest.raises(ValueError, match="Argument `jump`"):
        DeadRunRule(1.0, jump=1.0)
    with pytest.raises(ValueError, match="Argument `tolerance`"):
        DeadRunRule(1.0, tolerance=1.0)
    with pytest.raises(ValueError, match="Argument `training_chance_loss`"):
        DeadRunRule(1.0, training_chance_loss=-1.0)


def test_the_constant_predictor_scored_on_other_rows_follows_the_closed_form():
    # q = (0.75, 0.25) from the training labels, scored on rows of frequencies (0.5, 0.5)
    assert chance_loss([0, 0, 0, 1], 2, scored=[0, 1]) == pytest.approx(-0.5 * np.log(0.75) - 0.5 * np.log(0.25))
    predicted, scored = 0.9 * np.array([0.75, 0.25]) + 0.05, 0.9 * np.array([0.0, 1.0]) + 0.05  # smoothing 0.1
    assert chance_loss([0, 0, 0, 1], 2, 0.1, scored=[1]) == pytest.approx(-(scored * np.log(predicted)).sum())
    # a heavy tail in the scored rows: the training mean 0, scored rows 0 and 4
    assert regression_chance_loss([-1.0, 1.0], scored=[0.0, 4.0]) == pytest.approx(8.0)
