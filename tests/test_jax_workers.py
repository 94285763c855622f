"""`kadapt train --workers 2` on JAX: two local processes (`jax.distributed`, gloo on 127.0.0.1)
through the TensorFlow path's launcher; one killed mid-run ends the other with a clear error,
and `--resume` trains the same model as the command in one process, uninterrupted (issue 45
items 2 and 3)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kadapt import jax_processes

pytestmark = pytest.mark.backends("jax")

EPOCHS = 4
# Both processes load TensorFlow, JAX and Keras, join, probe and train; on 2 shared cores.
JOB_SECONDS = 240
# After the kill: the survivor's next collective fails at once ("Connection closed by peer"), or JAX's
# coordination service misses the heartbeat; the launcher then stops what is left after its grace.
END_SECONDS = jax_processes.HEARTBEAT_TIMEOUT_SECONDS + 60
TRAIN = ["train", "--data", "digits", "--model", "mlp", "--train-rows", "300", "--batch-size", "16", "--meta", "off",
         "--epochs", str(EPOCHS), "--fit-verbose", "2"]


def _is_process(index):
    """Whether a process's environment variables name it JAX process `index`."""
    wanted = f"{jax_processes.PROCESS_ID}={index}".encode()
    return lambda variables: wanted in variables


def test_kadapt_train_on_two_jax_processes_resumes_after_a_killed_one_and_trains_as_one_process(tmp_path, monkeypatch):
    from helpers import assert_trained_alike
    from helpers import epochs_done
    from helpers import kill_child_after_first_epoch

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environment = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(scratch),
                   "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "kadapt.cli", *TRAIN, "--out", "runs/two", "--workers", "2"]
    run = tmp_path / "runs" / "two"
    launcher = subprocess.Popen(command, cwd=tmp_path, env=environment, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        killed = kill_child_after_first_epoch(launcher, run, _is_process(1), JOB_SECONDS)
        stdout, stderr = launcher.communicate(timeout=END_SECONDS)
        ended = time.monotonic() - killed
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    output = stdout + stderr
    assert launcher.returncode != 0 and ended < END_SECONDS, output[-3000:]
    assert ("kadapt: error: worker 0 of 2: a peer process stopped answering mid-run" in output
            and "continue from the last checkpoint with `kadapt train --resume --workers 2 --out runs/two`" in output
            or "JAX distributed service detected fatal errors" in output), output[-3000:]
    assert "kadapt: worker 1 exited with code -9" in output
    assert 1 <= len(epochs_done(run)) < EPOCHS
    # Both processes again with --resume: they continue from the chief's checkpoint.
    resumed = subprocess.run([*command[:command.index("train") + 1], "--resume", "--out", "runs/two", "--workers", "2"],
                             cwd=tmp_path, env=environment, text=True, capture_output=True, timeout=JOB_SECONDS)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "starting 2 workers on 127.0.0.1 port" in resumed.stdout
    assert "resuming with the probed micro-batch" in resumed.stdout
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "completed" and record["steps_completed"] == 17 * EPOCHS  # 270 rows, batch 16
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["two"]  # the chief's directory only
    others = [p for p in scratch.iterdir() if p.name.startswith("kadapt-worker-1-")]
    assert len(others) == 2 and all((p / "run.json").is_file() for p in others)  # process 1 wrote to scratch
    # The same run in one process, uninterrupted (the plain command, in-process), trains the same model.
    from kadapt import cli

    one = tmp_path / "runs" / "one"
    monkeypatch.chdir(tmp_path)
    assert cli.main([*TRAIN, "--out", str(one)]) == 0
    assert_trained_alike(run, one, atol=1e-5)
    scores = [json.loads((path / "run.json").read_text()) for path in (run, one)]
    np.testing.assert_allclose(scores[0]["test_loss"], scores[1]["test_loss"], rtol=1e-5)


def _member(count=2):
    from kadapt.run.jax_workers import JaxProcess

    return JaxProcess(jax_processes.ProcessGroup(0, count, "127.0.0.1:1"))  # not joined: only checks run


def test_a_global_batch_that_does_not_split_over_the_processes_names_the_fix(tmp_path):
    from kadapt.run import pipeline
    from kadapt.run.errors import UsageError

    with pytest.raises(UsageError, match=r"^--batch-size 15 is the global batch of 2 workers: use a multiple of 2, "
                                         r"e.g. 14.$"):
        pipeline.start_run({"data": "digits", "model": "mlp", "batch_size": 15}, str(tmp_path / "run"),
                           member=_member())
    assert not (tmp_path / "run").exists()


def test_a_last_batch_that_does_not_split_over_the_processes_names_the_rows_that_do(tmp_path):
    from kadapt.run import pipeline
    from kadapt.run.errors import UsageError

    # 301 rows, the last 30 for validation: 271 training rows, a last batch of 15 at 16 a batch.
    with pytest.raises(UsageError, match=r"^--workers 2 feeds each worker an equal part of every batch, and the 271 "
                                         r"training rows leave a last batch of 15 rows at --batch-size 16, not a "
                                         r"multiple of 2: make the training rows a multiple of 2, e.g. with "
                                         r"--train-rows 300 \(the rows before --validation-split 0.1\).$"):
        pipeline.start_run({"data": "digits", "model": "mlp", "batch_size": 16, "train_rows": 301},
                           str(tmp_path / "run"), member=_member())
    assert not (tmp_path / "run").exists()


def test_workers_on_a_backend_without_a_multi_process_path_name_the_two_that_have_one(tmp_path, monkeypatch):
    from kadapt import cli

    monkeypatch.setenv("KERAS_BACKEND", "torch")  # read by the launcher, which loads no backend
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "digits", "--workers", "2", "--out", str(tmp_path / "run")])
    assert str(raised.value) == (
        "kadapt: error: --workers runs on Keras' TensorFlow and JAX backends; its 'torch' backend has no "
        "multi-process path in kadapt: set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax. "
        "Received: --workers on KERAS_BACKEND=torch")
    assert not (tmp_path / "run").exists()


def test_each_process_feeds_its_part_of_every_augmented_batch_in_order():
    import tensorflow as tf

    from kadapt.recipes.training import process_share

    batches = tf.data.Dataset.range(10).batch(4).map(lambda x: (x, -x))  # batches of 4, 4 and 2 rows
    parts = [[x.tolist() for x, _ in process_share(batches, index, 2).as_numpy_iterator()] for index in (0, 1)]
    assert parts == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7], [9]]]
