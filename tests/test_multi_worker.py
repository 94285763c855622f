"""Multi-worker `fit`, `evaluate` and `predict` of kadapt's models under
`tf.distribute.MultiWorkerMirroredStrategy`: real worker processes on 127.0.0.1,
against one process training the whole batch with plain Keras (the oracle)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kadapt
import multi_worker_oracle as oracle
import postgres

JOB = Path(__file__).with_name("multi_worker_job.py")
JOB_TIMEOUT_SECONDS = 240
LOST_PEER_SECONDS = 90  # bound on how long a worker may take to notice that its peer is gone


def run_workers(count, output, *arguments):
    """Runs `count` workers of multi_worker_job.py on free 127.0.0.1 ports; ends them all."""
    ports = ",".join(str(postgres.free_port()) for _ in range(count))
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    environment.pop("TF_CONFIG", None)
    logs = [open(Path(output) / f"worker-{index}.log", "w") for index in range(count)]
    processes = [subprocess.Popen([sys.executable, str(JOB), str(index), ports, str(output), *arguments],
                                  env=environment, stdout=log, stderr=subprocess.STDOUT)
                 for index, log in enumerate(logs)]
    try:
        for process in processes:
            process.wait(timeout=JOB_TIMEOUT_SECONDS)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
    codes = [process.returncode for process in processes]
    assert codes == [0] * count, "\n".join((Path(output) / f"worker-{i}.log").read_text()[-3000:] for i in range(count))


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """The "exactness" job on two workers: its output directory."""
    output = tmp_path_factory.mktemp("two-workers")
    run_workers(2, output, "exactness")
    return output


@pytest.fixture(scope="module")
def single_process():
    """Plain Keras, one process, whole batches: weights, history, evaluation, predictions."""
    x, y = oracle.data()
    model = oracle.compile_model(oracle.network())
    history = model.fit(oracle.training_batches(x, y), epochs=oracle.EPOCHS, validation_data=(x, y),
                        validation_batch_size=oracle.BATCH, shuffle=False, verbose=0)
    return {"weights": model.get_weights(), "history": history.history,
            "evaluation": np.array(model.evaluate(x, y, batch_size=oracle.BATCH, verbose=0)),
            "predictions": model.predict(x, batch_size=oracle.BATCH, verbose=0)}


def _weights(result, extra=4):
    """The weights saved as arr_0, arr_1, ... beside `extra` named entries."""
    return [result[f"arr_{index}"] for index in range(len(result.files) - extra)]


@pytest.mark.parametrize("kind", ["accumulate", "accumulating_model"])
def test_two_workers_train_as_one_process_with_whole_batches(kind, single_process, two_workers):
    results = [np.load(two_workers / f"{kind}-worker-{index}.npz") for index in range(2)]
    expected = single_process
    for result in results:
        assert int(result["iterations"]) == oracle.STEPS  # one step per logical batch across workers
        for got, want in zip(_weights(result), expected["weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        history = json.loads(str(result["history"]))
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            np.testing.assert_allclose(history[key], expected["history"][key], rtol=1e-5)
        np.testing.assert_allclose(result["evaluation"], expected["evaluation"], rtol=1e-5)
        np.testing.assert_allclose(result["predictions"], expected["predictions"], rtol=1e-5, atol=1e-6)
    for got, other in zip(_weights(results[0]), _weights(results[1]), strict=True):
        np.testing.assert_array_equal(got, other)  # every worker holds the same weights


@pytest.fixture(scope="module")
def adaptive_workers(tmp_path_factory):
    """The "oom" job on two workers (out of memory on one, then a MetaAdjuster): its output directory."""
    output = tmp_path_factory.mktemp("adaptive-workers")
    run_workers(2, output, "oom")
    return output


def test_out_of_memory_on_one_worker_is_retried_by_all_and_stays_exact(single_process, adaptive_workers):
    # Worker 1 alone runs out of memory (a real allocation of 256 GiB) on micro-batches above 2 rows.
    results = [np.load(adaptive_workers / f"oom-worker-{index}.npz") for index in range(2)]
    for result in results:
        # Both shrank from 3 to 2 rows at step 0, the same logical batch retried: no step lost or doubled.
        assert json.loads(str(result["oom_events"])) == [[0, 3, 2]]
        assert int(result["micro_batch_size"]) == 2 and int(result["iterations"]) == oracle.STEPS
        for got, want in zip(_weights(result), single_process["weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(json.loads(str(result["history"]))["loss"], single_process["history"]["loss"],
                                   rtol=1e-5)


def test_every_worker_applies_the_chiefs_meta_adjustments(adaptive_workers):
    # The chief's trigger fires and its meta-model cuts the rate x0.3; worker 1's trigger never
    # fires and its meta-model would raise it x3. Every worker must act as the chief decides.
    results = [np.load(adaptive_workers / f"meta-worker-{index}.npz") for index in range(2)]
    decisions = [json.loads(str(result["decisions"])) for result in results]
    assert decisions[0] == decisions[1]
    assert len(decisions[0]) >= 2 and {action for _, _, action in decisions[0]} == {"lr x0.3"}
    for got, other in zip(_weights(results[0], extra=1), _weights(results[1], extra=1), strict=True):
        np.testing.assert_array_equal(got, other)


def test_the_noise_scale_counts_every_workers_micro_batches(two_workers):
    # One process with micro-batches of 4 sees the same micro-batches as two workers with 8 rows each.
    x, y = oracle.data()
    model = kadapt.accumulate(oracle.network(), micro_batch_size=oracle.NOISE_MICRO, measure_noise=True)
    oracle.compile_model(model)
    model.fit(oracle.training_batches(x, y), epochs=oracle.EPOCHS, verbose=0)
    expected = oracle.noise_statistics(model)
    assert expected[3] > 0 and expected[0] != 0  # steps were measured (the estimate itself may be negative)
    for index in range(2):
        np.testing.assert_allclose(np.load(two_workers / f"noise-worker-{index}.npy"), expected, rtol=1e-4)


def test_a_killed_worker_makes_the_other_exit_with_a_clear_error(tmp_path):
    ports = ",".join(str(postgres.free_port()) for _ in range(2))
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    processes = [subprocess.Popen([sys.executable, str(JOB), str(index), ports, str(tmp_path), "killed"],
                                  env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for index in range(2)]
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
        while not (tmp_path / "worker-0.started").exists() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in processes), "a worker ended before training"
            time.sleep(0.1)
        processes[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        code = processes[0].wait(timeout=LOST_PEER_SECONDS)
        waited = time.monotonic() - killed_at
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    assert code == 3 and waited < LOST_PEER_SECONDS
    error = (tmp_path / "worker-0.error").read_text()
    assert error.startswith("WorkerLostError: A worker of the multi-worker job stopped answering mid-run")
    assert "restart all of them" in error and "\n" not in error


@pytest.mark.parametrize("config, message", [
    (None, "TF_CONFIG is not set"),
    ("{cluster", "TF_CONFIG is not JSON"),
    ('{"task": {"type": "worker", "index": 0}}', 'TF_CONFIG has no "cluster" object'),
    ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}', "has a job 'ps'"),
    ('{"cluster": {"worker": ["127.0.0.1"]}, "task": {"type": "worker", "index": 0}}', "has the address '127.0.0.1'"),
    ('{"cluster": {"worker": ["127.0.0.1:5", "127.0.0.1:5"]}, "task": {"type": "worker", "index": 0}}',
     "more than once"),
    ('{"cluster": {"worker": ["127.0.0.1:5"]}, "task": {"type": "chief", "index": 0}}', "task must name this process"),
    ('{"cluster": {"worker": ["127.0.0.1:5"]}, "task": {"type": "worker", "index": 1}}',
     "task index must be an int in [0, 1)"),
    ('{"cluster": {"worker": ["192.0.2.1:2222"]}, "task": {"type": "worker", "index": 0}}',
     "this host cannot listen there"),
])
def test_a_malformed_tf_config_is_refused_before_any_training(config, message, monkeypatch):
    from kadapt import distribute

    if config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", config)
    with pytest.raises(ValueError) as raised:
        distribute.multi_worker_strategy()
    assert message in str(raised.value)


def test_a_port_in_use_is_refused_naming_the_task(monkeypatch):
    from kadapt import distribute

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("TF_CONFIG", f'{{"cluster": {{"worker": ["127.0.0.1:{port}", "127.0.0.1:1"]}}, '
                                        '"task": {"type": "worker", "index": 0}}')
        with pytest.raises(ValueError, match=f"worker 0 at 127.0.0.1:{port}, but the port is in use"):
            distribute.multi_worker_strategy()


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
