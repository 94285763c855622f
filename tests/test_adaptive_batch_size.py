"""AdaptiveBatchSize: goodput-maximizing logical batch, between epochs."""

import math

import keras
import numpy as np
import pytest

import kadapt
from kadapt.batching.noise_scale import NoiseScale
from kadapt.callbacks import adaptive_batch_size as adaptive_module


@pytest.mark.parametrize("noise_scale", [5.0, 200.0, 5000.0])
def test_choice_is_the_brute_force_goodput_maximum(noise_scale):
    alpha, beta, reference = 0.02, 1e-4, 64
    candidates = [64, 128, 256, 512, 1024, 2048]
    chosen = adaptive_module.choose_batch_size(candidates, alpha, beta, noise_scale, reference)
    values = [b / (alpha + beta * b) * (noise_scale + reference) / (noise_scale + b) for b in candidates]
    assert chosen == candidates[int(np.argmax(values))]


def test_noisier_gradients_choose_larger_batches():
    pick = lambda phi: adaptive_module.choose_batch_size([64, 128, 256, 512, 1024, 2048], 0.02, 1e-4, phi, 64)  # noqa: E731
    assert pick(5.0) < pick(200.0) < pick(5000.0)
    # The optimum sits near sqrt(alpha * phi / beta): 2000 for phi = 20000.
    assert pick(20000.0) == 2048


def _regression(rows=2048):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-1.0], [2.0], [0.5]]) + 3.0 * rng.normal(size=(rows, 1))).astype("float32")


def _model(optimizer):
    inputs = keras.Input((4,))
    model = kadapt.AccumulatingModel(inputs, keras.layers.Dense(1)(inputs), micro_batch_size=16, measure_noise=True)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_epoch_loop_changes_the_batch_and_rescales_the_learning_rate():
    x, y = _regression()
    model = _model(kadapt.optimizers.SGD(0.01))
    adaptive = kadapt.AdaptiveBatchSize(32, 1024, initial_batch_size=32)
    sizes = []
    for epoch in range(3):
        sizes.append(adaptive.batch_size)
        model.fit(x, y, batch_size=adaptive.batch_size, initial_epoch=epoch, epochs=epoch + 1,
                  verbose=0, callbacks=[adaptive])
    assert len(adaptive.choices) == 3
    assert all(32 <= b <= 1024 for _, _, b in adaptive.choices)
    assert sizes[1:] == [b for _, _, b in adaptive.choices[:2]]
    # sqrt rule, applied through the live multiplier: sqrt(B_now / B0).
    expected = math.sqrt(adaptive.batch_size / 32)
    assert float(model.optimizer.learning_rate_multiplier.numpy()) == pytest.approx(expected, rel=1e-6)
    assert all(phi > 0 for _, phi, _ in adaptive.choices)


def test_bad_arguments_and_models():
    with pytest.raises(ValueError, match=r"`min_batch_size` must be <= `max_batch_size`. Received: min_batch_size=64, max_batch_size=32"):
        kadapt.AdaptiveBatchSize(64, 32)
    with pytest.raises(ValueError, match=r"Received: min_batch_size=0"):
        kadapt.AdaptiveBatchSize(0, 32)
    with pytest.raises(ValueError, match=r"`initial_batch_size` must be in \[32, 64\]. Received: initial_batch_size=128"):
        kadapt.AdaptiveBatchSize(32, 64, initial_batch_size=128)
    with pytest.raises(ValueError, match=r"`lr_scaling` must be one of"):
        kadapt.AdaptiveBatchSize(32, 64, lr_scaling="cubic")
    x, y = _regression(64)
    plain = kadapt.accumulate(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), 16)
    plain.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"build the model with .*measure_noise=True"):
        plain.fit(x, y, batch_size=32, verbose=0, callbacks=[kadapt.AdaptiveBatchSize(32, 64)])
    with pytest.raises(ValueError, match=r"`min_batch_size` must exceed the micro-batch.*micro_batch_size=16"):
        _model("sgd").fit(x, y, batch_size=32, verbose=0, callbacks=[kadapt.AdaptiveBatchSize(16, 64)])


def test_step_cost_is_fitted_to_medians_so_a_stall_does_not_move_it():
    adaptive = kadapt.AdaptiveBatchSize(64, 1024)
    for _ in range(20):
        adaptive._record_step(64, 0.002 + 64e-5)
        adaptive._record_step(1024, 0.002 + 1024e-5)
    adaptive._record_step(64, 1.0)  # a garbage collection, say
    adaptive._record_step(752, 0.002 + 752e-5)  # a pass's ragged last batch
    alpha, beta = adaptive.step_cost()
    assert alpha == pytest.approx(0.002, rel=1e-6)
    assert beta == pytest.approx(1e-5, rel=1e-6)


class _Measured:
    """Stands in for a model: only the noise-scale EMAs the callback reads."""

    def __init__(self, trace, squared_norm):
        self.noise_scale = NoiseScale()
        self.noise_scale.trace.assign(trace)
        self.noise_scale.squared_norm.assign(squared_norm)


@pytest.mark.parametrize(
    "trace, squared_norm, expected",
    [(0.0, 0.0, None), (5.0, -1.0, math.inf), (5.0, 0.0, math.inf), (-1.0, 2.0, 0.0), (6.0, 2.0, 3.0)],
    ids=["nothing measured", "gradient below the noise", "gradient exactly zero", "no noise", "measured"],
)
def test_noise_scale_as_the_policy_reads_it(trace, squared_norm, expected):
    adaptive = kadapt.AdaptiveBatchSize(64, 1024)
    adaptive.set_model(_Measured(trace, squared_norm))
    assert adaptive.noise_scale() == (expected if expected is None else pytest.approx(expected))


def test_unresolved_noise_doubles_the_size_and_no_measurement_keeps_the_size():
    adaptive = kadapt.AdaptiveBatchSize(64, 1024, lr_scaling="none")
    for size in (64, 128):
        adaptive._record_step(size, 0.002 + size * 1e-5)
    adaptive.set_model(_Measured(0.0, 0.0))
    adaptive._decide(epoch=0)
    assert adaptive.batch_size == 64 and adaptive.choices == []
    adaptive.set_model(_Measured(5.0, -1.0))
    for epoch in range(5):
        adaptive._decide(epoch=epoch)
    # Efficiency 1 everywhere: the size with the best rows per second within
    # twice the current one, up to the largest.
    assert [b for _, _, b in adaptive.choices] == [128, 256, 512, 1024, 1024]
    assert all(math.isinf(phi) for _, phi, _ in adaptive.choices)
    # A measured noise scale may move further in one decision.
    adaptive.batch_size = 64
    adaptive.set_model(_Measured(1e6, 1.0))
    adaptive._decide(epoch=5)
    assert adaptive.batch_size == 1024
