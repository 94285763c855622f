"""One worker of the multi-worker job of tests/test_multi_worker.py (run as a script).

    python multi_worker_job.py INDEX PORT,PORT,... OUTPUT_DIR

Sets TF_CONFIG for worker INDEX of a cluster on 127.0.0.1, trains under
`tf.distribute.MultiWorkerMirroredStrategy` and writes what the test compares to OUTPUT_DIR, in one
pair of processes (each pays TensorFlow's import and the cluster's start once):
KIND-worker-INDEX.npz for kadapt.accumulate and kadapt.AccumulatingModel; oom-worker-INDEX.npz,
worker 1 alone running out of memory; meta-worker-INDEX.npz, a MetaAdjuster whose trigger and
meta-model differ between the workers; noise-worker-INDEX.npy, the noise scale's statistics; then
trains until a peer is killed and writes the error that ends it, exiting with 3.
"""

import faulthandler
import json
import os
import sys

index, ports, output = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                                      "task": {"type": "worker", "index": index}})

# A job that hangs shows where each worker waits, in its log, before the collective timeout ends it.
faulthandler.dump_traceback_later(240, exit=False)

from kadapt import environment  # noqa: E402

environment.configure_tensorflow()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import multi_worker_oracle as oracle  # noqa: E402
from helpers import OutOfMemoryAbove  # noqa: E402
from helpers import constant_meta_model  # noqa: E402

import kadapt  # noqa: E402
from kadapt.meta import MetaAdjuster  # noqa: E402
from kadapt.meta import Trigger  # noqa: E402

# A collective waits out a loaded machine (a real out-of-memory error, a retrace on a slow CPU); a
# killed peer is noticed sooner, by TensorFlow's coordination service (its heartbeats), as in
# `kadapt train --workers`: the test holds the job to that bound.
strategy = kadapt.distribute.multi_worker_strategy(collective_timeout_seconds=oracle.COLLECTIVE_TIMEOUT_SECONDS)
x, y = oracle.data()
for kind in ("accumulate", "accumulating_model"):  # both, one after the other
    with strategy.scope():
        if kind == "accumulate":
            model = kadapt.accumulate(oracle.network(), micro_batch_size=oracle.MICRO)
        else:
            network = oracle.network()
            model = kadapt.AccumulatingModel(network.inputs, network.outputs, micro_batch_size=oracle.MICRO)
        oracle.compile_model(model, oracle.EXACTNESS_EPOCHS)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(oracle.BATCH)
    history = model.fit(oracle.training_batches(x, y), epochs=oracle.EXACTNESS_EPOCHS, validation_data=dataset,
                        verbose=0)
    evaluation = model.evaluate(dataset, verbose=0)
    predictions = model.predict(tf.data.Dataset.from_tensor_slices(x).batch(oracle.BATCH), verbose=0)
    np.savez(os.path.join(output, f"{kind}-worker-{index}.npz"),
             *model.get_weights(), iterations=int(model.optimizer.iterations.numpy()),
             history=json.dumps(history.history), evaluation=np.array(evaluation), predictions=predictions)
# Worker 1 alone runs out of memory above 2 rows: every worker must retry with it.
with strategy.scope():
    reference = oracle.network()
    network = keras.Sequential([keras.Input((5,)), OutOfMemoryAbove(2 if index == 1 else 10**9),
                                keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    network.set_weights(reference.get_weights())
    model = kadapt.accumulate(network, micro_batch_size=oracle.MICRO)
    oracle.compile_model(model)
history = model.fit(oracle.training_batches(x, y), epochs=oracle.EPOCHS, verbose=0)
np.savez(os.path.join(output, f"oom-worker-{index}.npz"), *model.get_weights(),
         iterations=int(model.optimizer.iterations.numpy()), history=json.dumps(history.history),
         oom_events=json.dumps(model.oom_events), micro_batch_size=model.micro_batch_size)

# Then: the chief's trigger fires and cuts the rate; worker 1's alone would never fire.
with strategy.scope():
    model = kadapt.accumulate(oracle.network(), micro_batch_size=oracle.MICRO)
    model.compile(optimizer=kadapt.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
if index == 0:
    trigger, action = Trigger(patience=2, cooldown=0, slow_fraction=10.0), 1  # every loss is "slow"; lr x0.3
else:
    trigger, action = Trigger(patience=10**6, explode_factor=1e9), 3  # never fires; its model: lr x3
adjuster = MetaAdjuster(constant_meta_model(action), monitor="loss", check_every=2, trigger=trigger, verbose=0)
model.fit(oracle.training_batches(x, y), epochs=oracle.EPOCHS, callbacks=[adjuster], verbose=0)
decisions = [[d["step"], d["trigger"], d["action"]] for d in adjuster.decisions]
np.savez(os.path.join(output, f"meta-worker-{index}.npz"), *model.get_weights(), decisions=json.dumps(decisions))

with strategy.scope():  # the gradient noise scale over both workers' micro-batches
    model = kadapt.accumulate(oracle.network(), micro_batch_size=oracle.NOISE_MICRO, measure_noise=True)
    oracle.compile_model(model, oracle.NOISE_EPOCHS)
model.fit(oracle.training_batches(x, y), epochs=oracle.NOISE_EPOCHS, verbose=0)
np.save(os.path.join(output, f"noise-worker-{index}.npy"), oracle.noise_statistics(model))


def train_until_a_peer_is_lost(model):
    """Trains `model` on until a peer is killed (its step already traced: no new model to build and
    trace); writes the error that ends the run and exits with 3."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(oracle.BATCH).repeat()

    class Started(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:  # a compiled step has run across both workers
                open(os.path.join(output, f"worker-{index}.started"), "w").close()

    try:
        model.fit(dataset, epochs=1, steps_per_epoch=10**7, verbose=0, callbacks=[Started()])
    except Exception as error:  # noqa: BLE001  (the test reads which error ended the run)
        with open(os.path.join(output, f"worker-{index}.error"), "w") as file:
            file.write(f"{type(error).__name__}: {error}")
        sys.exit(3)
    sys.exit(0)


train_until_a_peer_is_lost(model)
