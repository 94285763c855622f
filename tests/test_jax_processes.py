"""Two JAX processes on 127.0.0.1 (`kadapt.jax_processes`, gloo CPU collectives) train as one
process of plain Keras; a killed process ends the other within bounded time (issue 45 item 2)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from once_per_session import once_per_session

from kadapt import jax_processes
from kadapt.jax_processes import ProcessGroup

pytestmark = pytest.mark.backends("jax")

JOB = Path(__file__).with_name("jax_processes_job.py")
START_SECONDS = 150  # both processes load JAX and Keras, join and train one epoch
# The survivor's collective fails at once ("Connection closed by peer"); JAX's shutdown barrier then
# waits for the lost heartbeat. Time to notice, write the error and exit on a loaded machine.
END_SECONDS = jax_processes.HEARTBEAT_TIMEOUT_SECONDS + 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return once_per_session(tmp_path_factory, "jax-processes", lambda: _run_cluster(tmp_path_factory),
                            START_SECONDS + END_SECONDS + 30)


def _run_cluster(tmp_path_factory):
    """Starts the job in 2 processes, kills process 1 after the first epoch; returns the chief's
    result, its exit code, the seconds it took to end after the kill and its output's tail."""
    out = tmp_path_factory.mktemp("jax-processes")
    variables = {**os.environ, "PYTHONPATH": os.pathsep.join([str(JOB.parent.parent), os.environ.get("PYTHONPATH", "")]),
                 jax_processes.ADDRESSES: f"127.0.0.1:{_free_port()}", jax_processes.NUM_PROCESSES: "2"}
    processes = [subprocess.Popen([sys.executable, str(JOB), str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env={**variables, jax_processes.PROCESS_ID: str(index)})
                 for index in range(2)]
    try:
        deadline = time.monotonic() + START_SECONDS
        while not (out / "epoch-1-1").exists():
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                pytest.fail(f"no first epoch within {START_SECONDS} s:\n{processes[0].communicate(timeout=30)[0][-3000:]}")
            time.sleep(0.2)
        processes[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        output, _ = processes[0].communicate(timeout=END_SECONDS)
        waited = time.monotonic() - killed
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate()
    result = np.load(out / "result.npz")
    weights = [result[f"arr_{i}"].tolist() for i in range(len(result.files) - 3)]
    return {"weights": weights, "loss": float(result["loss"]), "iterations": int(result["iterations"]),
            "devices": int(result["devices"]), "code": processes[0].returncode, "waited": waited,
            "output": output[-6000:]}


def _free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_each_feeding_half_of_every_batch_train_as_one_process_of_plain_keras(cluster):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 5)).astype("float32"), rng.normal(size=(40, 3)).astype("float32")
    history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert cluster["devices"] == 2 and cluster["iterations"] == 3  # batches of 16, 16 and 8 rows
    for got, want in zip(cluster["weights"], model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cluster["loss"], history.history["loss"][0], rtol=1e-5)


def test_a_killed_process_ends_the_other_with_an_error_naming_the_lost_peer(cluster):
    assert cluster["code"] != 0 and cluster["waited"] < END_SECONDS
    assert "Connection closed by peer" in cluster["output"] or "Task 1 heartbeat timeout" in cluster["output"]


def test_process_rows_are_each_process_share_of_every_global_batch():
    rows = np.arange(10)
    assert process_rows_of(rows, 4, 2) == [[0, 1, 4, 5, 8], [2, 3, 6, 7, 9]]


def process_rows_of(rows, batch_size, count):
    return [jax_processes.process_rows(rows, batch_size, ProcessGroup(i, count, "127.0.0.1:1")).tolist()
            for i in range(count)]


def test_a_global_batch_or_last_batch_that_does_not_split_over_the_processes_is_a_value_error():
    group = ProcessGroup(0, 2, "127.0.0.1:1")
    with pytest.raises(ValueError, match=r"^Argument `batch_size` \(the global batch\) must be a multiple of the 2 "
                                         r"processes: use 4. Received: batch_size=5"):
        jax_processes.process_rows(np.arange(10), 5, group)
    with pytest.raises(ValueError, match=r"^The last batch has 1 rows, not a multiple of the 2 processes: drop 1"):
        jax_processes.process_rows(np.arange(9), 4, group)


def test_the_cluster_comes_from_keras_variables_and_is_checked_before_jax_starts():
    assert jax_processes.cluster_from_environment({}) is None
    variables = {jax_processes.ADDRESSES: "127.0.0.1:2222,127.0.0.1:2223", jax_processes.NUM_PROCESSES: "2",
                 jax_processes.PROCESS_ID: "1"}
    assert jax_processes.cluster_from_environment(variables) == ProcessGroup(1, 2, "127.0.0.1:2222")
    with pytest.raises(ValueError, match=r"must be in \[0, KERAS_DISTRIBUTION_NUM_PROCESSES\).*Received: "
                                         r"KERAS_DISTRIBUTION_PROCESS_ID=2, KERAS_DISTRIBUTION_NUM_PROCESSES=2"):
        jax_processes.cluster_from_environment({**variables, jax_processes.PROCESS_ID: "2"})
    with pytest.raises(ValueError, match=r"must start with the coordinator's host:port .* Received: "
                                         r"KERAS_DISTRIBUTION_JOB_ADDRESSES='localhost'"):
        jax_processes.cluster_from_environment({**variables, jax_processes.ADDRESSES: "localhost"})
    with pytest.raises(ValueError, match=r"must be an int. Received: KERAS_DISTRIBUTION_NUM_PROCESSES='two'"):
        jax_processes.cluster_from_environment({**variables, jax_processes.NUM_PROCESSES: "two"})
