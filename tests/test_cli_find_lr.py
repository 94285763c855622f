"""`kadapt find-lr` and `--learning-rate auto` on scikit-learn's digits, a few dozen steps."""

import json

import numpy as np
import pytest

from kadapt import cli
from kadapt.run.pipeline import start_run


def test_find_lr_prints_the_suggestion_and_writes_the_curve(tmp_path, capsys):
    out = tmp_path / "range"
    assert cli.main(["find-lr", "--data", "digits", "--model", "mlp", "--batch-size", "32", "--start", "1e-4",
                     "--num-steps", "40", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    curve = json.loads((out / "range_test.json").read_text())
    assert f"learning rate {curve['suggestion']:.4g} (valley; batch size 32; " in printed
    assert "rules: valley " in printed and " steepest " in printed and " minimum/10 " in printed
    assert len(curve["rates"]) == len(curve["losses"]) == curve["steps_run"] <= 40
    np.testing.assert_allclose(curve["rates"][:2], [1e-4, 1e-4 * 1e5 ** (1 / 39)])
    assert (out / "range_test.png").read_bytes().startswith(b"\x89PNG")


def test_a_resumed_auto_run_keeps_the_rate_its_range_test_found(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    options = {"data": "digits", "model": "mlp", "epochs": 2, "meta": "off", "recipe": {"learning_rate": "auto"}}
    resolved = {"range_test": {"learning_rate": 0.0123, "rule": "valley", "steps_run": 90, "diverged": True}}
    (run / "config.json").write_text(json.dumps({"options": options, "resolved": resolved}))
    (run / "run.json").write_text(json.dumps({"status": "interrupted"}))

    resumed = start_run({"learning_rate": "auto"}, str(run), resume=True)

    assert resumed.plan.recipe.learning_rate == 0.0123
    assert resumed.plan.range_test == resolved["range_test"]  # written again into config.json by `train`


def test_a_learning_rate_that_is_neither_a_number_nor_auto_is_refused():
    with pytest.raises(SystemExit, match=r"--learning-rate must be a positive number or 'auto'. "
                                         r"Received: --learning-rate='fast'"):
        cli.main(["train", "--data", "digits", "--learning-rate", "fast"])

