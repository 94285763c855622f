"""One worker of a multi-worker job for tests/test_multi_worker.py (run as a script).

    python multi_worker_job.py INDEX PORT,PORT,... OUTPUT_DIR SCENARIO

Sets TF_CONFIG for worker INDEX of a cluster on 127.0.0.1, trains under
`tf.distribute.MultiWorkerMirroredStrategy` and writes what the test compares
to OUTPUT_DIR/worker-INDEX.npz.
"""

import json
import os
import sys

index, ports, output, scenario = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], sys.argv[4]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                                      "task": {"type": "worker", "index": index}})

from kadapt import environment  # noqa: E402

environment.configure_tensorflow()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import multi_worker_oracle as oracle  # noqa: E402

import kadapt  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
x, y = oracle.data()
with strategy.scope():
    if scenario == "accumulate":
        model = kadapt.accumulate(oracle.network(), micro_batch_size=oracle.MICRO)
    else:
        network = oracle.network()
        model = kadapt.AccumulatingModel(network.inputs, network.outputs, micro_batch_size=oracle.MICRO)
    oracle.compile_model(model)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(oracle.BATCH)
history = model.fit(dataset, epochs=oracle.EPOCHS, validation_data=dataset, verbose=0)
evaluation = model.evaluate(dataset, verbose=0)
predictions = model.predict(tf.data.Dataset.from_tensor_slices(x).batch(oracle.BATCH), verbose=0)
np.savez(os.path.join(output, f"worker-{index}.npz"),
         *model.get_weights(), iterations=int(model.optimizer.iterations.numpy()),
         history=json.dumps(history.history), evaluation=np.array(evaluation), predictions=predictions)
