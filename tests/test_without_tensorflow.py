"""On Keras' JAX backend kadapt imports and trains without TensorFlow; its TensorFlow-only
features say so. Run in a child process where importing `tensorflow` raises ImportError."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NAMES = ("AccumulatingModel", "AdaptiveBatchSize", "AllocatorStatisticsError", "BatchPlan", "CosineAnnealing",
         "CosineMomentum", "MetaAdjuster", "MomentumScheduler", "PrecisionChoice", "accumulate", "choose_precision",
         "find_learning_rate", "load_model", "plan_batch", "probe_micro_batch")
MODULES = ("kadapt.augment", "kadapt.batching", "kadapt.batching.jax.probe", "kadapt.callbacks", "kadapt.distribute",
           "kadapt.environment", "kadapt.extras", "kadapt.meta", "kadapt.optimizers", "kadapt.precision",
           "kadapt.recipes", "kadapt.schedules")

CHILD = textwrap.dedent("""
    import importlib, json, sys

    class NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "tensorflow":
                raise ImportError(f"No module named {name!r}")

    sys.meta_path.insert(0, NoTensorFlow())
    import kadapt

    names, modules = json.loads(sys.argv[1])
    for module in modules:
        importlib.import_module(module)
    for name in names:
        getattr(kadapt, name)

    def error(call):
        try:
            call()
        except Exception as caught:
            return [type(caught).__name__, str(caught)]
        return None

    from kadapt import augment, distribute, environment
    errors = {
        "multi_worker_strategy": error(distribute.multi_worker_strategy),
        "load_tensorflow": error(environment.load_tensorflow),
        "augment_dataset": error(lambda: augment.augment_dataset(None, augment.augmentation())),
        "fast_fit": error(lambda: kadapt.recipes.fast_fit),
    }

    import keras, numpy as np
    # The micro-batch from XLA's plan ("auto"), then accumulated steps under a live momentum.
    model = kadapt.accumulate(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), "auto",
                              memory_budget="64MiB")
    model.compile(kadapt.optimizers.SGD(0.1, momentum=0.5), "mse")
    model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, verbose=0,
              callbacks=[kadapt.MomentumScheduler(kadapt.CosineMomentum(0.9, 0.8, total_steps=2))])
    print(json.dumps({"backend": keras.backend.backend(), "errors": errors,
                      "micro_batch_size": model.micro_batch_size, "steps": int(model.optimizer.iterations),
                      "tensorflow_loaded": "tensorflow" in sys.modules}))
""")


@pytest.fixture(scope="module")
def child():
    environment = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    arguments = json.dumps([NAMES, MODULES])
    done = subprocess.run([sys.executable, "-c", CHILD, arguments], env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kadapt_imports_and_trains_on_jax_without_tensorflow(child):
    assert child["backend"] == "jax"
    assert child["tensorflow_loaded"] is False
    assert child["micro_batch_size"] == 4 and child["steps"] == 2  # planned: the logical batch fits


def test_multi_worker_training_says_it_needs_the_tensorflow_backend(child):
    kind, message = child["errors"]["multi_worker_strategy"]
    assert kind == "UnsupportedBackendError"
    assert "Multi-worker training (kadapt.distribute) runs on Keras' TensorFlow backend only" in message
    assert "'jax'" in message and "KERAS_BACKEND=tensorflow" in message


@pytest.mark.parametrize("feature", ["load_tensorflow", "augment_dataset", "fast_fit"])
def test_tensorflow_features_name_the_extra(child, feature):
    kind, message = child["errors"][feature]
    assert kind == "MissingExtraError"
    assert message.endswith('pip install "kadapt[tensorflow]"')
