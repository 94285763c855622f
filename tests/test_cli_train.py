"""`kadapt train`, `report` and `predict` driven as a user drives them, on a
tiny `.npz`, a few steps, in-process (a subprocess pays a TensorFlow import);
bad input ends in one line, no traceback. One trained run directory is
shared by the module."""

import contextlib
import io
import json
import math
import re
import signal

import numpy as np
import pytest
from matplotlib import image

from helpers import epochs_done
from helpers import write_tiny_npz
from kadapt import cli
from kadapt.run.step_logger import StepLogger

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# TensorFlow's C++ logging writes these to stderr, whatever the log level.
TF_LOG_LINE = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl|To enable the following)")
TINY = ["--model", "small_cnn", "--batch-size", "16", "--memory-budget", "256MiB", "--meta", "off"]


def user_lines(stderr):
    return [line for line in stderr.splitlines() if line.strip() and not TF_LOG_LINE.match(line)]


def cosine(step, total, high, low):
    """The closed form: low + (high - low) * (1 + cos(pi * step / total)) / 2."""
    return low + (high - low) * (1 + math.cos(math.pi * min(step, total) / total)) / 2


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_train")
    write_tiny_npz(folder / "tiny.npz")
    return folder


@pytest.fixture(scope="module")
def trained(workdir):
    """A 2-epoch run: 58 training rows (6 held out), batches of 16 -> 8 steps. In-process, its
    stdout a pipe-like stream (no terminal): the Ctrl-C test starts the command as a subprocess."""
    output = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(output):
        patch.chdir(workdir)
        assert cli.main(["train", "--data", "tiny.npz", *TINY, "--augment", "on", "--epochs", "2",
                         "--out", "runs/tiny"]) == 0
    return output.getvalue(), workdir / "runs" / "tiny"


def test_train_writes_every_file_of_the_run_directory(trained):
    _, run = trained
    for name in ("config.json", "run.json", "history.json", "steps.jsonl", "meta_decisions.jsonl",
                 "probe.json", "model.keras", "training.png", "probe.png"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard" / "train").iterdir())
    assert not (run / "backup").exists()  # BackupAndRestore cleans up after a finished run
    assert (run / "meta_decisions.jsonl").read_text() == ""  # --meta off


def test_config_run_history_and_probe_records(trained):
    _, run = trained
    config = json.loads((run / "config.json").read_text())
    assert config["options"]["batch_size"] == 16 and config["options"]["data"] == "tiny.npz"
    assert config["resolved"]["data"]["train_rows"] == 58
    assert config["resolved"]["total_steps"] == 8
    assert config["resolved"]["plan"]["micro_batch_size"] == json.loads((run / "probe.json").read_text())["micro_batch_size"]
    # Shifted while training (--augment on), not mirrored (not Fashion-MNIST): so tested.
    assert config["resolved"]["test_time_augmentation"] == {"flip": False, "shift": 1}
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "completed" and record["steps_completed"] == 8
    assert 0.0 <= record["test_accuracy"] <= 1.0
    history = json.loads((run / "history.json").read_text())
    assert history["epoch"] == [0, 1]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(history)


def test_run_records_and_prints_where_its_seconds_went(trained):
    output, run = trained
    seconds = json.loads((run / "run.json").read_text())["seconds"]
    in_run = ["data", "network", "pipeline", "probe", "range test", "first step", "epochs", "evaluation", "saving"]
    assert list(seconds) == ["start-up", *in_run]  # the command's process: start-up first, then in order
    assert all(value >= 0 for value in seconds.values())
    assert seconds["probe"] > 0 and seconds["first step"] > 0 and seconds["epochs"] > 0  # --memory-budget probes
    # The phases from the data on cover the run: wall_seconds counts from `train`'s start, after data and network.
    record = json.loads((run / "run.json").read_text())
    assert sum(seconds[name] for name in in_run[2:]) == pytest.approx(record["wall_seconds"], abs=1.0)
    assert re.search(r"^time: start-up [\d.]+ s, .*probe [\d.]+ s, .*epochs [\d.]+ s.*\(total \d+ s\)$", output, re.M)


def triangle(step, total, warmup, peak):
    """The closed form: 0 -> peak over `warmup` steps, then linearly to 0 at `total`."""
    return peak * step / warmup if step < warmup else peak * (total - step) / (total - warmup)


def test_steps_log_the_recipes_triangular_rate_and_constant_momentum(trained):
    _, run = trained
    steps = read_jsonl(run / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(8))
    for s in steps:  # warmup int(0.15 * 8) = 1 step; multiplier 1
        assert s["learning_rate"] == pytest.approx(triangle(s["step"], 8, 1, 0.2), rel=1e-5, abs=1e-9)
        assert s["momentum"] == pytest.approx(0.9, abs=1e-6)


def test_step_losses_average_to_the_epoch_loss(trained):
    _, run = trained
    steps = read_jsonl(run / "steps.jsonl")
    history = json.loads((run / "history.json").read_text())
    rows = [16, 16, 16, 10]  # 58 rows in batches of 16
    first_epoch = [s["loss"] for s in steps if s["epoch"] == 0]
    assert np.average(first_epoch, weights=rows) == pytest.approx(history["loss"][0], rel=1e-4)


def test_plots_are_valid_png_images(trained):
    _, run = trained
    for name in ("training.png", "probe.png"):
        path = run / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        pixels = image.imread(path)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0  # something was drawn


def test_train_prints_probe_trials_progress_and_the_result(trained):
    stdout, _ = trained
    assert re.search(r"trial micro-batch +\d+: .*fits", stdout)
    assert "plan: logical batch 16" in stdout
    assert "Epoch 2/2" in stdout
    assert re.search(r"test accuracy \d\.\d{4}", stdout)
    assert "training.png" in stdout and "probe.png" in stdout


def test_training_output_into_a_pipe_has_one_line_per_epoch_and_no_escape_codes(trained):
    stdout, _ = trained
    assert "\x1b" not in stdout and "\r" not in stdout
    assert len(re.findall(r"^\d+/\d+ - .* - val_loss: ", stdout, re.MULTILINE)) == 2


def test_the_run_directory_names_the_meta_adjusters_decision_file():
    from kadapt.meta.live.adjuster import DECISIONS_FILE
    from kadapt.run import run_directory

    assert run_directory.META_DECISIONS == DECISIONS_FILE


# `report` and `predict` run in-process: each subprocess costs a TensorFlow import.
def test_predict_agrees_with_the_evaluation_and_writes_classes(trained, capsys, monkeypatch):
    _, run = trained
    workdir = run.parent.parent
    monkeypatch.chdir(workdir)
    assert cli.main(["predict", str(run), "--data", "tiny.npz", "--output", "classes.npy"]) == 0
    accuracy = json.loads((run / "run.json").read_text())["test_accuracy"]
    assert f"accuracy {accuracy:.4f}" in capsys.readouterr().out
    classes = np.load(workdir / "classes.npy")
    assert classes.shape == (32,) and set(classes.tolist()) <= {0, 1}


def test_predict_on_a_run_recorded_before_test_time_shifts_uses_flips_only(trained, tmp_path, monkeypatch):
    import shutil

    from kadapt.cli import predict

    _, run = trained
    old = shutil.copytree(run, tmp_path / "old")
    config = json.loads((old / "config.json").read_text())
    del config["resolved"]["test_time_augmentation"]  # as `kadapt train` wrote it before
    (old / "config.json").write_text(json.dumps(config))
    used, real = [], predict.predict_with_tta

    def recording(*args, **kwargs):
        used.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(predict, "predict_with_tta", recording)
    monkeypatch.chdir(run.parent.parent)
    assert cli.main(["predict", str(old), "--data", "tiny.npz"]) == 0
    assert cli.main(["predict", str(run), "--data", "tiny.npz"]) == 0
    assert [(k["flip"], k["shift"]) for k in used] == [(False, 0), (False, 1)]


def test_report_prints_a_summary_and_writes_nothing(trained, capsys):
    _, run = trained
    before = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    assert cli.main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*")} == before
    assert re.search(r"status +completed", out)
    assert re.search(r"batch plan +logical batch 16", out)
    assert re.search(r"test accuracy +\d\.\d{4}", out)
    assert re.search(r"saved weights +epoch [12], the best val_loss", out)
    assert re.search(r"time split +start-up [\d.]+ s, .*epochs [\d.]+ s.*\(total \d+ s\)", out)
    history = json.loads((run / "history.json").read_text())
    table = out[out.index("epoch  "):].splitlines()
    assert table[0].split() == ["epoch", "loss", "accuracy", "val", "loss", "val", "accuracy"]
    assert [line.split()[0] for line in table[2:]] == ["1", "2"]
    assert float(table[3].split()[3]) == pytest.approx(history["val_loss"][1], rel=1e-3)


def test_training_plot_shows_validation_and_one_legend_entry_per_kind_of_decision():
    from kadapt.run.plots import training_figure

    steps = [{"step": s, "epoch": s // 4, "loss": 1.0 / (s + 1), "learning_rate": 0.1, "momentum": 0.9}
             for s in range(8)]
    history = {"epoch": [0, 1], "loss": [0.5, 0.3], "accuracy": [0.6, 0.8], "val_loss": [0.6, 0.4],
               "val_accuracy": [0.55, 0.75]}
    decisions = [{"step": s, "trigger": t} for s, t in ((2, "plateau"), (4, "divergence"), (6, "plateau"))]
    axes = training_figure(steps, decisions, history).axes
    assert axes[0].get_legend_handles_labels()[1] == ["MetaAdjuster: plateau (2x)", "MetaAdjuster: divergence (1x)"]
    assert [t.get_text() for t in axes[2].get_legend().get_texts()] == ["training loss (this step)", "validation loss"]
    assert [t.get_text() for t in axes[3].get_legend().get_texts()] == ["training accuracy", "validation accuracy"]
    validation = [line for line in axes[2].get_lines() if line.get_label() == "validation loss"][0]
    assert list(validation.get_xdata()) == [4, 8] and list(validation.get_ydata()) == [0.6, 0.4]


def test_report_redraw_marks_meta_decisions_on_the_training_plot(trained, capsys):
    _, run = trained
    decisions = run / "meta_decisions.jsonl"
    (run / "training.png").unlink()
    cli.main(["report", str(run), "--redraw"])
    without = image.imread(run / "training.png")
    decisions.write_text(json.dumps({"step": 4, "trigger": "plateau", "adjustment": "lr x2",
                                     "confidence": 0.8}) + "\n")
    try:
        cli.main(["report", str(run), "--redraw"])
        marked = image.imread(run / "training.png")
    finally:
        decisions.write_text("")
    assert re.search(r"meta-adjuster +off, 1 decision\(s\)", capsys.readouterr().out)
    assert without.shape == marked.shape and not np.array_equal(without, marked)


def test_an_existing_run_directory_is_refused_in_one_line(trained, monkeypatch):
    _, run = trained
    monkeypatch.chdir(run.parent.parent)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "tiny.npz", *TINY, "--out", "runs/tiny"])
    assert str(raised.value) == (
        "kadapt: error: --out runs/tiny already exists: pass --overwrite to replace it, "
        "or --resume to continue it.")
    assert json.loads((run / "run.json").read_text())["status"] == "completed"  # untouched


@contextlib.contextmanager
def ctrl_c_after(steps):
    """Ctrl-C as a terminal sends it, SIGINT to this process, once `steps` training steps are logged:
    between two steps, where a real one mostly lands, but at a known step rather than on a timer's
    race with the run (a signal that lands after the run would stop the test session instead)."""
    real, logged = StepLogger.on_train_batch_end, []

    def on_train_batch_end(logger, batch, logs=None):
        real(logger, batch, logs)
        logged.append(batch)
        if len(logged) == steps:
            signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(StepLogger, "on_train_batch_end", on_train_batch_end)
            yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_leaves_a_consistent_run_that_resumes_as_if_uninterrupted(workdir, monkeypatch, capfd):
    epochs = 3
    run = workdir / "runs" / "interrupted"
    # 64 training rows (7 of 71 held out): whole batches, so each of the three runs traces one step.
    write_tiny_npz(workdir / "whole_batches.npz", train_rows=71)
    # Augmented on the fly (shifts, cutout): the resumed run must draw what the uninterrupted one drew.
    args = ["--data", "whole_batches.npz", *TINY, "--schedule", "cosine", "--cutout", "0.5",
            "--epochs", str(epochs), "--out", str(run)]
    monkeypatch.chdir(workdir)
    # Half-way through the second epoch: the two steps logged after the checkpoint must not count.
    with ctrl_c_after(6):
        assert cli.main(["train", *args]) == 130
    stderr = capfd.readouterr().err
    assert user_lines(stderr)[-1].startswith("kadapt: interrupted: ")
    assert "Traceback" not in stderr
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    assert (run / "config.json").is_file() and (run / "backup").is_dir()
    assert epochs_done(run) == [0]
    assert [s["step"] for s in read_jsonl(run / "steps.jsonl")] == list(range(6))  # every line whole

    assert cli.main(["train", "--resume", "--out", str(run)]) == 0
    assert epochs_done(run) == list(range(epochs))
    steps = read_jsonl(run / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(4 * epochs))  # 4 steps per epoch, none twice
    resolved = json.loads((run / "config.json").read_text())["resolved"]
    total = resolved["total_steps"]
    warmup = int(0.15 * total)  # the recipe's warmup fraction
    assert total == 4 * epochs and resolved["recipe"]["schedule"] == "cosine"
    # A dead-run rescue (on by default) would roll the run back and scale the rate from its step on:
    # the resumed run follows its decisions, and makes the ones the uninterrupted run makes (below).
    decisions = read_jsonl(run / "meta_decisions.jsonl")
    for s in steps[warmup:]:  # the schedule continued from the restored step
        multiplier = np.prod([d["adjustment"]["learning_rate_multiplier"] for d in decisions if s["step"] >= d["step"]])
        assert s["learning_rate"] == pytest.approx(
            multiplier * cosine(s["step"] - warmup, total - warmup, 0.2, 0.0), rel=1e-4, abs=1e-7)
        assert s["momentum"] == pytest.approx(
            0.95 - 0.10 * cosine(s["step"] - warmup, total - warmup, 1.0, 0.0), abs=1e-6)
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "completed"
    # The same command, uninterrupted (in-process): the same history, the same best epoch, the same model.
    from kadapt import load_model

    whole = workdir / "runs" / "uninterrupted"
    assert cli.main(["train", *args[:-1], str(whole)]) == 0
    histories = [json.loads((path / "history.json").read_text()) for path in (run, whole)]
    assert histories[0]["epoch"] == histories[1]["epoch"] == list(range(epochs))
    for key in ("loss", "val_loss", "accuracy"):
        np.testing.assert_allclose(histories[0][key], histories[1][key], rtol=1e-5)
    assert record["weights"] == json.loads((whole / "run.json").read_text())["weights"]
    assert [(d["trigger"], d["step"]) for d in decisions] == [
        (d["trigger"], d["step"]) for d in read_jsonl(whole / "meta_decisions.jsonl")]
    weights = [load_model(path / "model.keras").get_weights() for path in (run, whole)]
    for got, want in zip(*weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_expand_appends_generated_samples_before_training(tmp_path):
    # 32 training rows (3 of 35 held out) and 16 generated: whole batches, one step trace.
    path = str(write_tiny_npz(tmp_path / "tiny.npz", train_rows=35))
    out = tmp_path / "expanded"
    assert cli.main(["train", "--data", path, *TINY, "--epochs", "1", "--expand", "0.5",
                     "--expand-method", "cutmix", "--out", str(out)]) == 0
    resolved = json.loads((out / "config.json").read_text())["resolved"]
    assert resolved["train_rows"] == 32 + 16  # 32 training rows and round(0.5 * 32) generated
    assert resolved["total_steps"] == 3 == json.loads((out / "run.json").read_text())["steps_completed"]
    assert "expanded by 0.5 x the rows (cutmix)" in resolved["augmentation"]


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    """A digits run through an MLP that failed before its first step (--memory-budget 1KiB), rerun
    in the same directory with corrected options: 3 steps, the learning rate found by the range test.
    Returns the failure's message, its run.json and the run directory."""
    out = tmp_path_factory.mktemp("rerun") / "digits"
    command = ["train", "--data", "digits", "--model", "mlp", "--meta", "off", "--out", str(out)]
    with pytest.raises(SystemExit) as raised:
        cli.main([*command, "--memory-budget", "1KiB"])
    failed = json.loads((out / "run.json").read_text())
    assert cli.main([*command, "--memory-budget", "256MiB", "--batch-size", "64", "--max-steps", "3",
                     "--learning-rate", "auto"]) == 0
    return str(raised.value), failed, out


def test_a_memory_budget_below_one_row_ends_in_one_line(rerun):
    message, _, _ = rerun
    assert message.startswith("kadapt: error: --memory-budget 1KiB is too small for this model: "
                              "it is smaller than one sample") and "\n" not in message


def test_a_run_that_failed_before_its_first_step_reruns_with_corrected_options(rerun):
    _, failed, out = rerun
    assert failed["status"] == "failed"
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and "error" not in record


def test_digits_with_an_mlp_max_steps_and_the_learning_rate_found(rerun):
    _, _, out = rerun
    config = json.loads((out / "config.json").read_text())
    assert config["resolved"]["data"]["input_shape"] == [8, 8, 1]
    assert config["resolved"]["total_steps"] == 3
    assert json.loads((out / "run.json").read_text())["steps_completed"] == 3
    steps = read_jsonl(out / "steps.jsonl")
    assert len(steps) == 3
    found = config["resolved"]["range_test"]["learning_rate"]
    assert config["resolved"]["recipe"]["learning_rate"] == found
    # Three steps, no warmup (int(0.15 * 3) = 0): the triangular schedule starts at its peak.
    assert steps[0]["learning_rate"] == pytest.approx(found, rel=1e-6)


def test_target_accuracy_stops_training(tmp_path, capsys):
    out = tmp_path / "target"
    assert cli.main(["train", "--data", "digits", "--model", "mlp", "--batch-size", "50",
                     "--train-rows", "200", "--epochs", "5", "--target-accuracy", "0.01",
                     "--out", str(out)]) == 0
    assert json.loads((out / "history.json").read_text())["epoch"] == [0]
    assert "val_accuracy" in capsys.readouterr().out.split("stopping after epoch 1")[0]


def _npz(tmp_path, name, **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data", "cifar99"], "--data must be one of fashion_mnist, digits or a .npz file"),
        (["--data", "digits", "--model", "vgg"], "--model must be one of auto, fast_resnet, small_cnn, mlp, or "
                                                 "package.module:function"),
        (["--data", "missing.npz"], "--data missing.npz does not exist."),
        (["--data", "digits", "--batch-size", "0"], "--batch-size must be a positive integer. Received: --batch-size=0"),
        (["--data", "digits", "--batch-size", "-3"], "--batch-size must be a positive integer. Received: --batch-size=-3"),
        (["--data", "digits", "--batch-size", "many"], "argument --batch-size: invalid int value: 'many'"),
        (["--data", "digits", "--memory-budget", "lots"], "--memory-budget must be a size such as 2GiB"),
        (["--data", "digits", "--model", "small_cnn"], "--model small_cnn cannot take inputs of shape (8, 8, 1)"),
        (["--data", "digits", "--overwrite", "--resume"], "argument --resume: not allowed with argument --overwrite"),
        (["--resume"], "--resume needs --out"),
        ([], "--data is required"),
    ],
)
def test_bad_arguments_end_in_one_line(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", *argv])
    text = str(raised.value)
    assert text.startswith("kadapt: error: ") and "\n" not in text
    assert message in text
    assert not (tmp_path / "runs").exists()  # nothing written


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "fast_resnet"], "--model fast_resnet needs images (height, width, channels); the data rows "
                                     "have shape (3,). Use --model mlp."),
        (["--cutout", "0.5"], "--cutout augment images; the rows of --data"),
        (["--mixup", "0.2", "--cutmix", "1.0"], "--cutmix, --mixup augment images"),
        (["--augment", "on"], "--augment on needs image data"),
        (["--expand", "0.5"], "--expand augment images; the rows of --data"),
    ],
    ids=["fast_resnet", "cutout", "mixing", "augment on", "expand"],
)
def test_recipe_flags_that_cannot_apply_to_vectors_end_in_one_line(argv, message, tmp_path):
    rows = np.random.default_rng(0).normal(size=(12, 3)).astype("float32")
    path = _npz(tmp_path, "vectors.npz", x_train=rows[:8], y_train=np.arange(8) % 2, x_test=rows[8:],
                y_test=np.arange(4) % 2)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", path, "--meta", "off", *argv, "--out", str(tmp_path / "run")])
    text = str(raised.value)
    assert text.startswith("kadapt: error: ") and "\n" not in text
    assert message in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ema", "0.99"], "--ema averages the weights, and --restore-best on would replace the average"),
        (["--ema", "1.5", "--restore-best", "off"], "Argument --ema must be in [0.0, 1.0). Received: --ema=1.5"),
        (["--cutout", "0.5", "--augment", "off"], "--cutout cannot apply with --augment off"),
        (["--label-smoothing", "2"], "--label-smoothing must be"),
    ],
)
def test_recipe_flags_that_contradict_end_in_one_line(argv, message, tmp_path):
    path = str(write_tiny_npz(tmp_path / "tiny.npz"))
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", path, "--meta", "off", *argv, "--out", str(tmp_path / "run")])
    text = str(raised.value)
    assert text.startswith("kadapt: error: ") and "\n" not in text
    assert message in text
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x_train": np.zeros((4, 3))}, "lacks y_train, x_test, y_test"),
        ({"x_train": np.array([None] * 4), "y_train": np.zeros(4, int), "x_test": np.zeros((2, 3)),
          "y_test": np.zeros(2, int)}, "is not a readable .npz of numeric arrays"),
        ({"x_train": np.zeros((4, 3)), "y_train": np.zeros(5, int), "x_test": np.zeros((2, 3)),
          "y_test": np.zeros(2, int)}, "labels must be 4 values, one per input row"),
    ],
    ids=["missing keys", "object array", "row mismatch"],
)
def test_malformed_npz_ends_in_one_line(arrays, message, tmp_path):
    path = _npz(tmp_path, "bad.npz", **arrays)
    with pytest.raises(SystemExit, match=re.escape(message)) as raised:
        cli.main(["train", "--data", path, "--model", "mlp", "--out", str(tmp_path / "run")])
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "run").exists()


def test_a_file_that_is_not_an_npz_ends_in_one_line(tmp_path):
    path = tmp_path / "text.npz"
    path.write_text("x_train,y_train\n1,2\n")
    with pytest.raises(SystemExit, match="is not a readable .npz"):
        cli.main(["train", "--data", str(path), "--model", "mlp", "--out", str(tmp_path / "run")])


def test_an_unwritable_output_directory_ends_in_one_line(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit, match=r"--out .*a_file/run cannot be created: .*a_file is not a writable directory"):
        cli.main(["train", "--data", "digits", "--model", "mlp", "--out", str(tmp_path / "a_file" / "run")])


def test_overwrite_never_deletes_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="it is not a kadapt run directory, so --overwrite will not delete it"):
        cli.main(["train", "--data", "digits", "--model", "mlp", "--out", str(tmp_path), "--overwrite"])
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_resume_refuses_changed_options(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"options": {"data": "digits", "model": "mlp", "epochs": 3}}))
    with pytest.raises(SystemExit, match=r"these options differ: --epochs=5 \(saved: 3\)"):
        cli.main(["train", "--resume", "--out", str(out), "--epochs", "5"])


def test_report_and_predict_of_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(SystemExit, match="holds no config.json: it is not a kadapt run directory"):
        cli.main(["report", str(tmp_path)])
    with pytest.raises(SystemExit, match="holds no model.keras"):
        cli.main(["predict", str(tmp_path), "--data", "digits"])
