"""The meta-model's features and triggers against hand-computed values."""

import math

import numpy as np
import pytest

from kadapt.meta.live.triggers import Trigger
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import WINDOW
from kadapt.meta.model.features import FeatureHistory
from kadapt.meta.model.features import Observation

COLUMN = {name: index for index, name in enumerate(FEATURE_NAMES)}


def observe(history, step, loss, weights, val_loss=None, learning_rate=0.1):
    history.observe(Observation(step=step, loss=loss, val_loss=val_loss, learning_rate=learning_rate,
                                momentum=0.9, weights=np.asarray(weights, "float64"), budget_used=step / 100))


def test_window_is_front_padded_with_the_first_row():
    history = FeatureHistory()
    observe(history, 10, 2.0, [1.0, 0.0])
    observe(history, 20, 1.0, [1.0, 1.0])
    window = history.window()
    assert window.shape == (WINDOW, len(FEATURE_NAMES)) and window.dtype == np.float32
    np.testing.assert_array_equal(window[:-1], np.repeat(window[:1], WINDOW - 1, axis=0))


def test_rows_match_closed_forms():
    history = FeatureHistory()
    losses = [4.0, 2.0, 1.5, 1.0, 0.8]
    weights = [[1.0, 0.0], [2.0, 0.0], [1.0, 0.0], [1.0, 3.0], [1.0, 4.0]]
    for step, (loss, w) in enumerate(zip(losses, weights, strict=True)):
        observe(history, step, loss, w, val_loss=2 * loss, learning_rate=1e-2)
    row = dict(zip(FEATURE_NAMES, history.window()[-1]))
    logs = np.log(np.asarray(losses) / losses[0])
    assert row["train_loss"] == pytest.approx(math.log(0.8 / 4.0), rel=1e-6)
    assert row["val_loss"] == pytest.approx(math.log(1.6 / 8.0), rel=1e-6)
    assert row["train_slope"] == pytest.approx(np.polyfit(np.arange(4), logs[-4:], 1)[0], rel=1e-5)
    assert row["train_variability"] == pytest.approx(np.std(logs[-4:]), rel=1e-5)
    assert row["log_learning_rate"] == pytest.approx(-0.5)
    assert row["momentum"] == pytest.approx(0.9)
    assert row["update_size"] == pytest.approx(math.log10(1 / math.hypot(1, 4)) / 4, rel=1e-5)
    assert row["update_cosine"] == pytest.approx(1.0)  # (0, 3) then (0, 1)
    assert row["budget_used"] == pytest.approx(0.04)
    assert row["nonfinite"] == 0 and row["above_best"] == 0


def test_reversed_update_has_cosine_minus_one():
    history = FeatureHistory()
    for step, w in enumerate([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]):
        observe(history, step, 1.0, w)
    assert history.window()[-1, COLUMN["update_cosine"]] == pytest.approx(-1.0)


def test_nonfinite_loss_is_flagged_and_zeroed():
    history = FeatureHistory()
    observe(history, 1, 1.0, [1.0])
    observe(history, 2, float("nan"), [float("nan")])
    row = history.window()[-1]
    assert row[COLUMN["nonfinite"]] == 1.0
    assert row[COLUMN["above_best"]] == 10.0
    assert np.all(np.isfinite(row))


def test_window_needs_an_observation():
    with pytest.raises(ValueError, match="needs at least one observation"):
        FeatureHistory().window()


def fire(trigger, losses):
    return [trigger.update(loss) for loss in losses]


def test_plateau_fires_after_patience_observations():
    assert fire(Trigger(patience=3), [1.0, 1.0, 1.0, 1.0]) == [None, None, None, "plateau"]


def test_divergence_on_nan_and_on_explosion():
    assert fire(Trigger(), [1.0, math.nan]) == [None, "divergence"]
    assert fire(Trigger(explode_factor=3.0), [1.0, 0.5, 0.5, 2.0])[-1] == "divergence"  # 3 x median 0.5


def test_one_lucky_low_loss_does_not_make_noise_a_divergence():
    assert fire(Trigger(explode_factor=3.0), [1.0, 1.0, 0.1, 1.0]) == [None] * 4


def test_oscillation_and_slow_progress():
    assert fire(Trigger(patience=3), [1.0, 0.5, 0.9, 0.4, 0.8])[-1] == "oscillation"
    assert fire(Trigger(patience=3, slow_fraction=0.05), [1.0, 0.99, 0.98, 0.97])[-1] == "slow_progress"
    assert fire(Trigger(patience=3), [1.0, 0.8, 0.6, 0.4, 0.2]) == [None] * 5


def test_a_steadily_improving_run_is_consulted_on_schedule_only_when_asked():
    steady = [1.0, 0.8, 0.6, 0.4, 0.2, 0.1]  # never a plateau, an oscillation or "slow"
    assert fire(Trigger(patience=3), steady) == [None] * 6
    trigger = Trigger(patience=3, cooldown=1, consult_every=3)
    assert fire(trigger, steady[:4]) == [None, None, None, "scheduled"]
    trigger.adjusted()  # the count restarts from the adjustment, after the cooldown
    assert fire(trigger, steady[4:] + [0.05, 0.03]) == [None, None, "scheduled", "scheduled"]


def test_a_rule_that_fires_comes_before_the_schedule():
    assert fire(Trigger(patience=3, consult_every=1), [1.0, 1.0, 1.0, 1.0]) == [None, "scheduled", "scheduled",
                                                                                 "plateau"]
    assert fire(Trigger(consult_every=1), [1.0, math.nan]) == [None, "divergence"]


def test_cooldown_holds_back_all_but_divergence():
    trigger = Trigger(patience=2, cooldown=2)
    assert fire(trigger, [1.0, 1.0, 1.0]) == [None, None, "plateau"]
    trigger.adjusted()
    assert fire(trigger, [1.0, 1.0, math.inf]) == [None, None, "divergence"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"patience": 1}, r"Argument `patience` must be in \[2, None\]. Received: patience=1"),
        ({"cooldown": -1}, r"Argument `cooldown` must be an int >= 0. Received: cooldown=-1"),
        ({"explode_factor": 1.0}, r"Argument `explode_factor` must be in \(1.0, None\]"),
        ({"consult_every": 0}, r"Argument `consult_every` must be in \[1, None\]. Received: consult_every=0"),
    ],
)
def test_bad_trigger_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Trigger(**kwargs)


def test_seeded_reference_catches_a_first_observation_that_blew_up():
    trigger = Trigger(explode_factor=3.0)
    trigger.seed(1.0)  # the first mini-batch's loss, at the initial weights
    assert trigger.update(3.5) == "divergence"


def test_rebaseline_after_a_rollback_accepts_the_restored_level():
    trigger = Trigger(explode_factor=3.0)
    fire(trigger, [1.0, 0.1, 0.1])
    trigger.rebaseline(0.5)  # the restored state's loss
    assert trigger.update(0.5) is None


@pytest.mark.parametrize("suggestion, learning_rate, gap, known", [
    (1e-2, 1e-4, 0.5, 1.0),  # two decades too low: log10(100) / 4
    (1e-3, 1e-1, -0.5, 1.0),
    (1e3, 1e-3, 1.0, 1.0),  # six decades: clipped at four
    (None, 1e-2, 0.0, 0.0),  # no range test ran
    (float("nan"), 1e-2, 0.0, 0.0),
])
def test_range_test_gap_is_the_suggestion_over_the_live_rate(suggestion, learning_rate, gap, known):
    history = FeatureHistory()
    history.observe(Observation(step=1, loss=1.0, val_loss=None, learning_rate=learning_rate, momentum=0.9,
                                weights=np.ones(2), budget_used=0.1, range_test_rate=suggestion))
    row = history.window()[-1]
    assert row[COLUMN["range_test_gap"]] == pytest.approx(gap, rel=1e-6)
    assert row[COLUMN["range_test_known"]] == known


def test_the_update_features_hold_when_the_caller_reuses_its_weights_array():
    """`FeatureHistory` keeps its own copy of the previous weights: a caller that writes each
    observation's weights into one array gets the features of fresh arrays (closed form here)."""
    rng = np.random.default_rng(0)
    snapshots = [rng.normal(size=50).astype("float32")]
    for _ in range(3):
        snapshots.append(snapshots[-1] + rng.normal(size=50).astype("float32") * 0.1)
    fresh, reused, buffer = FeatureHistory(), FeatureHistory(), np.empty(50, "float32")
    for step, weights in enumerate(snapshots):
        buffer[:] = weights
        for history, array in ((fresh, weights.copy()), (reused, buffer)):
            history.observe(Observation(step=step, loss=1.0, val_loss=None, learning_rate=0.1, momentum=0.9,
                                        weights=array, budget_used=step / 4))
    np.testing.assert_array_equal(reused.window(), fresh.window())
    updates = np.diff(np.stack(snapshots).astype("float64"), axis=0)
    cosine = updates[-1] @ updates[-2] / (np.linalg.norm(updates[-1]) * np.linalg.norm(updates[-2]))
    column = FEATURE_NAMES.index("update_cosine")
    np.testing.assert_allclose(reused.window()[-1, column], cosine, rtol=1e-5)
