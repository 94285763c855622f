"""`kadapt train --workers 2`: local worker processes on 127.0.0.1, only the chief writing; killed,
then resumed, the same model as the command in one process, uninterrupted."""

import json
import os
import subprocess
import sys

from multi_worker_oracle import JOB_TIMEOUT_SECONDS

EPOCHS = 4


def _is_worker(index):
    """Whether a process's environment variables name it worker `index` (its TF_CONFIG)."""

    def test(variables):
        config = next((v[len(b"TF_CONFIG="):] for v in variables if v.startswith(b"TF_CONFIG=")), None)
        return bool(config) and json.loads(config)["task"]["index"] == index

    return test


def test_kadapt_train_on_two_workers_resumes_after_a_killed_worker_and_trains_as_one_process(tmp_path, monkeypatch):
    from helpers import assert_trained_alike
    from helpers import epochs_done
    from helpers import kill_child_after_first_epoch
    from helpers import write_tiny_npz

    write_tiny_npz(tmp_path / "tiny.npz")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(scratch)}
    environment.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "kadapt.cli", "train", "--data", "tiny.npz", "--model", "mlp",
               "--batch-size", "16", "--memory-budget", "256MiB", "--meta", "off", "--epochs", str(EPOCHS),
               "--out", "runs/two", "--workers", "2"]
    run = tmp_path / "runs" / "two"
    # Worker 1 is killed once the first epoch is checkpointed; the chief then stops with a clear error.
    launcher = subprocess.Popen(command, cwd=tmp_path, env=environment, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        kill_child_after_first_epoch(launcher, run, _is_worker(1), JOB_TIMEOUT_SECONDS)
        stdout, stderr = launcher.communicate(timeout=JOB_TIMEOUT_SECONDS)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0 and "stopped answering mid-run" in stdout + stderr, stderr[-3000:]
    assert 1 <= len(epochs_done(run)) < EPOCHS
    # Restarting both workers with --resume continues from the checkpoint.
    result = subprocess.run([*command[:command.index("--data")], "--resume", "--out", "runs/two", "--workers", "2"],
                            cwd=tmp_path, env=environment, text=True, capture_output=True,
                            timeout=JOB_TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "starting 2 workers on 127.0.0.1" in result.stdout
    assert "resuming with the probed micro-batch" in result.stdout
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "completed" and record["steps_completed"] == 4 * EPOCHS  # 58 rows, global batch 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tiny.npz", "tmp"]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["two"]  # the chief's directory only
    workers = [p for p in scratch.iterdir() if p.name.startswith("kadapt-worker-1-")]
    assert len(workers) == 2 and all((w / "run.json").is_file() for w in workers)  # worker 1 wrote to scratch
    worker = max(workers, key=lambda p: p.stat().st_mtime)
    probe = json.loads((run / "probe.json").read_text())
    assert probe["micro_batch_size"] == json.loads((worker / "probe.json").read_text())["micro_batch_size"] <= 8
    # The same run in one process, uninterrupted (the plain command, in-process), trains the same model.
    from kadapt import cli

    one = tmp_path / "runs" / "one"
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *command[command.index("--data"):command.index("--out")], "--out", str(one)]) == 0
    assert_trained_alike(run, one, atol=1e-6)
