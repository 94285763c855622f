#!/usr/bin/env bash
# GPU check, for a machine lent with a GPU (under 5 minutes):
#  1. tools/probe_gpu.py on the real GPU (NVML or memory_limit capacity, trial table, plan);
#  2. an out-of-memory recovery run on a GPU limited to 1 GiB with
#     tf.config.set_logical_device_configuration(memory_limit=...): the run
#     starts with a micro-batch far too large, must recover, and must end with
#     the weights of a plain full-batch run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || { python3 -m venv .venv && .venv/bin/pip install -q -e ".[gpu,test]"; }
"$PY" -c "import tensorflow as tf; print('GPUs:', tf.config.list_physical_devices('GPU'))"
timeout 150 "$PY" tools/probe_gpu.py --model small_cnn --input-shape 64,64,3 --batch-size 4096
timeout 120 "$PY" - <<'PYTHON'
import logging
import numpy as np
import tensorflow as tf

gpu = tf.config.list_physical_devices("GPU")[0]
tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=1024)])
import keras  # noqa: E402
import kadapt  # noqa: E402

logging.basicConfig(level=logging.INFO)


def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((128, 128, 3)),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


rng = np.random.default_rng(0)
x = rng.random((512, 128, 128, 3), dtype=np.float32)
y = rng.integers(0, 10, 512)
recovering = kadapt.accumulate(build(), 512)  # 512 x 128 x 128 x 64 floats: far over 1 GiB
recovering.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False)
print("oom events:", recovering.oom_events, "final micro-batch:", recovering.micro_batch_size)
reference = kadapt.accumulate(build(), recovering.micro_batch_size, max_oom_retries=0)
reference.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False)
worst = max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-12))
            for a, b in zip(reference.get_weights(), recovering.get_weights()))
print(f"max relative weight difference from a run at the final micro-batch: {worst:.1e}")
assert recovering.oom_events and worst <= 1e-5
PYTHON
