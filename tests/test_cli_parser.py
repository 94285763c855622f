"""The `kadapt` command line without training: the parser, its recipe flags,
the commands that answer without TensorFlow, and the rules of a run directory."""

import json
import re
import subprocess
import sys

import pytest

from kadapt import cli
from kadapt.cli.train import fit_verbosity
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.config import command_line_switches
from kadapt.run.config import resolve_config
from kadapt.run.errors import UsageError
from kadapt.run.run_directory import RunDirectory

NO_TENSORFLOW = """
import sys
from kadapt import cli
for argv in (["--help"], ["train", "--help"], ["--version"], ["report", sys.argv[1]]):
    try:
        cli.main(argv)
    except SystemExit:
        pass
print("loaded:", sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
"""


def fabricated_run(path):
    """A run directory as `kadapt train` leaves it after one epoch, without the training."""
    path.mkdir()
    options = {"data": "digits", "model": "mlp", "epochs": 2, "meta": "off"}
    (path / "config.json").write_text(json.dumps({"options": options}))
    (path / "run.json").write_text(json.dumps({"status": "interrupted"}))
    (path / "history.json").write_text(json.dumps({"epoch": [0], "loss": [0.5]}))
    (path / "steps.jsonl").write_text(json.dumps({"step": 0, "loss": 0.5}) + "\n")
    return path


def test_python_dash_m_kadapt_is_the_kadapt_command():
    result = subprocess.run([sys.executable, "-m", "kadapt", "--version"], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "kadapt 0.1.0\n")


def test_help_version_and_report_load_no_tensorflow(tmp_path):
    run = fabricated_run(tmp_path / "run")
    result = subprocess.run([sys.executable, "-c", NO_TENSORFLOW, str(run)], capture_output=True, text=True,
                            timeout=120)
    assert "kadapt 0.1.0" in result.stdout and re.search(r"status +interrupted", result.stdout)
    assert result.stdout.splitlines()[-1] == "loaded: []"
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "history.json", "run.json", "steps.jsonl"]


def test_a_closed_pipe_ends_the_report_quietly(tmp_path):
    run = fabricated_run(tmp_path / "run")
    process = subprocess.Popen([sys.executable, "-m", "kadapt.cli", "report", str(run)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # the reader is gone before the first line is written
    _, error = process.communicate(timeout=120)
    assert error == ""
    assert process.returncode == cli.BROKEN_PIPE_STATUS


def test_every_recipe_switch_is_a_train_flag_with_its_default_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--widths N,N,... fast_resnet's channels per stage (default: 64,128,256)",
                 "--ema EMA average the weights", "--restore-best {on,off}", "--learning-rate LEARNING-RATE",
                 "--precision {float32,bfloat16,float16,auto}", "(default: triangular)",
                 "--optimizer {auto,sgd,adam,prodigy,schedule_free_adamw,schedule_free_sgd,muon,muon_filters}"):
        assert flag in text
    assert len(command_line_switches()) == 14


def test_recipe_flags_parse_to_the_fields_of_fast_fit_config():
    args = cli.build_parser().parse_args(["train", "--widths", "8,16", "--ema", "0.9", "--restore-best", "off",
                                          "--schedule", "cosine"])
    assert (args.widths, args.ema_momentum, args.restore_best_weights, args.schedule) == ((8, 16), 0.9, False,
                                                                                          "cosine")
    assert args.learning_rate is None  # not given: the recipe's default, and a resume can tell


@pytest.mark.parametrize("setting, terminal, verbose", [("auto", True, 1), ("auto", False, 2), ("0", True, 0)])
def test_fit_verbosity_is_one_line_per_epoch_off_a_terminal(setting, terminal, verbose):
    class Stream:
        def isatty(self):
            return terminal

    assert fit_verbosity(setting, Stream()) == verbose


def test_resume_reads_a_config_json_written_before_the_recipe_switches_were_grouped():
    saved = {"data": "digits", "epochs": 3, "widths": [8, 16], "ema": 0.9, "restore_best": "off", "cutout": None}
    config = resolve_config({"ema_momentum": 0.9}, saved)
    assert config.recipe == {"widths": (8, 16), "ema_momentum": 0.9, "restore_best_weights": False}
    assert resolve_config({"learning_rate": FastFitConfig().learning_rate}, saved).epochs == 3
    with pytest.raises(UsageError, match=r"--widths=\(8, 32\) \(saved: \(8, 16\)\)"):
        resolve_config({"widths": (8, 32)}, saved)


def test_a_run_that_failed_before_its_first_step_starts_afresh_in_its_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "run.json").write_text(json.dumps({"status": "failed"}))
    assert RunDirectory(run).check_new_run() is True  # to be emptied, then the new run starts
    (run / "steps.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(UsageError, match="already exists: pass --overwrite"):
        RunDirectory(run).check_new_run()
