"""The training problem of tests/test_multi_worker.py, shared by the workers and the oracle:
71 rows (the last batch of 16 has 7, split 4/3 over two workers; micro-batches of 3 leave
ragged tails), reshuffled every epoch (seeded), SGD with momentum and a cosine schedule counted
in logical steps."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import postgres

import kadapt

ROWS, BATCH, MICRO, EPOCHS = 71, 16, 3, 3
NOISE_MICRO = 4  # each worker's 8 rows as 2 micro-batches: the same micro-batches as one process's 16 in 4
STEPS_PER_EPOCH = -(-ROWS // BATCH)
STEPS = EPOCHS * STEPS_PER_EPOCH
# The exactness job's: a second epoch, in a new order, is what shows the reshuffling; the noise
# scale's statistics are compared after any number of steps.
EXACTNESS_EPOCHS, NOISE_EPOCHS = 2, 1


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, 5)).astype("float32"), rng.integers(0, 3, ROWS).astype("int32")


def training_batches(x, y):
    """Batches in a new seeded order every epoch: the first epoch must see the first order (a
    batch drawn before training, e.g. to build the model, would shift every epoch by one)."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.shuffle(ROWS, seed=0, reshuffle_each_iteration=True).batch(BATCH)


def network():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


def compile_model(model, epochs=EPOCHS):
    schedule = kadapt.CosineAnnealing(lr_max=0.2, lr_min=0.01, total_steps=epochs * STEPS_PER_EPOCH)
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def noise_statistics(model):
    """The noise scale's averages (trace, |G|^2, their square, the weights' sums), its result and error."""
    noise = model.noise_scale
    values = [*noise.variables, noise.result(), noise.squared_norm_error()]
    return np.array([float(keras.ops.convert_to_numpy(value)) for value in values])


JOB = Path(__file__).with_name("multi_worker_job.py")
# Many processes share the 2 cores during `make test`: one thread each spares them the contention.
ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"}
JOB_TIMEOUT_SECONDS = 300  # bound on one whole multi-worker job
COLLECTIVE_TIMEOUT_SECONDS = 200  # a collective may wait this long for a slow peer
# A killed peer is noticed by TensorFlow's coordination service within ~10 s of its last heartbeat
# (measured: ~10 s after the kill in `kadapt train --workers 2`); the bound leaves a loaded machine room.
LOST_PEER_SECONDS = 120


def run_workers_until_one_is_killed(output, lost_peer_seconds):
    """Runs 2 workers; once worker 0 marks `worker-0.started`, kills worker 1 and waits at most
    `lost_peer_seconds` for worker 0 to end: its exit code and the seconds it took."""
    with _workers(2, output) as processes:
        started, deadline = Path(output) / "worker-0.started", time.monotonic() + JOB_TIMEOUT_SECONDS
        while not started.exists() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in processes), "a worker ended early\n" + _logs(output, 2)
            time.sleep(0.1)
        processes[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        code = processes[0].wait(timeout=lost_peer_seconds)
        return code, time.monotonic() - killed_at


@contextlib.contextmanager
def _workers(count, output):
    """`count` workers of multi_worker_job.py on free 127.0.0.1 ports, logging to `output`; all ended on exit."""
    ports = ",".join(str(postgres.free_port()) for _ in range(count))
    environment = {**os.environ, **ONE_THREAD, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    environment.pop("TF_CONFIG", None)
    logs = [open(Path(output) / f"worker-{index}.log", "w") for index in range(count)]
    processes = [subprocess.Popen([sys.executable, str(JOB), str(index), ports, str(output)],
                                  env=environment, stdout=log, stderr=subprocess.STDOUT)
                 for index, log in enumerate(logs)]
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for log in logs:
            log.close()


def _logs(output, count):
    return "\n".join((Path(output) / f"worker-{i}.log").read_text()[-3000:] for i in range(count))


def plain_keras_run(epochs=EPOCHS):
    """Plain Keras, one process, whole batches: weights, history, evaluation, predictions."""
    x, y = data()
    model = compile_model(network(), epochs)
    history = model.fit(training_batches(x, y), epochs=epochs, validation_data=(x, y),
                        validation_batch_size=BATCH, shuffle=False, verbose=0)
    return {"weights": model.get_weights(), "history": history.history,
            "evaluation": np.array(model.evaluate(x, y, batch_size=BATCH, verbose=0)),
            "predictions": model.predict(x, batch_size=BATCH, verbose=0)}


def saved_weights(result, extra=4):
    """The weights a job saved as arr_0, arr_1, ... beside `extra` named entries."""
    return [result[f"arr_{index}"] for index in range(len(result.files) - extra)]
