"""One of several JAX processes training `kadapt.accumulate` on its share of every batch.

Run by tests/test_jax_processes.py with Keras' cluster variables set
(`kadapt.jax_processes`); argv[1] is the output directory. After the first
of two epochs the chief writes the weights and the History to
`<out>/result.npz`, each process writes `epoch-1-<index>`, and process 1
waits there for the test to kill it: process 0 goes on alone into the
second epoch and meets the lost peer.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

import time  # noqa: E402
from pathlib import Path  # noqa: E402

from kadapt import jax_processes  # noqa: E402

GROUP = jax_processes.cluster_from_environment()
jax_processes.initialize_processes(GROUP)

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402

ROWS, BATCH, MICRO = 40, 16, 4  # the last batch of each epoch has 8 rows


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, 5)).astype("float32"), rng.normal(size=(ROWS, 3)).astype("float32")


def network():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])


def compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


class AfterFirstEpoch(keras.callbacks.Callback):
    """The chief saves the first epoch's result; process 1 then waits to be killed."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def on_epoch_end(self, epoch, logs=None):
        if epoch != 0:
            return
        if GROUP.is_chief:
            np.savez(self.out / "result.npz", *self.model.get_weights(), loss=logs["loss"],
                     iterations=int(self.model.optimizer.iterations.numpy()), devices=len(jax.devices()))
        (self.out / f"epoch-1-{GROUP.index}").touch()
        if GROUP.index == 1:
            time.sleep(600)


def main(out):
    x, y = data()
    model = compiled(kadapt.accumulate(network(), MICRO))
    model.fit(jax_processes.process_rows(x, BATCH, GROUP), jax_processes.process_rows(y, BATCH, GROUP),
              batch_size=BATCH // GROUP.count, epochs=2, shuffle=False, verbose=0,
              callbacks=[AfterFirstEpoch(Path(out))])


if __name__ == "__main__":
    main(sys.argv[1])
