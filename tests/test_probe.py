"""`probe_micro_batch`: real trial steps, measured peaks, no trace left."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from helpers import OutOfMemoryAbove
from kadapt.batching import probe as probe_module

ROWS = 256


def _cnn(batch_norm=False):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, padding="same", activation="relu")]
    if batch_norm:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.3)]
    layers += [keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
               keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    model = keras.Sequential(layers)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _data(rows=ROWS):
    rng = np.random.default_rng(0)
    return rng.random((rows, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, rows)


def test_real_trials_choose_a_size_that_fits_near_a_known_fitting_one():
    model = kadapt.accumulate(_cnn(), 1)
    x, y = _data()
    budget = probe_module.device_budget(None, "CPU:0")
    # Set the budget to what a micro-batch of 100 really peaked at. Each
    # trial is a new trace whose peak differs by up to ~20% on this CPU
    # (allocator state, kernel choice), so the bounds here are loose; the
    # 0.9x target is checked on exact curves below and in benchmarks/probe.py.
    reference = probe_module.run_trial(model, (x, y, None), 100, budget)
    result = kadapt.probe_micro_batch(model, (x, y), memory_budget=reference.peak_bytes)
    chosen = result.micro_batch_size
    assert 70 <= chosen <= 130
    assert len(result.trials) <= 5
    assert any(t.micro_batch_size == chosen and t.fits for t in result.trials)
    assert not probe_module.run_trial(model, (x, y, None), 2 * chosen, result.budget).fits
    assert result.memory_model.bytes_per_row > 0
    assert result.plan(512).num_micro_batches == int(np.ceil(512 / chosen))


def _simulated(curve, out_of_memory_above=None):
    """A trial runner over an exact memory curve (bytes as a function of rows)."""

    def runner(size):
        if out_of_memory_above is not None and size > out_of_memory_above:
            return probe_module.ProbeTrial(size, None, None, False)
        peak = int(curve(size))
        return probe_module.ProbeTrial(size, peak, 1e-4, peak <= BUDGET)

    return runner


BUDGET = 1_000_000_000
CURVES = {
    "affine": lambda m: 200e6 + 3e6 * m,  # largest 266
    "affine, small fixed part": lambda m: 5e6 + 0.5e6 * m,  # 1990
    "convex": lambda m: 100e6 + 2e6 * m + 4e3 * m**2,  # 286
    "mildly concave": lambda m: 150e6 + 6e6 * m**0.85,  # 339
    "steps of 64 MiB": lambda m: 2**26 * np.ceil((100e6 + 2.5e6 * m) / 2**26),  # 335
    # The shape of benchmarks/probe.py's small CNN: a line, a plateau, a jump.
    "plateau": lambda m: 45e6 + 5.1e6 * m if m < 150 else (960e6 if m <= 193 else 1.2e9),  # 193
}


@pytest.mark.parametrize("name", CURVES)
def test_search_on_exact_curves_meets_the_targets(name):
    curve = CURVES[name]
    cap = 4096
    largest = max(m for m in range(1, cap + 1) if curve(m) <= BUDGET)
    search = probe_module.MicroBatchSearch(_simulated(curve), BUDGET)
    chosen = search.largest(cap)
    assert chosen <= largest
    assert chosen >= 0.9 * largest
    assert len(search.trials) <= 5
    assert any(t.micro_batch_size == chosen and t.fits for t in search.trials)


def test_search_keeps_room_for_the_noise_its_trials_saw():
    # Each trial's three steps peak at curve(m) x (1, 1.075, 1.15): a size
    # whose steps just fit may not fit in the next process.
    curve, factors = CURVES["affine"], np.array([1.0, 1.075, 1.15])

    def runner(size):
        peaks = tuple(int(curve(size) * f) for f in factors)
        return probe_module.ProbeTrial(size, max(peaks), 1e-4, max(peaks) <= BUDGET, peaks)

    sigma = np.std(factors / factors.mean(), ddof=1)  # the same relative spread at every size
    room = max(m for m in range(1, 4097) if curve(m) * factors.mean() * (1 + 2 * sigma) <= BUDGET)
    search = probe_module.MicroBatchSearch(runner, BUDGET)
    chosen = search.largest(4096)
    assert 0.9 * room <= chosen <= room
    assert len(search.trials) <= 5


def test_search_returns_the_cap_when_it_fits():
    search = probe_module.MicroBatchSearch(_simulated(CURVES["affine"]), BUDGET)
    # 16 rows peak at 248 MB: budget / that per row promises >= 58 rows.
    assert search.largest(50) == 50
    assert [t.micro_batch_size for t in search.trials] == [16, 50]


def test_trials_leave_no_trace():
    model = _cnn(batch_norm=True)
    x, y = _data()
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    before = [v.numpy().copy() for v in model.variables + model.optimizer.variables + model.metrics_variables]
    kadapt.probe_micro_batch(model, (x, y), memory_budget="1GiB", max_micro_batch_size=64)
    after = [v.numpy() for v in model.variables + model.optimizer.variables + model.metrics_variables]
    assert len(before) == len(after)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)
    assert int(model.optimizer.iterations) == 2


def test_cap_reached_in_one_trial_when_everything_fits():
    model = _cnn()
    x, y = _data(rows=16)
    result = kadapt.probe_micro_batch(model, (x, y), memory_budget="8GiB")
    assert result.micro_batch_size == 16
    assert len(result.trials) == 1


def test_out_of_memory_during_a_trial_counts_as_not_fitting():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), OutOfMemoryAbove(47), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((48, 5), "float32")
    trials = []
    result = kadapt.probe_micro_batch(
        model, (x, np.ones((48, 3), "float32")), memory_budget="8GiB", on_trial=trials.append
    )
    # 48 rows explode without any measured peak foreseeing it, so the probe
    # bisects between 16 (fits) and 48: 32, 40, 44, and ends at 5 trials.
    assert [t.micro_batch_size for t in trials] == [16, 48, 32, 40, 44]
    assert [t.fits for t in trials] == [True, False, True, True, True]
    assert trials[1].peak_bytes is None
    assert result.micro_batch_size == 44
    assert trials == list(result.trials)


def test_dataset_input_and_prefer_fastest():
    model = _cnn()
    x, y = _data(rows=128)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(128)
    result = kadapt.probe_micro_batch(model, dataset, memory_budget="4GiB", prefer="fastest")
    fitting = [t for t in result.trials if t.fits]
    fastest = max(fitting, key=lambda t: t.samples_per_second)
    assert result.micro_batch_size == fastest.micro_batch_size
    assert len(fitting) >= 3


def test_budget_smaller_than_one_sample():
    x, y = _data(rows=8)
    with pytest.raises(ValueError, match=r"`memory_budget` is smaller than one sample's training step.*Received: memory_budget=1,000 bytes"):
        kadapt.probe_micro_batch(_cnn(), (x, y), memory_budget=1000)


def test_bad_probe_arguments():
    x, y = _data(rows=8)
    with pytest.raises(ValueError, match=r"`prefer` must be one of \('largest', 'fastest'\). Received: prefer='smallest'"):
        kadapt.probe_micro_batch(_cnn(), (x, y), prefer="smallest")
    with pytest.raises(TypeError, match=r"`data` must be `\(x, y\)`.*Received: data of type ndarray"):
        kadapt.probe_micro_batch(_cnn(), x)
    uncompiled = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"`model` must be compiled before probing"):
        kadapt.probe_micro_batch(uncompiled, (x, y))
