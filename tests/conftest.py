from kadapt import environment

environment.configure_tensorflow()  # before TensorFlow loads, as the `kadapt` command does

import gc  # noqa: E402
import itertools  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import pytest  # noqa: E402

import postgres  # noqa: E402

BACKEND = keras.backend.backend()
DEFAULT_BACKENDS = ("tensorflow",)
# Few tests each, but long: most of it waiting on processes (a cluster of workers, a tuner's chief,
# collectors) or replica threads, or training real models. pytest-xdist's `--dist loadfile` hands
# out the modules with the most tests first, so these started last and ended the run alone on a
# mostly idle machine. `make test` keeps `scheduled`'s order instead (`--no-loadscope-reorder`):
# these, longest first, each followed by one module of xdist's order, so that only two or three of
# them run at once (all six multi-process ones at once put ~15 TensorFlow processes on the 2 cores).
LONG_MODULES = ("test_distributed_search.py", "test_multi_worker_train.py", "test_multi_worker.py",
                "test_real_clients.py", "test_recipe_front_doors.py",
                "test_environment.py", "test_collect_workers.py", "test_oom_recovery.py",
                "test_real_clients_auto.py", "test_jax_workers.py", "test_data_parallel_jax.py",
                "test_jax_processes.py", "test_run_processes.py", "test_probe_training_peaks.py")

if BACKEND == "tensorflow":
    import tensorflow as tf

    # Two logical CPU devices, so tf.distribute.MirroredStrategy can be tested.
    # This must happen before TensorFlow initializes its devices.
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()],
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "backends(*names): the Keras backends a test runs on (default: tensorflow only); "
        "under `KERAS_BACKEND` set to another, it is deselected")
    missing = [name for name in LONG_MODULES if not Path(__file__).with_name(name).is_file()]
    if missing:  # a renamed module would silently fall back to the end of the run
        raise pytest.UsageError(f"tests/conftest.py's LONG_MODULES names {missing}, which tests/ does not "
                                "hold: rename them there too")


def pytest_ignore_collect(collection_path, config):
    """Under another backend, a module that names no backends is not even imported (most
    import TensorFlow): the deselection below would drop all its tests anyway."""
    if BACKEND in DEFAULT_BACKENDS or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if "mark.backends(" not in collection_path.read_text() else None


def pytest_collection_finish(session):
    """Everything imported so far (TensorFlow, JAX, Keras, the test modules) lives for the whole
    session: frozen out of the collector's reach, the `gc.collect()` in each test's
    `clear_session` walks only what tests made (measured: 0.23 s of CPU a call before, 0.003 after)."""
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """Deselects what does not run on this process's Keras backend; orders the rest (`scheduled`)."""
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("backends")
        backends = marker.args if marker is not None else DEFAULT_BACKENDS
        (kept if BACKEND in backends else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = scheduled(kept)


def scheduled(items):
    """`items`, module by module: each of `LONG_MODULES` in turn, then one of the other modules
    (most tests first, pytest-xdist's own order under `--dist loadfile`), until both run out."""
    modules = {}
    for item in items:
        modules.setdefault(item.path.name, []).append(item)
    long = [modules[name] for name in LONG_MODULES if name in modules]
    rest = sorted((tests for name, tests in modules.items() if name not in LONG_MODULES), key=len, reverse=True)
    order = [tests for pair in itertools.zip_longest(long, rest) for tests in pair if tests]
    return [item for tests in order for item in tests]


@pytest.fixture(scope="session")
def mirrored_strategy():
    """MirroredStrategy on the two logical CPUs, one for the whole session: the collective
    instance keys of two strategies in one process collide (a shape mismatch in the second)."""
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture(scope="session", autouse=True)
def _private_probe_cache(tmp_path_factory):
    """The measurement caches of the tests and the commands they start, not the user's; and
    float32 pinned (`$KADAPT_PRECISION`): the suite's oracles are float32, and the default
    `--precision auto` would time each network on a machine with 16-bit units (tests/test_precision.py
    unpins it where it tests the measurement)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KADAPT_CACHE_DIR", str(tmp_path_factory.mktemp("probe-cache")))
        patch.setenv("KADAPT_PRECISION", "float32")
        yield


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    yield
    keras.mixed_precision.set_global_policy("float32")



_DATABASE_NAMES = itertools.count()


@pytest.fixture(scope="session")
def server():
    """`(host, port, user)` of a throwaway PostgreSQL server on 127.0.0.1 (postgres.py), one per test process."""
    with postgres.cluster() as address:
        yield address


@pytest.fixture
def url(server):
    """The URL of a new, empty database on the throwaway server, for each test."""
    return postgres.create_database(*server, f"records_{os.getpid()}_{next(_DATABASE_NAMES)}")


@pytest.fixture(params=["host", "device"])
def observed_on(request, monkeypatch):
    """Where the `MetaAdjuster` observes: read to the host, or reduced on the device
    (`kadapt.meta.observe.device_observer`; on a CPU from `DEVICE_FROM` weights and on TensorFlow only:
    here from 0 and on JAX too)."""
    if request.param == "device":
        from kadapt.meta.observe import device_observer

        monkeypatch.setattr(device_observer, "DEVICE_FROM", 0)
        monkeypatch.setattr(device_observer, "CPU_BACKENDS", ("tensorflow", "jax"))
    return request.param
