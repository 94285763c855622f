"""`probe_micro_batch`: real trial steps, measured peaks, no trace left."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from helpers import OutOfMemoryOnReplicaAbove
from kadapt.batching import peak_search
from kadapt.batching import probe as probe_module
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.tensorflow import probe as trial_probe

ROWS = 256
SIDE = 28  # pixels: a row's activations outweigh the allocator's noise in a peak
SMALL_SIDE = 8  # pixels: where no peak is compared with another


def _cnn(batch_norm=False, jit_compile="auto", side=SIDE):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((side, side, 1)), keras.layers.Conv2D(32, 3, padding="same", activation="relu")]
    if batch_norm:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.3)]
    # 1x1: the activations, so the peaks, of a 3x3 convolution at a ninth of its arithmetic.
    layers += [keras.layers.Conv2D(32, 1, activation="relu"),
               keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    model = keras.Sequential(layers)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    return model


def _data(rows=ROWS, side=SIDE):
    rng = np.random.default_rng(0)
    return rng.random((rows, side, side, 1), dtype=np.float32), rng.integers(0, 10, rows)


def test_real_trials_choose_a_size_that_fits_near_a_known_fitting_one():
    # The budget is what 100 rows peaked at. The bounds hold whatever the
    # allocator draws (a trace's peak moves by up to ~20% on this CPU): the
    # probe's quality (>= 0.9x the largest, <= 5 trials) is checked on exact
    # and noisy curves below and where it trains in benchmarks/probe/probe.py.
    # Garbage of earlier tests, freed by a collection between the reference
    # and the trials, would shift every peak after it: collect it first.
    gc.collect()
    model = kadapt.accumulate(_cnn(), 1)
    x, y = _data()
    budget = device_budget(None, "CPU:0")
    reference = trial_probe.run_trial(model, (x, y, None), 100, budget)
    result = kadapt.probe_micro_batch(model, (x, y), memory_budget=reference.peak_bytes)
    chosen = result.micro_batch_size
    assert 50 <= chosen <= 150
    assert len(result.trials) <= peak_search.MAX_TRIALS
    # The probe's own rule: the largest size whose trial fitted with room for the noise it saw.
    search = peak_search.PeakSearch(None, result.budget.bytes)
    search.trials = list(result.trials)
    assert chosen == search.chosen()
    # A trace per size, but for the reference's 100 rows, traced already (the search may try them: a flake once).
    assert [t.compiles for t in result.trials] == [int(t.micro_batch_size != 100) for t in result.trials]
    assert result.memory_model.bytes_per_row > 0
    assert result.plan(512).num_micro_batches == int(np.ceil(512 / chosen))


def _dense(units=2048, jit_compile="auto"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((units,)), keras.layers.Dense(units)])
    model.compile(optimizer="adam", loss="mse", jit_compile=jit_compile)
    return model


def test_a_trials_peak_is_a_plain_training_steps_peak():
    # 16 MiB of weights and 32 MiB of Adam slots: a snapshot of them on the
    # device would add 48 MiB to every trial's peak. A step of 4 rows adds a
    # gradient and its sum (32 MiB) to what is resident; allocator rounding
    # moves a peak by at most a chunk of the size of a gradient (16 MiB).
    model = kadapt.accumulate(_dense(), 2)
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 2048), dtype=np.float32), rng.random((4, 2048), dtype=np.float32)
    model.train_on_batch(x, y)  # trace, and build the optimizer's slots
    plain = []
    for _ in range(3):
        tf.config.experimental.reset_memory_stats("CPU:0")
        model.train_on_batch(x, y)
        plain.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    budget = device_budget("8GiB", "CPU:0")
    with trial_probe.leaves_no_trace(model, (x, y, None)):
        trial = trial_probe.run_trial(model, (x, y, None), 2, budget)
    snapshot = 3 * 2048 * 2049 * 4
    assert abs(trial.peak_bytes - max(plain)) < snapshot / 3


def test_a_trial_measures_five_steps_whether_or_not_it_fits():
    # Step peaks spread with the timing of ops run in parallel (docs/probe.md): five steps show
    # more of it than three. A trial over the budget runs them all: a `fit` stopped early left
    # its data alive until a collection, under the steps after it.
    model = kadapt.accumulate(_dense(64), 2)
    x = np.ones((4, 64), "float32")
    with trial_probe.leaves_no_trace(model, (x, x, None)):
        fits = trial_probe.run_trial(model, (x, x, None), 2, device_budget("8GiB", "CPU:0"))
        over = trial_probe.run_trial(model, (x, x, None), 2, device_budget(1000, "CPU:0"))
    assert fits.fits and len(fits.step_peaks) == trial_probe.MEASURED_STEPS == 5
    assert not over.fits and len(over.step_peaks) == 5


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
    # The shape of benchmarks/probe/probe.py's small CNN: a line, a plateau, a jump.
    "plateau": lambda m: 45e6 + 5.1e6 * m if m < 150 else (960e6 if m <= 193 else 1.2e9),  # 193
}


@pytest.mark.parametrize("name", CURVES)
def test_search_on_exact_curves_meets_the_targets(name):
    curve = CURVES[name]
    cap = 4096
    largest = max(m for m in range(1, cap + 1) if curve(m) <= BUDGET)
    search = peak_search.PeakSearch(_simulated(curve), BUDGET)
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
    search = peak_search.PeakSearch(runner, BUDGET)
    chosen = search.largest(4096)
    assert 0.9 * room <= chosen <= room
    assert len(search.trials) <= 5


def test_search_returns_the_cap_when_it_fits():
    search = peak_search.PeakSearch(_simulated(CURVES["affine"]), BUDGET)
    # 16 rows peak at 248 MB: budget / that per row promises >= 58 rows.
    assert search.largest(50) == 50
    assert [t.micro_batch_size for t in search.trials] == [16, 50]


def test_trials_leave_no_trace():
    model = _cnn(batch_norm=True, side=SMALL_SIDE)
    x, y = _data(side=SMALL_SIDE)
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    before = [v.numpy().copy() for v in model.variables + model.optimizer.variables + model.metrics_variables]
    kadapt.probe_micro_batch(model, (x, y), memory_budget="1GiB", max_micro_batch_size=64)
    after = [v.numpy() for v in model.variables + model.optimizer.variables + model.metrics_variables]
    assert len(before) == len(after)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)
    assert int(model.optimizer.iterations) == 2


# XLA: as Keras runs the step on a GPU (`jit_compile="auto"` is True there).
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_cap_reached_in_one_trial_when_everything_fits(jit_compile):
    model = _dense(64, jit_compile=jit_compile)
    x = np.ones((16, 64), "float32")
    result = kadapt.probe_micro_batch(model, (x, x), memory_budget="8GiB")
    assert result.micro_batch_size == 16
    assert len(result.trials) == 1
    assert result.compiles == result.trials[0].compiles == 1  # one size, one trace


def test_out_of_memory_during_a_trial_counts_as_not_fitting():
    keras.utils.set_random_seed(0)
    # ResourceExhaustedError raised in the traced step, as a real allocation
    # raises it after 10 s of the allocator's retries (outside a strategy, the
    # one replica is replica 0).
    model = keras.Sequential([keras.Input((5,)), OutOfMemoryOnReplicaAbove(47, 0), keras.layers.Dense(3)])
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
    # Everything fits: trials of 16 and the cap (64), then the powers of two between (32).
    model = _cnn(side=SMALL_SIDE)
    x, y = _data(rows=64, side=SMALL_SIDE)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    result = kadapt.probe_micro_batch(model, dataset, memory_budget="4GiB", prefer="fastest")
    fitting = [t for t in result.trials if t.fits]
    fastest = max(fitting, key=lambda t: t.samples_per_second)
    assert result.micro_batch_size == fastest.micro_batch_size
    assert len(fitting) >= 3


def test_budget_smaller_than_one_sample():
    x = np.ones((4, 64), "float32")  # trials of 4 rows, then 1
    with pytest.raises(ValueError, match=r"`memory_budget` is smaller than one sample's training step.*Received: memory_budget=1,000 bytes"):
        kadapt.probe_micro_batch(_dense(64), (x, x), memory_budget=1000)


def test_a_budget_below_the_data_given_as_arrays_names_the_data():
    x = np.ones((4, 64), "float32")  # x and y: 2 x 1,024 bytes, over a 1,000-byte budget
    with pytest.raises(ValueError, match=r"The data given as arrays \(2,048 bytes\) counts in the same memory.*"
                                         r"`tf.data.Dataset`.*Received: memory_budget=1,000 bytes, data arrays of 2,048 bytes"):
        kadapt.probe_micro_batch(_dense(64), (x, x), memory_budget=1000)
    dataset = tf.data.Dataset.from_tensor_slices((x, x)).batch(4)
    with pytest.raises(ValueError, match=r"smaller than one sample's training step") as raised:
        kadapt.probe_micro_batch(_dense(64), dataset, memory_budget=1000)
    assert "data given as arrays" not in str(raised.value)  # a dataset is read in batches


def test_bad_probe_arguments():
    x, y = _data(rows=8)
    with pytest.raises(ValueError, match=r"`prefer` must be one of \('largest', 'fastest'\). Received: prefer='smallest'"):
        kadapt.probe_micro_batch(_cnn(), (x, y), prefer="smallest")
    with pytest.raises(TypeError, match=r"`data` must be `\(x, y\)`.*Received: data of type ndarray"):
        kadapt.probe_micro_batch(_cnn(), x)
    uncompiled = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"`model` must be compiled before probing"):
        kadapt.probe_micro_batch(uncompiled, (x, y))
