"""Multi-worker `fit`, `evaluate` and `predict` of kadapt's models under
`tf.distribute.MultiWorkerMirroredStrategy`: real worker processes on 127.0.0.1,
against one process training the whole batch with plain Keras (the oracle)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import multi_worker_oracle as oracle
import postgres

JOB = Path(__file__).with_name("multi_worker_job.py")
JOB_TIMEOUT_SECONDS = 240


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
    return [np.load(Path(output) / f"worker-{index}.npz") for index in range(count)]


@pytest.fixture(scope="module")
def single_process():
    """Plain Keras, one process, whole batches: weights, history, evaluation, predictions."""
    x, y = oracle.data()
    model = oracle.compile_model(oracle.network())
    history = model.fit(x, y, batch_size=oracle.BATCH, epochs=oracle.EPOCHS, shuffle=False,
                        validation_data=(x, y), verbose=0)
    return {"weights": model.get_weights(), "history": history.history,
            "evaluation": np.array(model.evaluate(x, y, batch_size=oracle.BATCH, verbose=0)),
            "predictions": model.predict(x, batch_size=oracle.BATCH, verbose=0)}


def _weights(result):
    return [result[f"arr_{index}"] for index in range(len(result.files) - 4)]


@pytest.mark.parametrize("scenario", ["accumulate", "accumulating_model"])
def test_two_workers_train_as_one_process_with_whole_batches(scenario, single_process, tmp_path):
    results = run_workers(2, tmp_path, scenario)
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
