"""The probe measures what training runs (issue 68): `micro_batch_size="auto"` on a conv net with
pooling and dropout, under a budget, in a process configured as the `kadapt` command configures it
(oneDNN on, one inter-op thread: `kadapt.environment.steady_peaks`, which must come before
TensorFlow's first operation, hence a fresh subprocess). Training runs the trial's own trace at the
size chosen, and its steps peak as the trial's steps did."""

import json
import os
import subprocess
import sys
import textwrap

# Training's step peaks over the trial's mean peak at the size chosen, measured in 12 processes
# (AMD EPYC, 2026-12-07; 7-11 steps each, every step of a process alike): 0.89-1.00x, never
# above. Below, by two things a trial holds and training does not: the probe's two sample batches
# (1.5 MiB here, the cache key's and the probe's) and the allocator's layout after the trials
# before it (trials at 32.9-39.7 MiB, training at 32.0-35.3). Both make the choice cautious, not
# wrong. The bounds: 0.80x, that gap and as much again; 1.03x, where no step came, and what the
# probe's choice cannot rest on: a training step above its trial's.
LOWEST, HIGHEST = 0.80, 1.03

# Arrays would go through Keras' own pipeline, whose parallel map and autotuned prefetch hold 0 to
# 4 more batches (0.77 MiB each here) during a step, by timing, in trials and training alike
# (measured: training 0.85-1.09x the trial over 8 and 16 steps). A dataset with tf.data's
# autotuning off runs nothing beside the step, so the step itself is what is compared.
SCRIPT = """
from kadapt import environment

tf = environment.load_tensorflow()
environment.steady_peaks(tf)
import json
import keras
import numpy as np
import kadapt

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Dropout(0.25),
    keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Dropout(0.25), keras.layers.Flatten(), keras.layers.Dense(10)])
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
trainer = kadapt.accumulate(model, "auto", memory_budget="40MiB")
rng = np.random.default_rng(0)
x = rng.random((256 * 8, 28, 28, 1), dtype=np.float32)
options = tf.data.Options()
options.autotune.enabled = False
data = tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 10, len(x)))).batch(256).with_options(options)
peaks = []

class StepPeaks(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        tf.config.experimental.reset_memory_stats("CPU:0")

    def on_train_batch_end(self, batch, logs=None):
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])

trainer.fit(data, epochs=1, verbose=0, callbacks=[StepPeaks()])
result = trainer.probe_result
print(json.dumps({
    "trained": trainer.micro_batch_size, "chosen": result.micro_batch_size,
    "trial": [t.step_peaks for t in result.trials if t.micro_batch_size == trainer.micro_batch_size][0],
    "training": peaks, "trial_compiles": result.compiles, "compiles": trainer.train_function.compiles}))
"""


def test_training_runs_the_trials_step_and_peaks_as_its_trial_did(tmp_path):
    env = {**os.environ, "KADAPT_CACHE_DIR": str(tmp_path)}
    env.pop("TF_NUM_INTEROP_THREADS", None)
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["trained"] == seen["chosen"]
    assert seen["compiles"] == seen["trial_compiles"]  # no trace of its own: the trial's
    trial = sum(seen["trial"]) / len(seen["trial"])
    steady = seen["training"][1:]  # the first step runs while tf.data fills its buffers
    assert all(LOWEST * trial <= peak <= HIGHEST * trial for peak in steady), (seen["trial"], steady)
