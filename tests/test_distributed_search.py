"""KerasTuner's distributed mode with real processes on 127.0.0.1: a chief
serving the gRPC oracle and 2 workers, for `kadapt meta train` and for an
`AccumulatingHyperModel` search; the settings it refuses, in-process.

The chief starts first and the workers once it listens, so both workers
connect at once and have trials to run. The two searches run one after the
other in the same three processes (tests/distributed_searches.py): each
process pays TensorFlow's import once. Every process has a deadline and is
killed when the searches end, also on failure."""

import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import postgres

import kadapt
from distributed_searches import MICRO_BATCH_SIZE
from distributed_searches import VALIDATION_SPLIT
from distributed_searches import data as accumulating_search_data
from kadapt import cli
from kadapt.meta import AdjustmentRecord
from kadapt.meta import RecordStore
from kadapt.meta import load_meta_model
from kadapt.meta import train_meta_model
from kadapt.meta.model.actions import ACTIONS
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import WINDOW
from kadapt.tuning import DistributedSearch
from kadapt.tuning import distributed_search

TIMEOUT_SECONDS = 240  # every process of both searches, start to exit
WORKERS = ("tuner0", "tuner1")
MAX_TRIALS = 3  # one worker runs 2 trials, the other 1
SCRIPT = Path(__file__).with_name("distributed_searches.py")
# Three processes share the cores with the other tests: one thread each spares them the contention.
ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"}


def free_ports(count):
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def run_search(command, port, logs):
    """Runs `command` as the chief, then, once it listens on `port`, as both
    workers; returns `{tuner_id: (returncode, output)}`."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    processes = {}
    try:
        processes["chief"] = _start(command, "chief", logs)
        _wait_until_listening(port, processes["chief"], deadline)
        for tuner_id in WORKERS:
            processes[tuner_id] = _start(command, tuner_id, logs)
        for tuner_id, process in processes.items():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{tuner_id} still ran after {TIMEOUT_SECONDS} s; its output: "
                            f"{(logs / f'{tuner_id}.log').read_text()[-3000:]}")
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return {tuner_id: (process.returncode, (logs / f"{tuner_id}.log").read_text())
            for tuner_id, process in processes.items()}


def _start(command, tuner_id, logs):
    env = {**os.environ, **ONE_THREAD, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONUNBUFFERED": "1", "KERASTUNER_TUNER_ID": tuner_id, "KERASTUNER_ORACLE_IP": "127.0.0.1"}
    logs.mkdir(exist_ok=True)
    with open(logs / f"{tuner_id}.log", "w") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_until_listening(port, chief, deadline):
    # A worker that finds the port closed retries after a growing gRPC
    # backoff, and the other worker may meanwhile take every trial.
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert chief.poll() is None, f"the chief exited with {chief.returncode} before serving"
        assert time.monotonic() < deadline, "the chief did not serve in time"
        time.sleep(0.2)


def meta_records(runs=40):
    rng = np.random.default_rng(0)
    records = []
    for index in range(runs):
        window = rng.normal(size=(WINDOW, len(FEATURE_NAMES)))
        best = 0 if window[-1, 0] > 0 else 4
        records += [AdjustmentRecord(run_id=f"r{index}", task=f"r{index}", family="ab"[index % 2],
                                     step=10, features=window, hyperparameters={},
                                     adjustment={"action": action, **ACTIONS[action]},
                                     outcome={"score": 0.0 if action == best else 1.0})
                    for action in (0, 2, 4)]
    return records


@pytest.fixture(scope="module")
def searches(tmp_path_factory, server):
    """Both searches' folder and `{tuner_id: (returncode, output)}` of their processes."""
    folder = tmp_path_factory.mktemp("distributed")
    url = postgres.create_database(*server, f"search_{os.getpid()}")  # every process reads the server
    with RecordStore(url) as store:
        store.append_many(meta_records())
    meta_port, port = free_ports(2)
    meta = ["meta", "train", "--store", url, "--output", str(folder / "meta" / "out" / "meta.keras"),
            "--max-trials", str(MAX_TRIALS), "--epochs", "1"]
    command = [sys.executable, str(SCRIPT), str(folder / "accumulating"), str(MAX_TRIALS),
               str(meta_port), str(port), *meta]
    return folder, run_search(command, meta_port, folder / "logs")


def completed_trials(project):
    trials = [json.loads(path.read_text()) for path in project.glob("trial_*/trial.json")]
    assert sorted(t["trial_id"] for t in trials) == [str(i) for i in range(MAX_TRIALS)]
    assert all(t["status"] == "COMPLETED" for t in trials)
    values = [json.dumps(t["hyperparameters"]["values"], sort_keys=True) for t in trials]
    assert len(set(values)) == MAX_TRIALS  # RandomSearch's oracle draws no set twice
    return trials


def test_meta_train_with_a_chief_and_two_workers(searches):
    folder, results = searches
    output = folder / "meta" / "out" / "meta.keras"
    assert all(code == 0 for code, _ in results.values()), results
    for tuner_id in WORKERS:
        assert f"worker {tuner_id}: its trials are done; the chief saves {output}" in results[tuner_id][1]
    assert f"saved {output}" in results["chief"][1]
    project = output.parent / "tuner" / "meta_model"
    trials = completed_trials(project)
    # KerasTuner writes a worker's `<tuner id>.json` when the worker ends a trial.
    assert all((project / f"{tuner_id}.json").is_file() for tuner_id in WORKERS)
    best = min(trials, key=lambda t: t["score"])
    report = json.loads(output.with_suffix(".json").read_text())
    assert report["hyperparameters"] == best["hyperparameters"]["values"]
    assert load_meta_model(output).output_shape == (None, len(ACTIONS))


def test_accumulating_hyper_model_search_with_a_chief_and_two_workers(searches):
    folder, results = searches
    directory = folder / "accumulating"
    assert all(code == 0 for code, _ in results.values()), results
    marks = [path.name.split(".") for path in (directory / "ran").iterdir()]
    assert collections.Counter(trial for trial, _ in marks) == {str(i): 1 for i in range(MAX_TRIALS)}
    assert {tuner for _, tuner in marks} == set(WORKERS)  # the chief runs no trial
    trials = completed_trials(directory / "batch_size")
    best = min(trials, key=lambda t: t["score"])
    model = kadapt.load_model(directory / "best.keras")
    x, y = accumulating_search_data()
    validation = slice(int(len(x) * (1 - VALIDATION_SPLIT)), None)  # Keras holds out the last rows
    assert model.micro_batch_size == MICRO_BATCH_SIZE
    assert model.evaluate(x[validation], y[validation], verbose=0) == pytest.approx(best["score"], rel=1e-5)


@pytest.mark.parametrize("environ, message", [
    ({"KERASTUNER_TUNER_ID": "tuner0"},
     r"needs KERASTUNER_TUNER_ID, KERASTUNER_ORACLE_IP, KERASTUNER_ORACLE_PORT all set and "
     r"non-empty\. Received: KERASTUNER_TUNER_ID='tuner0', KERASTUNER_ORACLE_IP not set, "
     r"KERASTUNER_ORACLE_PORT not set\. Set all three"),
    ({"KERASTUNER_TUNER_ID": "", "KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": "8000"},
     r"Received: KERASTUNER_TUNER_ID='', KERASTUNER_ORACLE_IP='127.0.0.1'"),
    ({"KERASTUNER_TUNER_ID": "chief", "KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": "http"},
     r"`KERASTUNER_ORACLE_PORT` must be an int port in 1-65535\. Received: KERASTUNER_ORACLE_PORT='http'\. "
     r"Set it to a free port"),
    ({"KERASTUNER_TUNER_ID": "chief", "KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": "0"},
     r"Received: KERASTUNER_ORACLE_PORT='0'"),
])
def test_incomplete_or_bad_settings_are_refused(environ, message):
    with pytest.raises(ValueError, match=message):
        distributed_search(environ)


def test_the_chief_is_the_tuner_whose_id_contains_chief():
    environ = {"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": "8000"}
    assert distributed_search({}) is None
    assert distributed_search({**environ, "KERASTUNER_TUNER_ID": "chief"}) == DistributedSearch(
        "chief", "127.0.0.1", 8000)
    assert distributed_search({**environ, "KERASTUNER_TUNER_ID": "chief"}).is_chief
    assert not distributed_search({**environ, "KERASTUNER_TUNER_ID": "tuner1"}).is_chief


def test_meta_train_refuses_a_bad_port_before_reading_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "tuner0")
    monkeypatch.setenv("KERASTUNER_ORACLE_IP", "127.0.0.1")
    monkeypatch.setenv("KERASTUNER_ORACLE_PORT", "80x")
    with pytest.raises(ValueError, match="Received: KERASTUNER_ORACLE_PORT='80x'"):
        train_meta_model(meta_records(2), tmp_path / "tuner")
    store = tmp_path / "records.sqlite"
    with pytest.raises(SystemExit, match=r"^kadapt: error: Environment variable `KERASTUNER_ORACLE_PORT`"):
        cli.main(["meta", "train", "--store", str(store), "--output", str(tmp_path / "m.keras")])
    assert not store.exists() and not (tmp_path / "tuner").exists()
