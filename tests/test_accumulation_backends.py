"""One accumulation API on TensorFlow and JAX: what the other accumulation modules (also run on
both backends) leave out. Oracles: plain Keras of the same backend, NumPy."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import classification_data
from helpers import compile_classifier
from helpers import max_relative_difference
from helpers import mlp

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _numpy(variable):
    return keras.ops.convert_to_numpy(variable)


def _pair(build, compile_model, micro_batch_size):
    """A plain model and an accumulating one, built and compiled alike."""
    plain = compile_model(build())
    inner = compile_model(build())
    return plain, inner, kadapt.accumulate(inner, micro_batch_size)


def _fit_both(plain, accumulated, x, y, epochs=2, **kwargs):
    histories = [model.fit(x, y, epochs=epochs, verbose=0, shuffle=False, **kwargs)
                 for model in (plain, accumulated)]
    return [h.history for h in histories]


def _batch_norm_model(momentum, micro_batch_size):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    normalized = keras.layers.BatchNormalization(momentum=momentum)(inputs)
    model = kadapt.AccumulatingModel(inputs, keras.layers.Dense(1)(normalized), micro_batch_size=micro_batch_size)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model


def _moving_statistics(x, momentum, micro_batch_sizes):
    """NumPy oracle: each logical batch (all of `x`) as micro-batches of each
    size in turn, each updating with momentum ** (1 / k)."""
    mean, variance = np.zeros(x.shape[1]), np.ones(x.shape[1])
    for micro in micro_batch_sizes:
        chunks = np.split(x.astype("float64"), len(x) // micro)
        per_micro = momentum ** (1 / len(chunks))
        for chunk in chunks:
            mean = mean * per_micro + chunk.mean(0) * (1 - per_micro)
            variance = variance * per_micro + chunk.var(0) * (1 - per_micro)
    return mean, variance


def _assert_moving_statistics(model, x, momentum, micro_batch_sizes):
    mean, variance = _moving_statistics(x, momentum, micro_batch_sizes)
    layer = model.layers[1]
    np.testing.assert_allclose(_numpy(layer.moving_mean), mean, rtol=1e-5)
    np.testing.assert_allclose(_numpy(layer.moving_variance), variance, rtol=1e-5)
    assert layer.momentum == momentum  # the config is untouched


def test_micro_batch_size_changed_between_fits():
    model = _batch_norm_model(0.9, 4)
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(12, 3)).astype("float32")
    model.fit(x, np.zeros((12, 1)), batch_size=12, epochs=1, verbose=0, shuffle=False)
    model.micro_batch_size = 6  # the statistics now see two micro-batches per step
    model.fit(x, np.zeros((12, 1)), batch_size=12, epochs=1, verbose=0, shuffle=False)
    _assert_moving_statistics(model, x, 0.9, [4, 6])
    assert int(_numpy(model.optimizer.iterations)) == 2


def test_bfloat16_accumulates_in_float32_and_matches_the_full_batch():
    # mixed_float16 with loss scaling: test_accumulation_mixed_precision.py.
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    x, y = classification_data(rows=32)
    plain, inner, accumulated = _pair(lambda: mlp(regularize=False), compile_classifier, 4)
    _fit_both(plain, accumulated, x, y, batch_size=16)
    assert all(w.dtype == np.float32 for w in inner.get_weights())
    # bfloat16 forward passes (8 bits of mantissa) round differently per batch shape; the sums are float32.
    assert max_relative_difference(plain.get_weights(), inner.get_weights()) <= 2e-2
    assert int(_numpy(accumulated.optimizer.iterations)) == 4


def test_a_backend_without_a_step_is_refused_at_construction(monkeypatch):
    from kadapt.batching import accumulating_train_step

    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    unsupported = accumulating_train_step.backend_step_class()
    with pytest.raises(ValueError, match=r"TensorFlow and JAX backends.*Received: backend='torch'"):
        unsupported()


def test_auto_is_settled_by_the_registered_resolver():
    from kadapt.batching import accumulating_train_step

    calls = []

    def resolver(model, x, y, batch_size, sample_weight):
        calls.append((len(x), batch_size, sample_weight is None))
        model.micro_batch_size = 4

    x, y = classification_data(rows=16)
    model = kadapt.accumulate(compile_classifier(mlp()), "auto")
    accumulating_train_step.set_auto_resolver(resolver)
    try:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    finally:
        accumulating_train_step.set_auto_resolver(None)
    assert calls == [(16, 16, True)]
    assert model.micro_batch_size == 4
    with pytest.raises(TypeError, match=r"Argument `resolver` must be callable or None. Received: resolver=3"):
        accumulating_train_step.set_auto_resolver(3)
