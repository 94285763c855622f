"""The adaptive parts across workers of `tf.distribute.MultiWorkerMirroredStrategy`: out of memory
on one worker recovered by all, and the MetaAdjuster's decisions taken from the chief; real worker
processes on 127.0.0.1 (tests/multi_worker_job.py, scenario "oom"), against plain Keras in one process."""

import json

import numpy as np
import pytest

import multi_worker_oracle as oracle


@pytest.fixture(scope="module")
def single_process():
    return oracle.plain_keras_run()


@pytest.fixture(scope="module")
def adaptive_workers(tmp_path_factory):
    """The "oom" job on two workers (out of memory on one, then a MetaAdjuster): its output directory."""
    output = tmp_path_factory.mktemp("adaptive-workers")
    oracle.run_workers(2, output, "oom")
    return output


def test_out_of_memory_on_one_worker_is_retried_by_all_and_stays_exact(single_process, adaptive_workers):
    # Worker 1 alone runs out of memory (a real allocation of 256 GiB) on micro-batches above 2 rows.
    results = [np.load(adaptive_workers / f"oom-worker-{index}.npz") for index in range(2)]
    for result in results:
        # Both shrank from 3 to 2 rows at step 0, the same logical batch retried: no step lost or doubled.
        assert json.loads(str(result["oom_events"])) == [[0, 3, 2]]
        assert int(result["micro_batch_size"]) == 2 and int(result["iterations"]) == oracle.STEPS
        for got, want in zip(oracle.saved_weights(result), single_process["weights"], strict=True):
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
    chief, other = (oracle.saved_weights(result, extra=1) for result in results)
    for got, twin in zip(chief, other, strict=True):
        np.testing.assert_array_equal(got, twin)
