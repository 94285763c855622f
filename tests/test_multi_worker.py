"""Multi-worker `fit`, `evaluate` and `predict` of kadapt's models under
`tf.distribute.MultiWorkerMirroredStrategy`, and its adaptive parts across workers (out of memory
on one worker recovered by all, the MetaAdjuster's decisions taken from the chief): real worker
processes on 127.0.0.1 (tests/multi_worker_job.py, one job), against one process training the
whole batch with plain Keras (the oracle)."""

import json
import socket

import numpy as np
import pytest

import kadapt
import multi_worker_oracle as oracle

# Bound on how long a worker may take to notice that its peer is gone, write the error and exit.
LOST_PEER_SECONDS = oracle.LOST_PEER_SECONDS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The job on two workers, worker 1 killed once it is done: its output directory, and worker
    0's exit code and the seconds it took to end after the kill."""
    output = tmp_path_factory.mktemp("two-workers")
    code, waited = oracle.run_workers_until_one_is_killed(output, LOST_PEER_SECONDS)
    return output, code, waited


@pytest.fixture(scope="module")
def two_workers(cluster):
    return cluster[0]


@pytest.fixture(scope="module")
def single_process():
    return oracle.plain_keras_run(oracle.EXACTNESS_EPOCHS)


@pytest.fixture(scope="module")
def three_epochs():
    return oracle.plain_keras_run(oracle.EPOCHS)


@pytest.mark.parametrize("kind", ["accumulate", "accumulating_model"])
def test_two_workers_train_as_one_process_with_whole_batches(kind, single_process, two_workers):
    results = [np.load(two_workers / f"{kind}-worker-{index}.npz") for index in range(2)]
    expected = single_process
    for result in results:
        # One step per logical batch across workers.
        assert int(result["iterations"]) == oracle.EXACTNESS_EPOCHS * oracle.STEPS_PER_EPOCH
        for got, want in zip(oracle.saved_weights(result), expected["weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        history = json.loads(str(result["history"]))
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            np.testing.assert_allclose(history[key], expected["history"][key], rtol=1e-5)
        np.testing.assert_allclose(result["evaluation"], expected["evaluation"], rtol=1e-5)
        np.testing.assert_allclose(result["predictions"], expected["predictions"], rtol=1e-5, atol=1e-6)
    for got, other in zip(oracle.saved_weights(results[0]), oracle.saved_weights(results[1]), strict=True):
        np.testing.assert_array_equal(got, other)  # every worker holds the same weights


def test_the_noise_scale_counts_every_workers_micro_batches(two_workers):
    # One process with micro-batches of 4 sees the same micro-batches as two workers with 8 rows each.
    x, y = oracle.data()
    model = kadapt.accumulate(oracle.network(), micro_batch_size=oracle.NOISE_MICRO, measure_noise=True)
    oracle.compile_model(model, oracle.NOISE_EPOCHS)
    model.fit(oracle.training_batches(x, y), epochs=oracle.NOISE_EPOCHS, verbose=0)
    expected = oracle.noise_statistics(model)
    assert expected[3] > 0 and expected[0] != 0  # steps were measured (the estimate itself may be negative)
    for index in range(2):
        np.testing.assert_allclose(np.load(two_workers / f"noise-worker-{index}.npy"), expected, rtol=1e-4)


def test_out_of_memory_on_one_worker_is_retried_by_all_and_stays_exact(three_epochs, two_workers):
    # Worker 1 alone runs out of memory (a real allocation of 256 GiB) on micro-batches above 2 rows.
    results = [np.load(two_workers / f"oom-worker-{index}.npz") for index in range(2)]
    for result in results:
        # Both shrank from 3 to 2 rows at step 0, the same logical batch retried: no step lost or doubled.
        assert json.loads(str(result["oom_events"])) == [[0, 3, 2]]
        assert int(result["micro_batch_size"]) == 2 and int(result["iterations"]) == oracle.STEPS
        for got, want in zip(oracle.saved_weights(result), three_epochs["weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(json.loads(str(result["history"]))["loss"], three_epochs["history"]["loss"],
                                   rtol=1e-5)


def test_every_worker_applies_the_chiefs_meta_adjustments(two_workers):
    # The chief's trigger fires and its meta-model cuts the rate x0.3; worker 1's trigger never
    # fires and its meta-model would raise it x3. Every worker must act as the chief decides.
    results = [np.load(two_workers / f"meta-worker-{index}.npz") for index in range(2)]
    decisions = [json.loads(str(result["decisions"])) for result in results]
    assert decisions[0] == decisions[1]
    assert len(decisions[0]) >= 2 and {action for _, _, action in decisions[0]} == {"lr x0.3"}
    chief, other = (oracle.saved_weights(result, extra=1) for result in results)
    for got, twin in zip(chief, other, strict=True):
        np.testing.assert_array_equal(got, twin)


def test_a_killed_worker_makes_the_other_exit_with_a_clear_error(cluster):
    # The cluster's workers train on after their checks until worker 1 is killed.
    output, code, waited = cluster
    assert code == 3 and waited < LOST_PEER_SECONDS
    error = (output / "worker-0.error").read_text()
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
