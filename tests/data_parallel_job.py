"""kadapt's accumulating models under `keras.distribution.DataParallel` on simulated CPU devices.

Run by tests/test_data_parallel_jax.py in a process of its own: JAX reads
`XLA_FLAGS=--xla_force_host_platform_device_count=4` when it loads. Each
check trains on a mesh of the 4 devices and against the oracle,
plain Keras on one device (no distribution); writes what it measured as JSON
to the path in argv[1].
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["KERAS_BACKEND"] = "jax"

import tempfile  # noqa: E402

os.environ["KADAPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kadapt-cache-")  # "auto" probes here, never cached

import json  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.batching.jax.memory_plan import step_plan  # noqa: E402

MESHES = (4,)  # micro-batch 12 divides over it and 6 (after a shrink) does not: both layouts
ROWS, FEATURES, OUTPUTS = 100, 5, 3
BATCH, MICRO = 48, 12  # the last batch of each epoch has 4 rows
XLA_OUT_OF_MEMORY = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."


class OutOfMemoryAbove(keras.layers.Layer):
    """Identity; a training step of more than `rows` rows raises JAX's out-of-memory
    error while it is traced (as XLA refuses a step too large for the device)."""

    def __init__(self, rows, **kwargs):
        super().__init__(**kwargs)
        self.rows = rows

    def call(self, inputs, training=None):
        if training and inputs.shape[0] > self.rows:
            raise jax.errors.JaxRuntimeError(XLA_OUT_OF_MEMORY)
        return inputs


def network(rows_that_fit=None):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((FEATURES,))]
    if rows_that_fit is not None:
        layers.append(OutOfMemoryAbove(rows_that_fit))
    return keras.Sequential(layers + [keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(OUTPUTS)])


def compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse", metrics=["mae"])
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, FEATURES)).astype("float32"), rng.normal(size=(ROWS, OUTPUTS)).astype("float32")


def fitted(model, epochs=2, batch_size=BATCH):
    history = model.fit(*data(), batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return {"weights": [w.tolist() for w in model.get_weights()], "loss": history.history["loss"],
            "mae": history.history["mae"], "iterations": int(model.optimizer.iterations.numpy())}


def on_mesh(devices, check):
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()[:devices]))
    try:
        return check()
    finally:
        keras.distribution.set_distribution(None)


def fixed():
    return fitted(compiled(kadapt.accumulate(network(), MICRO)))


def planned():
    """"auto" with the budget of the plan of a step in micro-batches of `MICRO` on this mesh."""
    budget = batch_plan().peak_bytes
    model = compiled(kadapt.accumulate(network(), "auto", memory_budget=budget))
    result = fitted(model)
    chosen = [t for t in model.probe_result.trials if t.micro_batch_size == model.probe_result.micro_batch_size]
    return {**result, "budget": budget, "micro_batch_size": model.micro_batch_size,
            "probed": model.probe_result.micro_batch_size, "peak": chosen[-1].peak_bytes}


def batch_plan():
    """XLA's plan of one step of the 48-row batch in micro-batches of `MICRO`."""
    x, y = data()
    return step_plan(compiled(kadapt.accumulate(network(), MICRO)), (x[:BATCH], y[:BATCH]))


def recovered():
    model = compiled(kadapt.accumulate(network(rows_that_fit=6), 8))
    return {**fitted(model), "oom_events": [list(e) for e in model.oom_events],
            "micro_batch_size": model.micro_batch_size}


def saved_and_loaded(path):
    model = compiled(kadapt.accumulate(network(), MICRO))
    fitted(model, epochs=1)
    model.save(path)
    loaded = kadapt.load_model(path)
    return {"micro_batch_size": loaded.micro_batch_size, "trained": fitted(model, epochs=1),
            "loaded": fitted(loaded, epochs=1)}


def adjusted():
    """The MetaAdjuster's rollback and cut at step 3 of tests/test_meta_adjuster_steps.py, micro-batches of 3."""
    from helpers import constant_meta_model
    from test_meta_adjuster import LR_DOWN_10
    from test_meta_adjuster import linear_model
    from test_meta_adjuster import regression_data
    from test_meta_adjuster_steps import DivergesAtStep3

    model = linear_model(kadapt.optimizers.SGD(0.05, momentum=0.5), accumulate=True)
    adjuster = kadapt.meta.MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                                        trigger=DivergesAtStep3(patience=10**6), verbose=0)
    x, y = regression_data()
    model.fit(np.concatenate([x] * 4), np.concatenate([y] * 4), batch_size=len(x), epochs=1, shuffle=False,
              verbose=0, callbacks=[adjuster])
    return {"decisions": [[d["step"], d["trigger"], d["action"]] for d in adjuster.decisions],
            "kernel": model.get_weights()[0].tolist(), "iterations": int(model.optimizer.iterations.numpy())}


def indivisible_batch():
    try:
        compiled(kadapt.accumulate(network(), MICRO)).fit(*data(), batch_size=47, verbose=0)
    except ValueError as error:
        return str(error)
    return None


def main(out):
    x, y = data()
    plain = compiled(network())
    results = {"devices": len(jax.devices()), "plain": fitted(plain),
               "plan_arguments_one_device": batch_plan().argument_bytes,
               "batch_bytes": (x[:BATCH].nbytes + y[:BATCH].nbytes)}
    for devices in MESHES:
        results[str(devices)] = {
            "fixed": on_mesh(devices, fixed),
            "plan_arguments": on_mesh(devices, lambda: batch_plan().argument_bytes),
            "auto": on_mesh(devices, planned),
            "recovered": on_mesh(devices, recovered),
            "saved": on_mesh(devices, lambda: saved_and_loaded(f"{out}.{devices}.keras")),
            "adjusted": on_mesh(devices, adjusted),
            "indivisible": on_mesh(devices, indivisible_batch),
        }
    with open(out, "w") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main(sys.argv[1])
