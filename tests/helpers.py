"""Small models and data shared by the tests."""

import keras
import numpy as np


def classification_data(rows=37, features=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = rng.integers(0, classes, size=rows)
    return x, y


def write_separable_rows(folder, scale):
    """`x.npy,y.npy` in `folder`: 240 rows of 4 features, 3 classes a unit shift of 3 apart, times
    `scale`; returns the `--data` value (relative: run from `folder`)."""
    rng = np.random.default_rng(0)
    y = np.arange(240) % 3
    x = (rng.normal(size=(240, 4)) + np.eye(3, 4)[y] * 3).astype("float32") * scale
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return "x.npy,y.npy"


def mlp(features=5, classes=3, seed=0, regularize=True):
    """A Sequential MLP without BatchNorm or dropout, deterministic init."""
    keras.utils.set_random_seed(seed)
    regularizer = keras.regularizers.L2(0.01) if regularize else None
    return keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(16, activation="tanh", kernel_regularizer=regularizer),
            keras.layers.Dense(classes),
        ]
    )


def compile_classifier(model, learning_rate=0.1, **kwargs):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **kwargs,
    )
    return model


def max_relative_difference(weights_a, weights_b):
    """Largest per-tensor max|a - b| / max|a| over two lists of arrays."""
    worst = 0.0
    for a, b in zip(weights_a, weights_b, strict=True):
        scale = max(float(np.max(np.abs(a))), 1e-12)
        worst = max(worst, float(np.max(np.abs(a - b))) / scale)
    return worst


class OutOfMemoryAbove(keras.layers.Layer):
    """Identity layer that raises a genuine ResourceExhaustedError (it asks the
    allocator for 256 GiB) when it sees more than `rows` rows."""

    def __init__(self, rows, **kwargs):
        super().__init__(**kwargs)
        self.rows = rows

    def call(self, inputs):
        import tensorflow as tf

        def explode():
            return inputs + tf.reduce_sum(tf.random.uniform([2**36])) * 0.0

        return tf.cond(tf.shape(inputs)[0] > self.rows, explode, lambda: inputs)


class OutOfMemoryOnReplicaAbove(keras.layers.Layer):
    """Identity layer that raises a ResourceExhaustedError at once, inside a
    traced step, when replica `replica` of a tf.distribute strategy sees more
    than `rows` rows. (TensorFlow raises a Python MemoryError in a py_function
    as ResourceExhaustedError; a real allocation costs 10 s of allocator
    retries.)"""

    def __init__(self, rows, replica, **kwargs):
        super().__init__(**kwargs)
        self.rows, self.replica = rows, replica

    def call(self, inputs):
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None:  # the symbolic build, in the strategy's cross-replica context
            return inputs

        def explode():
            def fail():
                raise MemoryError(f"replica {self.replica} out of memory above {self.rows} rows")

            return inputs + tf.ensure_shape(tf.py_function(fail, [], inputs.dtype), [])

        too_many = tf.logical_and(tf.shape(inputs)[0] > self.rows,
                                  tf.equal(context.replica_id_in_sync_group, self.replica))
        return tf.cond(too_many, explode, lambda: inputs)


def constant_meta_model(action_index, gain=1.0):
    """A meta-model (with the MetaSpec) that predicts `action_index` ends `gain` below keeping
    (in log validation loss) and every other action 1.0 above it, whatever the window."""
    from kadapt.meta.model.actions import ACTIONS
    from kadapt.meta.model.actions import KEEP
    from kadapt.meta.model.features import FEATURE_NAMES
    from kadapt.meta.model.features import WINDOW
    from kadapt.meta.model.meta_model import MetaSpec

    bias = np.ones(len(ACTIONS), "float32")
    bias[KEEP] = 0.0
    if action_index != KEEP:
        bias[action_index] = -gain
    inputs = keras.Input((WINDOW, len(FEATURE_NAMES)))
    hidden = keras.layers.Flatten()(MetaSpec()(inputs))
    outputs = keras.layers.Dense(len(ACTIONS), kernel_initializer="zeros",
                                 bias_initializer=keras.initializers.Constant(bias))(hidden)
    return keras.Model(inputs, outputs)


def write_tiny_npz(path, train_rows=64, test_rows=32, side=12, seed=0):
    """Two classes: is the top half of the image brighter than the bottom?"""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (train_rows + test_rows, side, side), dtype=np.uint8)
    y = (x[:, : side // 2].mean((1, 2)) > x[:, side // 2 :].mean((1, 2))).astype(np.int64)
    np.savez(path, x_train=x[:train_rows], y_train=y[:train_rows],
             x_test=x[train_rows:], y_test=y[train_rows:])
    return path


def epochs_done(run):
    """The epochs a `kadapt train` run directory's history.json lists ([] before the first)."""
    import json

    try:
        return json.loads((run / "history.json").read_text())["epoch"]
    except (FileNotFoundError, ValueError):
        return []


def child_environments(parent):
    """`(pid, environment variables as bytes)` of each live child of process `parent` (Linux' /proc)."""
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != parent:
                continue
            yield int(entry.name), (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile


def kill_child_after_first_epoch(launcher, run, is_target, seconds):
    """Waits (at most `seconds`) until the `kadapt train --workers` run directory `run` lists an
    epoch, then kills with SIGKILL the child of the `Popen` `launcher` whose environment
    `is_target(variables)` accepts; returns `time.monotonic()` at the kill."""
    import os
    import signal
    import time

    deadline = time.monotonic() + seconds
    while not epochs_done(run) and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    target = next((pid for pid, variables in child_environments(launcher.pid) if is_target(variables)), None)
    assert target is not None and launcher.poll() is None, "the run ended before its worker could be killed"
    os.kill(target, signal.SIGKILL)
    return time.monotonic()


def assert_trained_alike(run, one, atol):
    """The `kadapt train` run directories `run` and `one` hold the same history (loss, val_loss,
    accuracy within 1e-5) and the same `model.keras` weights (within 1e-5 relative, `atol`)."""
    import json

    import kadapt

    histories = [json.loads((path / "history.json").read_text()) for path in (run, one)]
    for key in ("loss", "val_loss", "accuracy"):
        np.testing.assert_allclose(histories[0][key], histories[1][key], rtol=1e-5)
    weights = [kadapt.load_model(path / "model.keras").get_weights() for path in (run, one)]
    for got, want in zip(*weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)


# The start of a script that runs as if kadapt were not installed: a finder ahead of every other
# refuses it (the editable install's own finder would find it whatever sys.path holds).
NO_KADAPT = """
import sys


class NoKadapt:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "kadapt":
            raise ModuleNotFoundError(name)


sys.meta_path.insert(0, NoKadapt())
"""


def load_data_error(folder, monkeypatch, **options):
    """The message of the `UsageError` that `load_data(RunConfig(**options))` raises, run from `folder`."""
    import pytest

    from kadapt.run import RunConfig
    from kadapt.run import UsageError
    from kadapt.run.data import load_data

    monkeypatch.chdir(folder)
    with pytest.raises(UsageError) as raised:
        load_data(RunConfig(**options))
    return str(raised.value)
