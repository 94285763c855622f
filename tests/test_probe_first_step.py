"""The probe's trial is the step `fit` runs: its peak predicts the real steps', and first
steps over the budget shrink by both measurements."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from kadapt.batching import auto_micro_batch
from kadapt.batching import probe
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.memory_model import MemoryModel
from kadapt.batching.peak_search import NOISE_SIGMAS
from kadapt.batching.tensorflow.fit_trial import StepPeaks

ROWS = 2048
BATCH = 256
SIDE = 16
PREFETCHED_BATCHES = 4
MIB = 2**20


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KADAPT_CACHE_DIR", str(tmp_path / "cache"))


def _conv():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((SIDE, SIDE, 3)),
                              keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_the_chosen_trials_peak_is_the_real_steps_within_the_noise():
    gc.collect()
    rng = np.random.default_rng(0)
    x, y = rng.random((ROWS, SIDE, SIDE, 3), dtype=np.float32), rng.integers(0, 10, ROWS)
    # 16 MiB a step of 128 rows, 20 MiB one of 256 (measured). A dataset of tensors made once:
    # `fit` given arrays copies them into the allocator in some fits of a process and not in
    # others (docs/probe.md), which no trial can foresee.
    dataset = tf.data.Dataset.from_tensor_slices((tf.constant(x), tf.constant(y))).batch(BATCH)
    budget = tf.config.experimental.get_memory_info("CPU:0")["current"] + 10 * MIB
    model = kadapt.accumulate(_conv(), "auto", memory_budget=budget)
    steps = StepPeaks("CPU:0")
    model.fit(dataset, epochs=1, verbose=0, callbacks=[steps])
    result, check = model.probe_result, model.first_step_check
    trial = next(t for t in result.trials if t.micro_batch_size == result.micro_batch_size)
    assert model.micro_batch_size == trial.micro_batch_size < BATCH
    # The highest step of the epoch, within the room the probe keeps for the noise it saw (at
    # least 5%), plus the batches tf.data holds ahead of a step: how many depends on timing
    # (measured here: 13.5 to 16.0 MiB for the same step of 128 rows, fits of one process).
    ahead = PREFETCHED_BATCHES * BATCH * SIDE * SIDE * 3 * 4
    band = max(NOISE_SIGMAS * _pooled_noise(result.trials), 0.05) * trial.mean_peak_bytes + ahead
    assert abs(max(steps.peaks) - trial.mean_peak_bytes) <= band
    assert max(steps.peaks) <= result.budget.bytes
    assert check.peak_bytes <= max(steps.peaks) and check.shrunk_to is None


def _pooled_noise(trials):
    near = [np.asarray(t.step_peaks) / np.mean(t.step_peaks) for t in trials if t.fits]
    return float(np.sqrt(sum(np.sum((r - 1) ** 2) for r in near) / sum(len(r) - 1 for r in near)))


# The probe's trials that fitted: mean peaks (MB) of 16, 37, 48 and 64 rows, not monotonic above 37.
TRIALS = ((16, 23.7e6), (37, 40.7e6), (48, 49.0e6), (64, 46.0e6))


@pytest.mark.parametrize(
    "size, peak, expected",
    [
        (64, 49.0e6, 64),  # within the budget
        # 4 MB above the trial at 64, a share in proportion to the rows below it: 48 rows would
        # peak at 49 + 3 MB, over, 37 at 40.7 + 2.3 MB; the line, (49.5 - 50 + 0.5 x 64) x 0.95 /
        # 0.5 = 59.
        (64, 50.0e6, 59),
        # 12 MB above: the line says (49.5 - 58 + 32) x 0.95 / 0.5 = 44; 37 rows measured at
        # 40.7 + 12 x 37 / 64 MB fit, 48 at 49 + 9 do not; the larger, 44.
        (64, 58.0e6, 44),
        # 30 MB above: the line says 10, its floor is half (32); 37 rows measured would peak at
        # 40.7 + 17.3 MB, over; 16 at 23.7 + 7.5 fit.
        (64, 76.0e6, 32),
        # No trial at 60 rows: the line moved through the point, (49.5 - 55 + 0.5 x 60) x 0.95 / 0.5.
        (60, 55.0e6, 46),
    ],
)
def test_a_first_step_over_the_budget_shrinks_by_both_measurements(size, peak, expected):
    line = MemoryModel(15e6, 0.5e6)
    assert auto_micro_batch.size_after_first_step(size, int(peak), int(49.5e6), line, TRIALS) == expected


def test_measured_trials_lift_the_shrink_above_the_lines_answer():
    # The line (0.2 MB a row) moved through 52 MB at 64 rows says (49.5 - 39.2) x 0.95 / 0.2 = 48;
    # the trial at 56 rows, measured at 38 MB, fits with this process's 6 MB more (its share,
    # 5.25 MB, or all of it).
    trials = ((16, 20e6), (56, 38e6), (64, 46e6))
    line = MemoryModel(10e6, 0.2e6)
    assert auto_micro_batch.size_after_first_step(64, int(52e6), int(49.5e6), line, trials) == 56


def test_the_excess_over_a_trial_counts_for_smaller_sizes_in_proportion_to_their_rows():
    # Issue 44's cached 40 rows (26 micro-batches with a tail) peaked at 53.9 MiB of 48 in a
    # fresh process, 8.6 MB over their trial. The whole excess on 34 rows' trial (42.5 MB) is
    # 51.1 MB, over 50.3, and the shrink fell to the line's floor, half (20); 34 / 40 of it,
    # 7.3 MB, fits.
    mib = 2**20
    trials = ((16, 23.7e6), (34, 42.5e6), (40, 47.9e6))
    line = MemoryModel(35.9e6, 0.3e6)
    assert auto_micro_batch.size_after_first_step(40, int(53.9 * mib), 48 * mib, line, trials) == 34
    # Without the trial at 40 rows nothing says how much higher this process runs: the line.
    assert auto_micro_batch.size_after_first_step(40, int(53.9 * mib), 48 * mib, line, trials[:2]) == 20


def test_a_cached_size_that_overflows_shrinks_to_the_probes_fallback():
    # Measured on an Intel Xeon (benchmarks/README.md#probe): a probe chose 40 rows (16: 34.0 MiB, 40:
    # 40.2 MiB a step); a fresh process reusing it peaked at 53.9 MiB of 48 and shrank down
    # the line to its floor, 20. With the fallback trial at 32 rows (30.4 MiB where another probe
    # chose 40) it shrinks to 32.
    mib = 2**20
    line = MemoryModel(29.9 * mib, 0.26 * mib)  # through the trials at 16 and 40
    trials = ((16, 34.0 * mib), (40, 40.2 * mib))
    assert auto_micro_batch.size_after_first_step(40, int(53.9 * mib), 48 * mib, line, trials) == 20
    trials += ((32, 30.4 * mib),)
    assert auto_micro_batch.size_after_first_step(40, int(53.9 * mib), 48 * mib, line, trials) == 32


def test_where_the_probe_saw_a_jump_the_shrink_takes_only_measured_sizes():
    # Measured on an Intel Xeon (benchmarks/README.md#probe): a probe chose 64 rows (16: 34.0 MiB,
    # 64: 47.4 MiB; 69 and 74 failed 30-40% above the line). A fresh process reusing 64 peaked at
    # 54.0 MiB: the line moved through it says 40, which jumps (it peaked at 52.7 MiB there).
    mib = 2**20
    line = MemoryModel(29.5 * mib, 0.279 * mib)  # through the trials at 16 and 64
    trials = ((16, 34.0 * mib), (64, 47.4 * mib))
    assert auto_micro_batch.size_after_first_step(64, int(54.0 * mib), 48 * mib, line, trials) == 40
    # With the jump known: a measured size (16 fits with this process's share of 6.6 MiB) or
    # half of 64, the larger.
    assert auto_micro_batch.size_after_first_step(64, int(54.0 * mib), 48 * mib, line, trials, True) == 32
    trials += ((52, 41.0 * mib),)  # a fallback that fitted: 41 + 6.6 x 52 / 64 = 46.4 MiB
    assert auto_micro_batch.size_after_first_step(64, int(54.0 * mib), 48 * mib, line, trials, True) == 52


# Issue 44's net on an Intel Xeon, oneDNN on, 48 MiB (MiB; benchmarks/README.md#probe): a probe
# that chose 40 rows (16+ 64x 40+ 57x 47x; nothing measured between 16 and 40), and one that
# chose 64 (16+ 64+ 69x 74x). Their cached sizes peaked at 53.9 and 59.2 MiB in fresh processes;
# 32 rows trained at 42.3-42.4 MiB wherever a process shrank to them, and 52 peaked at 46-52 MiB
# in the probes that tried it.
PROBE_40 = {16: (34.0, 34.0, 34.0), 64: (59.4, 59.4, 59.4), 40: (39.1, 40.5, 41.0),
            57: (53.5, 60.5, 62.7), 47: (44.3, 48.9, 44.3)}
PROBE_64 = {16: (34.0, 34.0, 34.0), 64: (47.4, 47.4, 47.4), 69: (60.2, 65.0, 65.8), 74: (70.9, 70.7, 67.9)}


def _probe_trials(steps):
    def trial(size, peaks):
        step_peaks = tuple(int(p * MIB) for p in peaks)
        return probe.ProbeTrial(size, max(step_peaks), 1e-4, max(step_peaks) <= 48 * MIB, step_peaks)

    return [trial(size, peaks) for size, peaks in steps.items()]


class _ScriptedModel:
    """A model whose steps peak at `peaks[micro_batch_size]` MiB (no training)."""

    def __init__(self, size, peaks, monkeypatch):
        self.micro_batch_size, self.peaks, self.train_function = size, peaks, None
        monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", lambda device: None)
        monkeypatch.setattr(tf.config.experimental, "get_memory_info",
                            lambda device: {"peak": int(self.peaks[self.micro_batch_size] * MIB), "current": 0})

    def make_train_function(self):
        return lambda iterator: {}


def _check(steps, size, peaks, monkeypatch):
    """A cached `size` checked where it trains, and its cache entry's key."""
    trials = _probe_trials(steps)
    auto_micro_batch._write_cache("key", {"micro_batch_size": size, "probe": {"trials": []}})
    fitting = auto_micro_batch._measured(trials)
    line = MemoryModel.fit([m for m, _ in fitting[-2:]], [p for _, p in fitting[-2:]])
    fallback = auto_micro_batch.unmeasured_fallback(trials, size, 1024)
    model = _ScriptedModel(size, peaks, monkeypatch)
    check = auto_micro_batch.FirstStepCheck(model, device_budget(48 * MIB), 1024, line, fitting,
                                            auto_micro_batch._jumped(trials, size), fallback, "key")
    model.train_function = check
    return model, check


def test_a_cached_size_that_overflows_falls_back_and_checks_the_fallbacks_steps(monkeypatch):
    model, check = _check(PROBE_40, 40, {40: 53.9, 32: 42.4}, monkeypatch)
    assert check.fallback == 32  # 0.8 x 40; the probe ran no trial for it
    check(None)  # 53.9 MiB of 48: over
    assert model.micro_batch_size == 32 and model.train_function is check  # still checking
    check(None)
    check(None)  # two steps at 32 within the budget: kept, and later processes start from it
    assert model.micro_batch_size == check.shrunk_to == 32 and model.train_function is not check
    assert check.steps == 3 and check.fallback_peak_bytes == int(42.4 * MIB)
    assert auto_micro_batch._read_cache()["key"]["micro_batch_size"] == 32
    # Without the fallback the shrink had only 16 measured: half of 40 (0.57 x the reference 35).
    assert auto_micro_batch.size_after_first_step(40, int(53.9 * MIB), 48 * MIB, check.memory_model,
                                                  check.trials, True) == 20


def test_a_fallback_that_overflows_shrinks_to_the_measured_rule_and_is_remembered(monkeypatch):
    model, check = _check(PROBE_64, 64, {64: 59.2, 52: 50.9, 32: 42.0}, monkeypatch)
    assert check.fallback == 52
    check(None)
    check(None)  # 52 at 50.9 MiB: over; half of 64, 16 measured being smaller
    assert model.micro_batch_size == check.shrunk_to == 32 and model.train_function is not check
    entry = auto_micro_batch._read_cache()["key"]
    assert entry["micro_batch_size"] == 64 and entry["checked"] == {"52": int(50.9 * MIB)}
    # A later process where 64 overflows skips the fallback measured over the budget.
    assert auto_micro_batch.unmeasured_fallback(_probe_trials(PROBE_64), 64, 1024, entry["checked"]) is None


def test_no_fallback_without_a_jump_above_or_with_a_trial_near_below():
    assert auto_micro_batch.unmeasured_fallback(_probe_trials(PROBE_40), 40, 1024) == 32
    # A probe that chose 34 had 28 fitted (0.82 x 34): the measured sizes decide.
    steps = {**PROBE_40, 40: (57.8, 50.0, 52.5), 28: (31.8, 31.9, 32.2), 34: (33.2, 31.9, 33.2)}
    assert auto_micro_batch.unmeasured_fallback(_probe_trials(steps), 34, 1024) is None
    smooth = {16: (20.0, 20.0, 20.0), 64: (32.0, 32.0, 32.0), 128: (49.0, 49.0, 49.0)}
    assert auto_micro_batch.unmeasured_fallback(_probe_trials(smooth), 64, 1024) is None
