"""The JAX accumulating step both ways: micro-steps looped on the host (the CPU's) and the fused
`lax.scan` (a GPU's, forced here), each against plain Keras on JAX and a NumPy BatchNorm oracle."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import classification_data
from helpers import compile_classifier
from helpers import max_relative_difference
from helpers import mlp
from kadapt.batching.jax import host_loop

pytestmark = pytest.mark.backends("jax")

WAYS = pytest.mark.parametrize("platforms", [("cpu",), ()], ids=["host_loop", "fused_scan"])


def _kinds(model):
    return {type(step) is host_loop.HostLoopStep for step in model.train_function._steps.values()}


@WAYS
def test_ragged_micro_batches_with_sample_weights_equal_one_batch(monkeypatch, platforms):
    monkeypatch.setattr(host_loop, "PLATFORMS", platforms)
    x, y = classification_data(rows=37)
    weights = np.random.default_rng(1).uniform(0.1, 2.0, 37).astype("float32")
    plain = compile_classifier(mlp())
    plain.fit(x, y, sample_weight=weights, batch_size=37, epochs=3, verbose=0, shuffle=False)
    split = kadapt.accumulate(compile_classifier(mlp()), 16)  # 16 + 16 + 5
    split.fit(x, y, sample_weight=weights, batch_size=37, epochs=3, verbose=0, shuffle=False)
    assert max_relative_difference(plain.get_weights(), split.get_weights()) < 1e-5
    assert int(split.optimizer.iterations) == 3
    assert _kinds(split) == {bool(platforms)}


@WAYS
def test_batch_norm_moves_once_per_micro_batch_with_the_logical_horizon(monkeypatch, platforms):
    monkeypatch.setattr(host_loop, "PLATFORMS", platforms)
    x = np.random.default_rng(0).normal(size=(12, 3)).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    normalized = keras.layers.BatchNormalization(momentum=0.5)(inputs)
    model = kadapt.AccumulatingModel(inputs, keras.layers.Dense(1)(normalized), micro_batch_size=4)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    model.fit(x, np.zeros((12, 1), "float32"), batch_size=12, epochs=2, verbose=0, shuffle=False)
    # NumPy oracle: 3 micro-batches per logical batch, each with momentum 0.5 ** (1 / 3).
    mean, variance, per_micro = np.zeros(3), np.ones(3), 0.5 ** (1 / 3)
    for _ in range(2):
        for chunk in np.split(x.astype("float64"), 3):
            mean = mean * per_micro + chunk.mean(0) * (1 - per_micro)
            variance = variance * per_micro + chunk.var(0) * (1 - per_micro)
    layer = model.layers[1]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.moving_mean), mean, rtol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.moving_variance), variance, rtol=1e-5)
    assert _kinds(model) == {bool(platforms)}
