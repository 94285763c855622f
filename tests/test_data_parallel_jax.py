"""kadapt's accumulating models under `keras.distribution.DataParallel` on 4 simulated CPU devices,
against one device's plain Keras and closed-form NumPy (issue 45 item 1).

JAX takes its device count from `XLA_FLAGS` when it loads, so the meshes train in one process of
their own (tests/data_parallel_job.py); under pytest-xdist the first worker to need it runs it and
the others read its results.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from once_per_session import once_per_session
from test_meta_adjuster import regression_data

from kadapt.batching.jax import data_parallel

pytestmark = pytest.mark.backends("jax")

JOB = Path(__file__).with_name("data_parallel_job.py")
JOB_SECONDS = 300
MESHES = ("4",)


@pytest.fixture(scope="module")
def meshes(tmp_path_factory):
    """The job's results, made once per test session."""
    return once_per_session(tmp_path_factory, "data-parallel", lambda: _run_job(tmp_path_factory), JOB_SECONDS)


def _run_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("data-parallel") / "results.json"
    done = subprocess.run([sys.executable, str(JOB), str(out)], capture_output=True, text=True,
                          timeout=JOB_SECONDS, env={**os.environ, "PYTHONPATH": _path()})
    if done.returncode != 0:
        pytest.fail(f"{JOB.name} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def _path():
    tests, root = str(JOB.parent), str(JOB.parent.parent)
    return os.pathsep.join([root, tests, os.environ.get("PYTHONPATH", "")])


def _assert_trained_as(got, want, rtol=1e-5):
    assert got["iterations"] == want["iterations"] == 6  # one optimizer step per logical batch, 2 epochs
    for a, b in zip(got["weights"], want["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6)
    for key in ("loss", "mae"):
        np.testing.assert_allclose(got[key], want[key], rtol=rtol)


@pytest.mark.parametrize("devices", MESHES)
def test_fixed_micro_batches_on_a_mesh_train_as_one_device_of_plain_keras(meshes, devices):
    _assert_trained_as(meshes[devices]["fixed"], meshes["plain"])


@pytest.mark.parametrize("devices", MESHES)
def test_the_plan_under_a_mesh_is_one_devices_share_of_the_batch(meshes, devices):
    # The state is replicated, the batch split: per device, the state plus 1/N of the batch's bytes.
    state = meshes["plan_arguments_one_device"] - meshes["batch_bytes"]
    assert meshes[devices]["plan_arguments"] == state + meshes["batch_bytes"] // int(devices)


@pytest.mark.parametrize("devices", MESHES)
def test_auto_on_a_mesh_fits_the_sharded_plan_and_trains_as_plain_keras(meshes, devices):
    auto = meshes[devices]["auto"]
    assert auto["peak"] <= auto["budget"]
    _assert_trained_as(auto, meshes["plain"])


@pytest.mark.parametrize("devices", MESHES)
def test_out_of_memory_on_a_mesh_shrinks_every_device_and_retries_the_same_batch(meshes, devices):
    recovered = meshes[devices]["recovered"]
    assert recovered["oom_events"] == [[0, 8, 6]] and recovered["micro_batch_size"] == 6
    _assert_trained_as(recovered, meshes["plain"])


@pytest.mark.parametrize("devices", MESHES)
def test_the_meta_adjuster_on_a_mesh_decides_once_and_its_rollback_and_cut_reach_the_weights(meshes, devices):
    from test_meta_adjuster import numpy_descent

    adjusted = meshes[devices]["adjusted"]
    assert adjusted["decisions"] == [[3, "divergence", "lr x0.1"]] and adjusted["iterations"] == 4
    x, y = regression_data()
    np.testing.assert_allclose(adjusted["kernel"], numpy_descent(x, y, [0.05, 0.005], [0.5, 0.5]), rtol=1e-5)


@pytest.mark.parametrize("devices", MESHES)
def test_a_model_saved_on_a_mesh_loads_and_trains_on_as_the_original(meshes, devices):
    saved = meshes[devices]["saved"]
    assert saved["micro_batch_size"] == 12
    for a, b in zip(saved["loaded"]["weights"], saved["trained"]["weights"], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("devices", MESHES)
def test_a_batch_that_does_not_divide_over_the_mesh_is_a_value_error_naming_the_fix(meshes, devices):
    assert meshes[devices]["indivisible"] == (
        f"Argument `batch_size` must be a multiple of the {devices} devices of the mesh's batch axis ('batch') "
        f"(every device trains an equal share of each batch): use batch_size=44 or 48, or a mesh whose "
        f"batch axis divides it. Received: batch_size=47")


def test_a_ragged_last_batch_that_does_not_divide_over_the_mesh_is_a_value_error(monkeypatch):
    monkeypatch.setattr(data_parallel, "batch_shards", lambda: 4)
    monkeypatch.setattr(data_parallel, "_axis_text", lambda shards: f"{shards} devices of the mesh's batch axis")
    with pytest.raises(ValueError, match=r"^The last batch of 98 rows at batch_size=48 has 2 rows, not a multiple "
                                         r"of the 4 devices of the mesh's batch axis: drop the last 2 row\(s\)"):
        data_parallel.check_fit_batches(np.zeros((98, 5)), 48)
    data_parallel.check_fit_batches(np.zeros((100, 5)), 48)  # 48, 48, 4


def test_without_a_distribution_every_batch_is_one_shard():
    assert data_parallel.batch_shards() == 1
    data_parallel.check_fit_batches(np.zeros((7, 5)), 3)
