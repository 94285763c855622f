"""`kadapt train --workers 2`: local worker processes on 127.0.0.1, only the chief writing, and the
same model as the command in one process."""

import json
import os
import subprocess
import sys

import numpy as np

from multi_worker_oracle import JOB_TIMEOUT_SECONDS


def test_kadapt_train_on_two_workers_writes_only_from_the_chief_and_trains_as_one_process(tmp_path, monkeypatch):
    from helpers import write_tiny_npz

    write_tiny_npz(tmp_path / "tiny.npz")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(scratch)}
    environment.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "kadapt.cli", "train", "--data", "tiny.npz", "--model", "small_cnn",
               "--batch-size", "16", "--memory-budget", "256MiB", "--meta", "off", "--epochs", "2",
               "--out", "runs/two", "--workers", "2"]
    result = subprocess.run(command, cwd=tmp_path, env=environment, text=True, capture_output=True,
                            timeout=JOB_TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "starting 2 workers on 127.0.0.1" in result.stdout
    assert "the smallest that fits on every one of the 2 workers" in result.stdout
    run = tmp_path / "runs" / "two"
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "completed" and record["steps_completed"] == 8  # 58 rows, global batch 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tiny.npz", "tmp"]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["two"]  # the chief's directory only
    (worker,) = [p for p in scratch.iterdir() if p.name.startswith("kadapt-worker-1-")]
    assert (worker / "run.json").is_file()  # worker 1 wrote its files into its scratch directory
    probe = json.loads((run / "probe.json").read_text())
    assert probe["micro_batch_size"] == json.loads((worker / "probe.json").read_text())["micro_batch_size"] <= 8
    # The same run in one process (the plain command, in-process) trains the same model.
    from kadapt import cli
    from kadapt import load_model

    one = tmp_path / "runs" / "one"
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *command[command.index("--data"):command.index("--out")], "--out", str(one)]) == 0
    histories = [json.loads((path / "history.json").read_text()) for path in (run, one)]
    for key in ("loss", "val_loss", "accuracy"):
        np.testing.assert_allclose(histories[0][key], histories[1][key], rtol=1e-5)
    weights = [load_model(path / "model.keras").get_weights() for path in (run, one)]
    for got, want in zip(*weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
