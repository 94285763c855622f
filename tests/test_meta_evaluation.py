"""`kadapt meta eval MODEL.keras`: the held-out arms, their figures and the command's bad input."""

import math
import re
import types

import numpy as np
import pytest
from helpers import constant_meta_model

from kadapt import cli
from kadapt.cli import meta_evaluation as evaluation
from kadapt.meta.model.actions import KEEP


def _run(best, initial, settings, cosine):
    return {"family": "f", "seed": 0, "best_rate": 0.1, "best_val_loss": best, "initial_val_loss": initial,
            "grid": {}, "settings": {name: {"learning_rate": 1.0, **{arm: {"val_loss": v, "decisions": []}
                                                                    for arm, v in arms.items()}}
                                     for name, arms in settings.items()},
            "cosine": {"without": {"val_loss": cosine[0], "decisions": []},
                       "with": {"val_loss": cosine[1], "decisions": []}}}


def test_summary_figures_by_hand():
    nan = math.nan
    runs = [
        _run(0.10, 2.0, {"too_low": {"constant": 0.9, "plateau": 0.9, "meta": 0.14},  # near, beats
                         "too_high": {"constant": 0.3, "plateau": 0.2, "meta": 0.34},  # harm (> 1.1 x 0.3)
                         "diverging": {"constant": nan, "plateau": nan, "meta": 0.5}},  # rescued
             cosine=(0.10, 0.104)),  # within 1.05x
        _run(0.20, 1.0, {"too_high": {"constant": 0.5, "plateau": 0.25, "meta": 0.25},  # a tie does not beat
                         "diverging": {"constant": nan, "plateau": 0.4, "meta": nan}},  # not rescued
             cosine=(0.20, 0.22)),  # 1.1x: harmed
    ]
    report = evaluation.summarize(runs)
    assert report["all"] == {"runs": 5, "near_grid_best": 2 / 5, "beats_plateau": 2 / 5, "harm": 1 / 5,
                             "rescue": 1 / 2, "diverged_runs": 2, "cosine_no_harm": 1 / 2, "cosine_runs": 2}
    assert report["too_high"]["harm"] == 0.5 and report["too_low"]["near_grid_best"] == 1.0
    assert report["diverging"]["rescue"] == 0.5 and report["too_low"]["rescue"] is None
    table = evaluation.table(runs)
    assert "| harm | 0.20 | <= 0 | NO |" in table and "| rescue | 0.50 | >= 1 | NO |" in table


def test_kadapt_meta_eval_runs_every_arm_on_a_held_out_task(tmp_path, capsys, monkeypatch):
    # The grid's ends and the rate between them that wins on iris, and a diverging search of one
    # rate: every setting and arm in 18 trainings instead of 30 (the grid's rules are tested on
    # fake runs below; one anchor stands for the three, whose settings are pinned below).
    monkeypatch.setattr(evaluation, "GRID", (evaluation.GRID[0], evaluation.GRID[-2], evaluation.GRID[-1]))
    monkeypatch.setattr(evaluation, "DIVERGING_LIMIT", (1000.0,))
    monkeypatch.setattr(evaluation, "ANCHORS", {"adam": evaluation.ANCHORS["adam"]})
    path = tmp_path / "keep.keras"
    constant_meta_model(KEEP).save(path)
    assert cli.main(["meta", "eval", str(path), "--families", "iris", "--seeds", "0", "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "iris/0 grid best lr=0.72 " in out and "| near_grid_best |" in out and "| cosine_no_harm |" in out
    row = next(line for line in out.splitlines() if line.startswith("| iris | 0 |"))
    assert "too_low 0.0001:" in row  # the grid's lowest rate is "too low" on iris in 2 epochs
    assert "too_high 3.16:" in row and "diverging 1000:" in row  # 3.16 ends finite, 1000 does not
    assert "iris/0 anchors: adam " in out and "iris/0 constant at lr=0.72: without " in out
    assert "| adam | 1 |" in out and "| well_set_harm |" in out and "| beats_anchors |" in out


def test_the_anchors_are_at_their_reference_defaults():
    rates = {name: float(factory().learning_rate) for name, factory in evaluation.ANCHORS.items()}
    assert rates == pytest.approx({"schedule_free_adamw": 0.0025, "prodigy": 1.0, "adam": 0.001,
                                   "keras_schedule_free_adamw": 0.0025, "keras_muon": 0.001})
    prodigy = evaluation.ANCHORS["prodigy"]()
    assert not prodigy.safeguard_warmup and not prodigy.use_bias_correction


@pytest.mark.parametrize("argv, message", [
    (["--families", "mnist"], r"--families: unknown \['mnist'\]"),
    (["--seeds", "one"], r"--seeds must be comma-separated ints. Received: 'one'"),
    (["--epochs", "0"], r"--epochs must be a positive int. Received: 0"),
])
def test_kadapt_meta_eval_bad_arguments(argv, message):
    with pytest.raises(SystemExit) as raised:
        cli.main(["meta", "eval", "default", *argv])
    assert re.search(message, str(raised.value.code))


def test_kadapt_meta_eval_refuses_a_file_that_is_not_a_meta_model(tmp_path):
    with pytest.raises(SystemExit) as raised:
        cli.main(["meta", "eval", str(tmp_path / "model.h5")])
    assert "Received: meta_model=" in str(raised.value.code)


def test_range_test_figures_by_hand():
    nan = math.nan
    runs = [_run(0.10, 2.0, {"too_low": {"constant": 0.9, "plateau": 0.9, "meta": 0.12}}, cosine=(0.1, 0.1)),
            _run(0.20, 1.0, {"too_high": {"constant": 0.5, "plateau": 0.3, "meta": 0.25}}, cosine=(0.2, 0.2))]
    runs[0]["range_test"] = {"learning_rate": 0.05, "steps_run": 40, "constant": {"val_loss": 0.119},  # within 1.2x
                             "cosine": {"val_loss": nan}}
    runs[1]["range_test"] = {"learning_rate": 0.3, "steps_run": 40, "constant": {"val_loss": 0.25},  # 1.25x: not
                             "cosine": {"val_loss": 0.2}}
    # MetaAdjuster: 0.12 <= 1.2 x 0.10, 0.25 > 1.2 x 0.20.
    assert evaluation.summarize(runs)["range_test"] == {"runs": 2, "constant": 0.5, "cosine": 0.5,
                                                        "meta_misset": 0.5, "meta_runs": 2}
    assert "| range test, then constant | 2 | 0.50 |" in evaluation.table(runs)


def test_range_start_figures_by_hand():
    nan = math.nan
    runs = [_run(0.10, 2.0, {"too_low": {"constant": 0.9, "plateau": 0.9, "meta": 0.2, "meta_range": 0.11},
                             "diverging": {"constant": nan, "plateau": nan, "meta": 0.5, "meta_range": 0.13}},
                 cosine=(0.1, 0.1)),
            _run(0.20, 1.0, {"too_high": {"constant": 0.3, "plateau": 0.3, "meta": 0.3, "meta_range": 0.34}},
                 cosine=(0.2, 0.2))]
    runs[0]["cosine"]["with_range"] = {"val_loss": 0.104, "decisions": []}  # within 1.05x
    runs[1]["cosine"]["with_range"] = {"val_loss": 0.22, "decisions": []}  # 1.1x: harmed
    runs[0]["range_test"] = {"learning_rate": 0.05, "steps_run": 40, "constant": {"val_loss": 0.12},
                             "cosine": {"val_loss": 0.1}}
    runs[1]["range_test"] = {"learning_rate": 0.3, "steps_run": 40, "constant": {"val_loss": 0.34},
                             "cosine": {"val_loss": 0.2}}
    # 0.11 is within 1.2 x 0.10, 0.13 is not; below the anchor 0.12: 0.11 only (0.34 ties);
    # 0.34 > 1.1 x 0.3 is harm; the diverging run ends finite below 2.0.
    figures = evaluation.summarize(runs)["meta_range"]
    assert figures["all"] == {"runs": 3, "near_grid_best": 1 / 3, "beats_range_constant": 1 / 3, "harm": 1 / 3,
                              "rescue": 1.0, "diverged_runs": 1, "cosine_no_harm": 0.5, "cosine_runs": 2,
                              "beats_anchors": None, "anchor_runs": 0, "well_set_harm": 0.5, "well_set_runs": 2}
    assert figures["too_high"]["harm"] == 1.0 and figures["diverging"]["near_grid_best"] == 0.0
    assert "| beats_range_constant | 0.33 | >= 0.6 | NO |" in evaluation.table(runs)


def test_the_grid_widens_past_an_end_where_its_best_sits(monkeypatch):
    # Best near 20, above the grid's 3.16: 13.9 (3.16 x 10^(4.5/7)) is added and is better,
    # 61.1 is added and is worse, and the widening stops there.
    def fake_run(task, epochs):
        return {"val_loss": (math.log10(task.learning_rate) - math.log10(20.0)) ** 2 + 0.1}

    monkeypatch.setattr(evaluation, "train_run", fake_run)
    monkeypatch.setattr(evaluation, "evaluation_task",
                        lambda family, seed, rate: types.SimpleNamespace(learning_rate=rate))
    grid = {rate: fake_run(types.SimpleNamespace(learning_rate=rate), 1) for rate in evaluation.GRID}
    finite = evaluation._widened(grid, "f", 0, 1)
    assert sorted(set(grid) - set(evaluation.GRID)) == [13.9, 61.1]
    assert min(finite, key=finite.get) == 13.9


def test_issue_46_figures_by_hand():
    nan = math.nan
    runs = [_run(0.10, 2.0, {"too_low": {"constant": 0.9, "plateau": 0.9, "meta": 0.2, "meta_range": 0.11},
                             "diverging": {"constant": nan, "plateau": nan, "meta": 0.5, "meta_range": 0.13}},
                 cosine=(0.1, 0.1)),
            _run(0.20, 1.0, {"too_high": {"constant": 0.3, "plateau": 0.3, "meta": 0.3, "meta_range": 0.21}},
                 cosine=(0.2, 0.2))]
    runs[0]["cosine"]["with_range"] = {"val_loss": 0.104, "decisions": []}  # within 1.05x
    runs[1]["cosine"]["with_range"] = {"val_loss": 0.22, "decisions": []}  # 1.1x: harmed
    runs[0]["well_set"] = {"without": {"val_loss": 0.1}, "with_range": {"val_loss": 0.1051, "decisions": []}}  # harmed
    runs[1]["well_set"] = {"without": {"val_loss": 0.2}, "with_range": {"val_loss": 0.19, "decisions": []}}
    runs[0]["anchors"] = {"schedule_free_adamw": {"val_loss": 0.12}, "prodigy": {"val_loss": nan},
                          "adam": {"val_loss": 0.15}}  # best 0.12: 0.11 beats it, 0.13 does not
    runs[1]["anchors"] = {"schedule_free_adamw": {"val_loss": 0.5}, "prodigy": {"val_loss": 0.25},
                          "adam": {"val_loss": 0.21}}  # best 0.21: 0.21 ties, does not beat
    for run in runs:
        run["range_test"] = {"learning_rate": 0.05, "steps_run": 40, "constant": {"val_loss": 1.0},
                             "cosine": {"val_loss": 1.0}}
    report = evaluation.summarize(runs)
    figures = report["meta_range"]["all"]
    assert figures["beats_anchors"] == 1 / 3 and figures["anchor_runs"] == 3
    assert figures["well_set_harm"] == 2 / 4 and figures["well_set_runs"] == 4
    assert report["meta_range"]["too_low"]["beats_anchors"] == 1.0
    # Schedule-Free within 1.2 x 0.10 on the first task-seed; Prodigy (diverged) on neither;
    # Adam 0.21 within 1.2 x 0.20 on the second, and 0.15 within 1.5x on the first.
    assert report["anchors"] == {
        "schedule_free_adamw": {"runs": 2, "near_grid_best": 0.5, "within_1.5x": 0.5},
        "prodigy": {"runs": 2, "near_grid_best": 0.0, "within_1.5x": 0.5},
        "adam": {"runs": 2, "near_grid_best": 0.5, "within_1.5x": 1.0}}
    table = evaluation.table(runs)
    assert "| well_set_harm | 0.50 | <= 0 | NO |" in table and "| schedule_free_adamw | 2 | 0.50 | 0.50 |" in table


def test_results_without_anchors_still_summarize():
    runs = [_run(0.10, 2.0, {"too_low": {"constant": 0.9, "plateau": 0.9, "meta": 0.2, "meta_range": 0.11}},
                 cosine=(0.1, 0.1))]
    report = evaluation.summarize(runs)
    assert report["meta_range"]["all"]["beats_anchors"] is None and report["anchors"] == {}
    assert "| beats_anchors | - |" in evaluation.table(runs)


@pytest.mark.parametrize("family", ["circles", "fashion_autoencoder"])
def test_the_rescue_arm_is_kadapt_trains_rescue_at_the_tasks_chance(family):
    """The constant predictor's loss, computed here from the training targets: the entropy of the
    class frequencies, or for the autoencoder's images the mean over pixels of each pixel's variance."""
    task = evaluation.evaluation_task(family, 3, 0.01)
    y = np.asarray(task.data[1], "float64")
    if task.regression:
        expected = np.mean((y - y.mean(axis=0)) ** 2)
    else:
        frequencies = np.bincount(y.astype(int)) / len(y)
        expected = -np.sum(frequencies * np.log(frequencies))
    rescue = evaluation.task_rescue(task)
    assert rescue.rule.chance_loss == pytest.approx(expected, rel=1e-9)
    assert rescue.monitor == "val_loss" and rescue.range_test is not None


def test_a_reordered_task_holds_the_same_training_rows_in_another_order_and_the_same_validation_rows():
    task = evaluation.evaluation_task("circles", 3, 0.01)
    x, y, x_val, y_val = task.data
    first, again, other = (evaluation.reordered(task, order).data for order in (1, 1, 2))
    label_of = {row.tobytes(): label for row, label in zip(x, y)}
    assert len(label_of) == len(x) == len(first[0])  # distinct rows: each found once below
    assert {row.tobytes() for row in first[0]} == set(label_of)
    assert all(label_of[row.tobytes()] == label for row, label in zip(first[0], first[1]))  # each keeps its label
    assert not np.array_equal(first[0], x) and not np.array_equal(first[0], other[0])
    assert all(np.array_equal(a, b) for a, b in zip(first, again))  # the order is a function of (seed, order)
    assert first[2] is x_val and first[3] is y_val
