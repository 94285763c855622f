"""One run owns its run directory (`kadapt.run.run_lock`), and every file is written whole
(`whole_file`): the refusals and the readers' notices, in-process, a lock held by this test
(a lock belongs to an open file: this process's second one is refused as another process's).
tests/test_run_processes.py drives the same with real `kadapt train` processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types

import keras
import numpy as np
import pytest

from kadapt import cli
from kadapt.run.run_directory import RunDirectory
from kadapt.run.run_lock import LOCK
from kadapt.run.run_lock import RunLock
from kadapt.run.workers import launch_local_workers

OPTIONS = {"data": "digits", "model": "mlp", "epochs": 2, "meta": "off"}
# A worker of `launch_local_workers`: takes the run directory ARGV[1] as `kadapt train`'s chief does.
TAKE = """
import sys
from kadapt.run.run_directory import RunDirectory
from kadapt.run.errors import UsageError
try:
    RunDirectory(sys.argv[1]).claim()
except UsageError as error:
    sys.exit(f"refused: {error}")
"""


def in_use(out, pid=None):
    return (f"kadapt: error: --out {out} is in use: process {pid or os.getpid()} is training a run in it (it holds "
            f"{out}/{LOCK}). Wait for it to end, or pick another --out.")


def write_run(folder, status):
    """A run directory as `kadapt train` leaves it at `status`, before any epoch."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"options": OPTIONS, "resolved": {}}))
    (folder / "run.json").write_text(json.dumps({"status": status}))
    return folder


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]])
def test_a_run_directory_in_use_is_refused_naming_the_process_that_holds_it(flags, tmp_path):
    run = write_run(tmp_path / "run", "training")
    lock = RunLock.acquire(run)
    before = sorted((path.name, path.stat().st_mtime_ns) for path in run.iterdir())
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "digits", "--model", "mlp", "--out", str(run), *flags])
    assert str(raised.value) == in_use(run)
    assert sorted((path.name, path.stat().st_mtime_ns) for path in run.iterdir()) == before  # untouched
    lock.release()


def test_kadapt_train_with_workers_is_refused_before_any_worker_starts(tmp_path):
    run = write_run(tmp_path / "run", "training")
    lock = RunLock.acquire(run)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--workers", "2", "--data", "digits", "--out", str(run), "--resume"])
    assert str(raised.value) == in_use(run)
    lock.release()


def test_the_lock_of_a_killed_run_is_gone_with_it(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom kadapt.run.run_lock import RunLock\n"
                               "lock = RunLock.acquire(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(60)", str(run)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert RunLock.holder(run) == holder.pid
        with pytest.raises(SystemExit, match=f"is in use: process {holder.pid} is training"):
            cli.main(["train", "--data", "digits", "--out", str(run)])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert RunLock.holder(run) is None
    RunDirectory(run).claim()[0].release()  # taken at once: no stale lock


def test_the_workers_of_one_run_share_its_lock_and_another_process_is_refused(tmp_path, monkeypatch):
    class LocalProcesses:  # a cluster of plain processes: no backend, no GPU listing
        gpu_count = staticmethod(lambda: 0)

        def __init__(self, count):
            self.count = count

        def variables(self, index):
            return {}

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the launcher's folder of worker logs
    run = tmp_path / "run"
    lock, _ = RunDirectory(run).claim()
    command = [sys.executable, "-c", TAKE]
    assert launch_local_workers(2, [str(run)], echo=lambda line: None, setup=LocalProcesses, command=command,
                                lock=lock) == 0
    outsider = subprocess.run([*command, str(run)], capture_output=True, text=True, timeout=60)
    assert outsider.stderr.strip() == f"refused: {in_use(run, os.getpid())[len('kadapt: error: '):]}"
    lock.release()


def test_overwrite_empties_the_directory_but_keeps_its_lock(tmp_path):
    run = write_run(tmp_path / "run", "completed")
    (run / "steps.jsonl").write_text('{"step": 0}\n')
    directory = RunDirectory(run)
    lock, replace = directory.claim(overwrite=True)
    locked = (run / LOCK).stat().st_ino
    directory.create(replace)
    assert [path.name for path in run.iterdir()] == [LOCK] and (run / LOCK).stat().st_ino == locked
    with pytest.raises(SystemExit, match="is in use"):
        cli.main(["train", "--data", "digits", "--out", str(run)])
    lock.release()


def test_a_directory_holding_only_a_dead_runs_lock_and_temporary_files_starts_afresh(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text("123\n")  # a run killed after it wrote its config, then half of run.json
    (run / "config.json").write_text("{}")
    (run / ".kadapt-tmp.123.run.json").write_text('{"sta')
    directory = RunDirectory(run)
    lock, replace = directory.claim()
    directory.create(replace)
    assert [path.name for path in run.iterdir()] == [LOCK]
    lock.release()


def test_a_refused_run_leaves_no_directory_behind(tmp_path):
    with pytest.raises(SystemExit, match="--model must be one of"):
        cli.main(["train", "--data", "digits", "--model", "no_such_net", "--out", str(tmp_path / "runs" / "a")])
    assert list(tmp_path.iterdir()) == []


def test_an_out_on_a_read_only_file_system_ends_in_one_line(tmp_path, monkeypatch):
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_flag=real(path).f_flag | os.ST_RDONLY))
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "digits", "--model", "mlp", "--out", str(tmp_path / "run")])
    assert str(raised.value) == (f"kadapt: error: --out {tmp_path / 'run'} cannot be written: {tmp_path} is on a "
                                 "read-only file system. Pick another --out.")
    assert list(tmp_path.iterdir()) == []


def test_an_out_on_a_full_file_system_ends_in_one_line_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(free=2**19))
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "digits", "--model", "mlp", "--train-rows", "64", "--out", str(tmp_path / "run")])
    weights = 64 * 128 + 128 + 128 * 10 + 10  # digits' 64 pixels -> the mlp's 128 units -> 10 classes
    assert str(raised.value) == (
        f"kadapt: error: --out {tmp_path / 'run'} is on a file system with 0.5 MiB free, and the run writes about "
        f"{(9 * 4 * weights + 2**20) / 2**20:.1f} MiB (model.keras, checkpoints, logs): free some space, or pick "
        "another --out.")
    assert list(tmp_path.iterdir()) == []


def test_report_on_a_run_in_progress_says_so_first(tmp_path, capsys):
    run = write_run(tmp_path / "run", "training")
    lock = RunLock.acquire(run)
    assert cli.main(["report", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"run in progress: process {os.getpid()} is still training {run}; what it has written so far:"
    assert lines[2].split(None, 1) == ["status", "training"]
    lock.release()


def test_report_on_a_run_killed_mid_run_says_that_it_ended_without_a_record(tmp_path, capsys):
    run = write_run(tmp_path / "run", "training")
    assert cli.main(["report", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"status           training when its process ended without a record (killed?): "
                        f"`kadapt train --resume --out {run}` continues it")


def test_predict_on_a_run_in_progress_without_a_model_says_there_is_none_yet(tmp_path):
    run = write_run(tmp_path / "run", "training")
    lock = RunLock.acquire(run)
    with pytest.raises(SystemExit) as raised:
        cli.main(["predict", str(run), "--data", "digits"])
    assert str(raised.value) == (f"kadapt: error: run in progress: process {os.getpid()} is still training {run}, "
                                 "and it holds no model.keras yet: the run saves it when it finishes.")
    lock.release()


def test_predict_on_a_run_in_progress_uses_its_last_whole_model(tmp_path, capsys):
    run = write_run(tmp_path / "run", "training")
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).save(run / "model.keras")
    np.save(tmp_path / "x.npy", np.ones((5, 3), "float32"))
    lock = RunLock.acquire(run)
    assert cli.main(["predict", str(run), "--data", str(tmp_path / "x.npy")]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == (f"run in progress: process {os.getpid()} is still training {run}; predicting "
                                   "with its last whole model.keras")
    assert out.startswith(f"predicted 5 rows of {tmp_path / 'x.npy'}")
    lock.release()
