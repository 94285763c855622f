"""`AdjustmentPolicy`: the adjuster's decision on hand-made windows with a stub predictor."""

import math

import numpy as np
import pytest

from kadapt.meta import AdjustmentPolicy
from kadapt.meta.live.policy import PolicyState
from kadapt.meta.model.actions import ACTIONS
from kadapt.meta.model.actions import KEEP

LR_DOWN_10, LR_DOWN_3, LR_UP_3, LR_UP_10, MOMENTUM_HIGH = 0, 1, 3, 4, 6
WINDOW = np.zeros((8, 15), "float32")


def predicting(best, gain=0.5):
    """A predictor: `best` ends `gain` below keeping, everything else 1.0 above it."""
    differences = np.ones(len(ACTIONS))
    differences[KEEP] = 0.0
    differences[best] = -gain
    return lambda window: differences


def never_called(window):
    raise AssertionError("the predictor must not be consulted here")


def test_a_plateau_applies_the_predicted_best_action():
    adjustment, state = AdjustmentPolicy(predicting(LR_UP_3)).decide(PolicyState(), WINDOW, "plateau", 0.1)
    assert (adjustment.action, adjustment.gain, adjustment.text) == (LR_UP_3, 0.5, "lr x3")
    assert adjustment.consulted and adjustment.restart_trigger and not adjustment.rollback
    assert state == PolicyState(rate_changed=True, raised=True)


def test_a_gain_below_min_gain_keeps_and_says_what_it_considered():
    policy = AdjustmentPolicy(predicting(LR_UP_3, gain=0.04), min_gain=0.1)
    adjustment, _ = policy.decide(PolicyState(), WINDOW, "slow_progress", 0.1)
    assert (adjustment.action, adjustment.considered) == (KEEP, LR_UP_3)
    assert adjustment.abstained and adjustment.logged and adjustment.text == "keep (considered lr x3)"


def test_a_cut_needs_only_min_cut_gain_and_never_more_than_min_gain():
    cut, _ = AdjustmentPolicy(predicting(LR_DOWN_3, gain=0.05)).decide(PolicyState(), WINDOW, "plateau", 0.1)
    assert cut.action == LR_DOWN_3  # the defaults: 0.05 clears a cut's 0.03, not a raise's 0.1
    raise_, _ = AdjustmentPolicy(predicting(LR_UP_3, gain=0.05)).decide(PolicyState(), WINDOW, "plateau", 0.1)
    assert (raise_.action, raise_.considered) == (KEEP, LR_UP_3)
    strict = AdjustmentPolicy(predicting(LR_DOWN_3, gain=0.05), min_cut_gain=0.08)
    assert strict.decide(PolicyState(), WINDOW, "plateau", 0.1)[0].action == KEEP
    loose = AdjustmentPolicy(predicting(LR_UP_3, gain=0.02), min_gain=0.01)  # a cut's bar follows it down
    assert loose.min_cut_gain == 0.01 and loose.decide(PolicyState(), WINDOW, "plateau", 0.1)[0].action == LR_UP_3


def test_a_divergence_rolls_back_and_allows_only_cuts_whatever_the_predictor_prefers():
    differences = np.array([0.3, 0.2, 0.0, -0.5, -0.6, -0.4, -0.4, -0.7, -0.7])  # every cut predicted worse than keeping
    adjustment, state = AdjustmentPolicy(lambda window: differences).decide(PolicyState(), WINDOW, "divergence", 0.4)
    # Raises and momentum are masked out, and keep too: the better cut is applied whatever its gain.
    assert (adjustment.action, adjustment.gain, adjustment.text) == (LR_DOWN_3, -0.2, "lr x0.3")
    assert adjustment.rollback and not adjustment.restart_momentum
    assert state == PolicyState(ceiling=0.2, since_divergence=0, rate_changed=True)


def test_a_divergence_within_patience_of_the_last_takes_the_largest_cut_and_restarts_the_slots():
    policy = AdjustmentPolicy(predicting(LR_DOWN_3), patience=3)
    adjustment, state = policy.decide(PolicyState(0.2, since_divergence=3), WINDOW, "divergence", 0.1)
    assert (adjustment.action, adjustment.restart_momentum) == (LR_DOWN_10, True)
    assert state == PolicyState(ceiling=0.05, since_divergence=0, rate_changed=True)
    later, _ = policy.decide(PolicyState(0.2, since_divergence=4), WINDOW, "divergence", 0.1)
    assert (later.action, later.restart_momentum) == (LR_DOWN_3, False)


def test_calm_observations_are_counted_after_a_divergence_only():
    policy = AdjustmentPolicy(never_called)
    adjustment, state = policy.decide(PolicyState(0.2, since_divergence=1), WINDOW, None, 0.1)
    assert not adjustment.logged and state == PolicyState(0.2, since_divergence=2)
    assert policy.decide(PolicyState(), WINDOW, None, 0.1)[1] == PolicyState()


def test_raises_stay_below_the_ceiling():
    policy = AdjustmentPolicy(predicting(LR_UP_10))
    # x10 of 0.05 passes the ceiling 0.2, x3 (0.15) does not: the predictor's next best is keep's 0.
    blocked, _ = policy.decide(PolicyState(ceiling=0.2), WINDOW, "plateau", 0.05)
    assert blocked.action == KEEP and not blocked.abstained
    allowed, _ = policy.decide(PolicyState(ceiling=0.2), WINDOW, "plateau", 0.01)
    assert allowed.action == LR_UP_10


def test_the_optimizers_allowed_mask_holds():
    allowed = np.ones(len(ACTIONS), bool)
    allowed[MOMENTUM_HIGH] = False
    adjustment, _ = AdjustmentPolicy(predicting(MOMENTUM_HIGH), allowed).decide(PolicyState(), WINDOW, "plateau", 0.1)
    assert adjustment.action == KEEP


@pytest.mark.parametrize("reason", ["plateau", "slow_progress", "oscillation", "scheduled"])
def test_a_slowdown_while_the_schedule_anneals_is_left_to_it(reason):
    adjustment, state = AdjustmentPolicy(never_called).decide(PolicyState(), WINDOW, reason, 0.1, annealing=True)
    assert adjustment.restart_trigger and not adjustment.consulted and not adjustment.logged
    assert state == PolicyState()


def test_the_last_observation_adjusts_nothing_but_still_rolls_back():
    policy = AdjustmentPolicy(never_called)
    diverged, state = policy.decide(PolicyState(), WINDOW, "divergence", 0.1, annealing=True, final=True)
    assert diverged.rollback and diverged.logged and diverged.text == "rollback (training ends)"
    assert diverged.action == KEEP and state == PolicyState()
    plateau, _ = policy.decide(PolicyState(), WINDOW, "plateau", 0.1, final=True)
    assert not (plateau.logged or plateau.restart_trigger)


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="Argument `predict` must be a callable"):
        AdjustmentPolicy("default")
    with pytest.raises(ValueError, match=r"Argument `allowed` must be a bool array of shape \(9,\)"):
        AdjustmentPolicy(never_called, allowed=np.ones(3, bool))
    with pytest.raises(ValueError, match="min_gain"):
        AdjustmentPolicy(never_called, min_gain=-1.0)
    with pytest.raises(ValueError, match="min_cut_gain"):
        AdjustmentPolicy(never_called, min_cut_gain=-0.01)
    with pytest.raises(ValueError, match=r"Argument `restart_within` .*Received: restart_within=1.5"):
        AdjustmentPolicy(never_called, restart_within=1.5)
    with pytest.raises(ValueError, match=r"Argument `restart_above` .*Received: restart_above=0"):
        AdjustmentPolicy(never_called, restart_above=0)
    with pytest.raises(ValueError, match=r"Argument `follow_gain` .*Received: follow_gain=-0.1"):
        AdjustmentPolicy(never_called, follow_gain=-0.1)
    assert math.isinf(PolicyState().ceiling)


TO_SUGGESTION, TO_THREE_SUGGESTIONS = 7, 8


def test_a_move_to_the_suggestion_needs_one_and_sets_the_rate_whatever_the_distance():
    assert ACTIONS[TO_SUGGESTION] == {"learning_rate_to_suggestion": 1.0}
    policy = AdjustmentPolicy(predicting(TO_THREE_SUGGESTIONS))
    without, _ = policy.decide(PolicyState(), WINDOW, "plateau", 1e-4)
    assert without.action == KEEP  # no range test: the move is not on the menu
    moved, _ = policy.decide(PolicyState(), WINDOW, "plateau", 1e-4, suggestion=0.02)
    assert moved.action == TO_THREE_SUGGESTIONS and moved.text == "lr to the range test's suggestion x3"
    # Under the ceiling a divergence left (half the rate that diverged), a move above it is blocked ...
    capped, _ = policy.decide(PolicyState(ceiling=0.05), WINDOW, "plateau", 1e-3, suggestion=0.02)
    assert capped.action == KEEP
    # ... and after a divergence, a move to a suggestion below the live rate is a cut like any other.
    cut, _ = AdjustmentPolicy(predicting(TO_SUGGESTION)).decide(PolicyState(), WINDOW, "divergence", 1.0,
                                                                suggestion=0.02)
    assert cut.rollback and cut.action == TO_SUGGESTION
    up, _ = AdjustmentPolicy(predicting(TO_SUGGESTION)).decide(PolicyState(), WINDOW, "divergence", 0.01,
                                                               suggestion=0.02)
    assert up.action != TO_SUGGESTION


def test_a_move_to_where_the_rate_already_is_is_not_on_the_menu():
    policy = AdjustmentPolicy(predicting(TO_SUGGESTION))
    same, _ = policy.decide(PolicyState(), WINDOW, "plateau", 0.015, suggestion=0.02)  # 1.33x: keep in all but name
    assert same.action == KEEP
    far, _ = policy.decide(PolicyState(), WINDOW, "plateau", 0.01, suggestion=0.02)
    assert far.action == TO_SUGGESTION


def test_a_momentum_action_that_sets_the_momentum_applied_now_is_not_on_the_menu():
    at_high = WINDOW.copy()
    at_high[:, 6] = 0.95  # the window's momentum column (float32, as a reading gives it)
    differences = np.ones(len(ACTIONS))
    differences[KEEP], differences[MOMENTUM_HIGH], differences[LR_UP_3] = 0.0, -0.4, -0.2
    policy = AdjustmentPolicy(lambda window: differences)
    adjustment, _ = policy.decide(PolicyState(), at_high, "slow_progress", 1e-3)
    assert adjustment.action == LR_UP_3  # the next best: "momentum 0.95" would change nothing
    at_low, _ = policy.decide(PolicyState(), WINDOW + np.float32(0.9) * (np.arange(15) == 6), "slow_progress", 1e-3)
    assert at_low.action == MOMENTUM_HIGH


def at_budget(used):
    window = WINDOW.copy()
    window[:, 9] = used  # the budget_used column
    return window


def test_a_first_early_cut_of_a_run_that_kept_most_of_its_starting_loss_starts_again():
    policy = AdjustmentPolicy(predicting(LR_DOWN_10))
    restart, state = policy.decide(PolicyState(), at_budget(0.15), "plateau", 0.5, loss_ratio=0.9)
    assert restart.restart and not restart.rollback and restart.action == LR_DOWN_10
    assert restart.text == "lr x0.1, from the start" and state.rate_changed
    assert policy.decide(PolicyState(), at_budget(0.29), "plateau", 0.5, loss_ratio=0.75)[0].restart  # 0.75 counts


@pytest.mark.parametrize("case", ["learned", "late", "second change", "raise", "divergence", "scheduled",
                                  "unknown", "off"])
def test_no_restart_where_the_run_learned_or_it_is_late_or_not_the_first_change_or_not_a_cut(case):
    state, window, reason, ratio, best, policy_args = PolicyState(), at_budget(0.15), "plateau", 0.9, LR_DOWN_10, {}
    if case == "learned":
        ratio = 0.74
    elif case == "late":
        window = at_budget(0.31)
    elif case == "second change":  # a raise came first: the rate was not too high from the start
        state = PolicyState(rate_changed=True)
    elif case == "raise":
        best = LR_UP_3
    elif case == "divergence":  # a divergence rolls back to the last good state, as before
        reason = "divergence"
    elif case == "scheduled":  # a consultation on schedule: the run has not stalled
        reason = "scheduled"
    elif case == "unknown":
        ratio = None
    else:
        policy_args = {"restart_within": 0.0}
    adjustment, _ = AdjustmentPolicy(predicting(best), **policy_args).decide(state, window, reason, 0.5,
                                                                           loss_ratio=ratio)
    assert adjustment.consulted and adjustment.action == best and not adjustment.restart


@pytest.mark.parametrize("reason, ratio, restart, trial", [
    ("plateau", 0.74, False, True),  # learned a little: judged by a branch from the start
    ("plateau", 0.4, False, True),  # trial_above counts
    ("plateau", 0.39, False, False),  # learned much: a plain cut
    ("plateau", 0.75, True, False),  # kept most of the starting loss: restarted unjudged
    ("scheduled", 0.9, False, True),  # not a stall: judged, whatever the loss kept
    ("scheduled", 0.39, False, False),
])
def test_a_first_early_cut_of_a_run_that_learned_a_little_asks_for_a_judged_restart(reason, ratio, restart, trial):
    adjustment, state = AdjustmentPolicy(predicting(LR_DOWN_10)).decide(PolicyState(), at_budget(0.15), reason,
                                                                       0.5, loss_ratio=ratio)
    assert adjustment.action == LR_DOWN_10 and state.rate_changed
    assert (adjustment.restart, adjustment.restart_trial) == (restart, trial)


@pytest.mark.parametrize("case", ["late", "second change", "raise", "divergence", "unknown", "off", "bar"])
def test_no_judged_restart_where_no_restart_could_come(case):
    state, window, reason, ratio, best, policy_args = PolicyState(), at_budget(0.15), "plateau", 0.6, LR_DOWN_10, {}
    if case == "late":
        window = at_budget(0.31)
    elif case == "second change":
        state = PolicyState(rate_changed=True)
    elif case == "raise":
        best = LR_UP_3
    elif case == "divergence":
        reason = "divergence"
    elif case == "unknown":
        ratio = None
    elif case == "off":
        policy_args = {"restart_within": 0.0}
    else:
        policy_args = {"trial_above": 0.7}
    adjustment, _ = AdjustmentPolicy(predicting(best), **policy_args).decide(state, window, reason, 0.5,
                                                                           loss_ratio=ratio)
    assert adjustment.consulted and not adjustment.restart_trial and not adjustment.restart


def test_trial_above_must_be_positive():
    with pytest.raises(ValueError, match="trial_above"):
        AdjustmentPolicy(never_called, trial_above=0.0)


def test_after_a_raise_a_further_raise_needs_only_follow_gain():
    """A run whose last rate change was a raise has shown its rate too low: a further raise is
    applied at a predicted gain of `follow_gain` (0.005), not `min_gain` (0.1)."""
    small_raise = AdjustmentPolicy(predicting(LR_UP_3, gain=0.02))
    first, _ = small_raise.decide(PolicyState(), WINDOW, "scheduled", 0.01)
    assert (first.action, first.considered) == (KEEP, LR_UP_3)
    after_raise = PolicyState(rate_changed=True, raised=True)
    followed, state = small_raise.decide(after_raise, WINDOW, "scheduled", 0.01)
    assert followed.action == LR_UP_3 and state.raised
    tiny, _ = AdjustmentPolicy(predicting(LR_UP_3, gain=0.004)).decide(after_raise, WINDOW, "scheduled", 0.01)
    assert (tiny.action, tiny.considered) == (KEEP, LR_UP_3)
    # Momentum is not the rate: its bar stays min_gain.
    momentum, _ = AdjustmentPolicy(predicting(MOMENTUM_HIGH, gain=0.02)).decide(after_raise, WINDOW, "scheduled", 0.01)
    assert (momentum.action, momentum.considered) == (KEEP, MOMENTUM_HIGH)
    assert AdjustmentPolicy(never_called, min_gain=0.001).follow_gain == 0.001  # never above min_gain


def test_a_cut_or_a_divergence_ends_the_follow_through():
    _, after_cut = AdjustmentPolicy(predicting(LR_DOWN_3)).decide(
        PolicyState(rate_changed=True, raised=True), WINDOW, "plateau", 0.1)
    assert not after_cut.raised
    adjustment, _ = AdjustmentPolicy(predicting(LR_UP_3, gain=0.02)).decide(after_cut, WINDOW, "scheduled", 0.03)
    assert adjustment.action == KEEP
    _, after_divergence = AdjustmentPolicy(predicting(LR_DOWN_3)).decide(
        PolicyState(rate_changed=True, raised=True), WINDOW, "divergence", 0.1)
    assert not after_divergence.raised
    kept, state = AdjustmentPolicy(predicting(LR_UP_3, gain=-0.5)).decide(
        PolicyState(rate_changed=True, raised=True), WINDOW, "scheduled", 0.01)
    assert kept.action == KEEP and state.raised  # keeping leaves it as it was
