"""`PeakSearch` on simulated peak curves that are not monotonic in rows (no TensorFlow)."""

import math

import numpy as np
import pytest

from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.batching.peak_search import MAX_TRIALS
from kadapt.batching.peak_search import TYPICAL_TRIALS
from kadapt.batching.peak_search import PeakSearch
from kadapt.batching.probe import ProbeTrial

# A policy: no trial runs, so it holds on either backend.
pytestmark = pytest.mark.backends("tensorflow", "jax")

MB = 1e6
BUDGET = int(48 * 2**20)  # 50.3 MB, the issue's budget
LOGICAL = 1024
STEADY = (1.0, 0.99, 1.0)  # three steps' peaks over their curve value
# Where the kernels jump, the steps' peaks spread too (the issue's 71 rows: 68.8 / 78.5 / 72.6 MB).
JUMPY = (1.0, 1.14, 1.055)


def trained(size):
    return balanced_micro_batch(LOGICAL, size)


def ragged(size):
    return LOGICAL % size != 0


# Shaped on the issue's trials (a two-conv net on an AMD EPYC, oneDNN on): a line of 0.54 MB a
# row over 15 MB; a logical batch split with a ragged tail above 48 rows takes another 20 MB.
def issue_curve(size):
    return 15.1 * MB + 0.54 * MB * size + (20 * MB if size > 48 and ragged(size) else 0)


# A kernel with a large scratch space in a band of sizes, below sizes that fit again.
def band_curve(size):
    return 8 * MB + 0.3 * MB * size + (30 * MB if 100 <= size <= 120 else 0)


# Steps of a few MB every 16 rows (a kernel's tiling), over a line.
def staircase_curve(size):
    return 10 * MB + 0.25 * MB * size + 3 * MB * (size // 16 % 3)


CURVES = {"issue": issue_curve, "band": band_curve, "staircase": staircase_curve}


def _runner(curve, seen=None):
    def runner(size):
        factors = JUMPY if ragged(size) and size > 48 and curve is issue_curve else STEADY
        peaks = tuple(int(curve(size) * f) for f in factors)
        if seen is not None:
            seen.append(size)
        return ProbeTrial(size, max(peaks), 1e-4, max(peaks) <= BUDGET, peaks)

    return runner


def _largest_fitting(curve):
    sizes = {trained(m) for m in range(1, LOGICAL + 1)}
    return max(m for m in sizes if curve(m) * max(STEADY) <= BUDGET)


@pytest.mark.parametrize("name", CURVES)
def test_search_on_non_monotonic_curves_chooses_close_to_the_largest_that_fits(name):
    curve = CURVES[name]
    search = PeakSearch(_runner(curve), BUDGET, trained)
    chosen = search.largest(LOGICAL)
    assert any(t.micro_batch_size == chosen and t.fits for t in search.trials)
    assert curve(chosen) * max(STEADY) <= BUDGET
    assert chosen >= 0.85 * _largest_fitting(curve)
    assert len(search.trials) <= TYPICAL_TRIALS  # no insurance trial after the choice
    assert all(t.micro_batch_size == trained(t.micro_batch_size) for t in search.trials)


def test_the_issue_curve_keeps_64_rows_after_69_jumps_over():
    # The issue's run chose 37 rows: 59 did not fit though 64 had, and the spread of the
    # jumping sizes' peaks was pooled into the room for noise of every size.
    search = PeakSearch(_runner(issue_curve), BUDGET, trained)
    assert search.largest(LOGICAL) == 64 == _largest_fitting(issue_curve)
    # 69 peaks 40% above the line through 16 and 64 (a jump): the search looks past it once.
    # No fallback trial at 52 (0.8 x 64): a process where 64 overflows checks it there.
    assert [t.micro_batch_size for t in search.trials] == [16, 64, 69, 74]
    assert [t.fits for t in search.trials] == [True, True, False, False]


def test_a_size_that_fits_is_kept_when_a_smaller_one_did_not():
    # Scripted trials: 16 fits, 64 fits near the budget, 59 (tried next, say by an earlier
    # policy) does not. The search still chooses 64.
    peaks = {16: 23.7 * MB, 64: 49.7 * MB, 59: 66.5 * MB}
    search = PeakSearch(lambda size: None, BUDGET, trained)
    for size, peak in peaks.items():
        search.trials.append(ProbeTrial(size, int(peak), 1e-4, peak <= BUDGET, (int(peak),) * 3))
    assert search.chosen() == 64
    assert search.next_size(LOGICAL) in (None, 69)  # nothing below 64 is looked at again


def test_the_noise_room_comes_from_the_sizes_that_fit():
    search = PeakSearch(lambda size: None, BUDGET)
    steady = ProbeTrial(64, int(49.7 * MB), 1e-4, True, (int(49.7 * MB),) * 3)
    jumpy = ProbeTrial(69, int(78.5 * MB), 1e-4, False, tuple(int(p * MB) for p in (68.8, 78.5, 72.6)))
    search.trials = [steady, jumpy]
    assert search.noise() == 0.0 and search.safe(steady)
    spread = ProbeTrial(60, int(46 * MB), 1e-4, True, tuple(int(p * MB) for p in (44, 46, 45)))
    search.trials.append(spread)
    relative = np.asarray([44, 46, 45]) / 45
    pooled = math.sqrt(float(np.sum((relative - 1) ** 2)) / 4)  # 2 + 2 degrees of freedom
    assert search.noise() == pytest.approx(pooled)
    assert not search.safe(steady)  # 49.7 MB x (1 + 2 x 1.8%) is over 50.3 MB


def test_out_of_memory_at_every_size_above_the_first_stops_at_eight_trials():
    # Every trial's steps peak at a third of the budget and yet raise out of memory above 16
    # rows: nothing foretells it, and the search must still end.
    def runner(size):
        if size > 16:
            return ProbeTrial(size, None, None, False)
        return ProbeTrial(size, BUDGET // 3, 1e-4, True, (BUDGET // 3,) * 3)

    search = PeakSearch(runner, BUDGET, trained)
    assert search.largest(LOGICAL) == 16
    assert len(search.trials) <= MAX_TRIALS


def test_noisy_steps_keep_room_for_the_noise_within_eight_trials():
    # Each size's steps spread by 15%: the size chosen has room for two pooled deviations.
    def runner(size):
        peaks = tuple(int((20 * MB + 0.4 * MB * size) * f) for f in (0.87, 1.0, 1.15))
        return ProbeTrial(size, max(peaks), 1e-4, max(peaks) <= BUDGET, peaks)

    search = PeakSearch(runner, BUDGET)
    chosen = search.largest(LOGICAL)
    assert len(search.trials) <= MAX_TRIALS
    noise = search.noise()
    assert noise > 0.1
    chosen_trial = next(t for t in search.trials if t.micro_batch_size == chosen)
    assert chosen_trial.mean_peak_bytes * (1 + 2 * noise) <= BUDGET


def test_a_sizes_room_comes_from_the_steps_measured_near_it():
    # 34 rows fit with steady steps; 64 rows fit too, their steps spread by 6%. Pooled over
    # every fitting size of at least half the largest, 64's spread took 9% room from 34 and
    # left 16 chosen; a size's room is the spread of the steps at and near it (NEIGHBOURS x),
    # so 34 is chosen and 64 is not.
    search = PeakSearch(lambda size: None, BUDGET, trained)
    steps = {16: (23.7, 23.6, 23.7), 34: (48.5, 48.6, 48.5), 64: (44.0, 50.0, 47.0)}
    for size, peaks in steps.items():
        step_peaks = tuple(int(p * MB) for p in peaks)
        search.trials.append(ProbeTrial(size, max(step_peaks), 1e-4, max(step_peaks) <= BUDGET, step_peaks))
    assert all(t.fits for t in search.trials)
    assert search.noise(34) < 0.002 < 0.05 < search.noise(64)
    assert search.chosen() == 34
    assert not search.safe(search.trials[2])  # 47 MB x (1 + 2 x 6.4%) is over 50.3 MB


def test_a_wide_spread_at_the_edge_is_kept_as_room_at_that_size():
    # 34's own steps spread by 4%: its room is its own (16's steady steps are not its
    # neighbours), so it fits and is not chosen, and the search looks below it.
    search = PeakSearch(lambda size: None, BUDGET, trained)
    steps = {16: (23.7, 23.6, 23.7), 34: (46.0, 50.0, 48.0)}
    for size, peaks in steps.items():
        step_peaks = tuple(int(p * MB) for p in peaks)
        search.trials.append(ProbeTrial(size, max(step_peaks), 1e-4, True, step_peaks))
    assert search.noise(34) > 0.04
    assert search.chosen() == 16
    assert 16 < search.next_size(LOGICAL) < 34


def test_a_jump_above_the_choice_is_known():
    search = PeakSearch(_runner(issue_curve), BUDGET, trained)
    assert search.largest(LOGICAL) == 64
    assert search.jumped_above(64) and not search.jumped_above(74)
    smooth = PeakSearch(_runner(lambda m: 10 * MB + 0.3 * MB * m), BUDGET, trained)
    assert not smooth.jumped_above(smooth.largest(LOGICAL))


def test_bisection_takes_the_trained_size_nearest_the_middle():
    # A conv_bn probe on an Intel Xeon (benchmarks/README.md#probe; peaks here simulated): 16 and 64
    # rows fitted, 147 did not, 103 then 114 fitted and 114 was chosen (0.78 x 147). 1024 rows train
    # as ..., 103, 114, 128, 147 only: the middle of 64 and 147 is 105 (103 the nearest); the middle
    # of 103 and 147 is 125, which trains as 114, but 128 is nearer.
    mib = 2**20
    steps = {16: (35.0, 35.2, 35.0), 64: (60.0, 60.2, 60.0), 147: (129.0, 129.5, 129.0),
             103: (88.0, 88.1, 88.0)}
    search = PeakSearch(lambda size: None, 128 * mib, trained)
    for size, peaks in steps.items():
        step_peaks = tuple(int(p * mib) for p in peaks)
        fits = max(step_peaks) <= 128 * mib
        search.trials.append(ProbeTrial(size, max(step_peaks), 1e-4, fits, step_peaks))
        if size == 147:
            assert search.predicted() >= 147  # the line is no guide below 147: bisection
            assert search.next_size(LOGICAL) == 103
    assert search.predicted() >= 147
    assert search.next_size(LOGICAL) == 128


# A probe of small_cnn at 64 MiB on an Intel Xeon (MiB): 147 and 171 rows jump over the line
# through 64 and 128 (benchmarks/README.md#probe).
SMALL_CNN_STEPS = {16: (14.6, 14.6, 14.6), 64: (25.3, 29.2, 25.3), 128: (48.6, 48.6, 48.6),
                   147: (66.4, 63.9, 67.8), 171: (82.5, 73.6, 68.8), 103: (45.8, 46.0, 49.9)}


def _measured_runner(steps, budget):
    def runner(size):
        peaks = tuple(int(p * 2**20) for p in steps[size])
        return ProbeTrial(size, max(peaks), 1e-4, max(peaks) <= budget, peaks)

    return runner


def test_a_choice_after_a_jump_runs_no_insurance_trial():
    # small_cnn at 64 MiB: 128 rows at 48.6 MiB (24% free), 147 and 171 jumped above the line.
    budget = 64 * 2**20
    search = PeakSearch(_measured_runner(SMALL_CNN_STEPS, budget), budget, trained)
    assert search.largest(LOGICAL) == 128 and search.jumped_above(128)
    assert [t.micro_batch_size for t in search.trials] == [16, 64, 128, 147, 171]


# A probe of two_conv at 128 MiB with oneDNN off (the BFC allocator) on an Intel Xeon (MiB;
# benchmarks/README.md#probe): 128 rows at 120.2 MiB (6% free), 147 and 171 far above the
# line through 64 and 128. The cached 128s trained at 120.4-123.0 MiB in every process.
BFC_STEPS = {16: (73.6, 71.8, 73.6), 64: (89.8, 89.8, 89.8), 128: (120.2, 120.2, 120.2),
             147: (166.4, 166.4, 166.4), 171: (193.5, 193.5, 188.7), 103: (123.3, 123.2, 127.6)}


def test_a_choice_near_the_budget_after_a_jump_takes_five_trials():
    # The rule before ran a sixth trial at 103 (0.8 x 128) wherever the chosen size's trial left
    # under 20% of the budget free; here it ran in 5 probes of 5 and no process used it.
    budget = 128 * 2**20
    search = PeakSearch(_measured_runner(BFC_STEPS, budget), budget, trained)
    assert search.largest(LOGICAL) == 128 and search.jumped_above(128)
    assert [t.micro_batch_size for t in search.trials] == [16, 64, 128, 147, 171]


def _scripted(steps, budget, logical=None):
    """A search holding trials of the given step peaks (MiB), none run."""
    search = PeakSearch(lambda size: None, budget, trained, logical_batch_size=logical)
    for size, peaks in steps.items():
        step_peaks = tuple(int(p * 2**20) for p in peaks)
        search.trials.append(ProbeTrial(size, max(step_peaks), 1e-4, max(step_peaks) <= budget, step_peaks))
    return search


def test_bisection_tries_a_size_that_splits_the_logical_batch_evenly_first():
    # small_cnn at 64 MiB (MiB, measured on an Intel Xeon): 16 and 64 fitted, 171 did not. The
    # middle of 64 and 171 trains as 114 (9 micro-batches, a tail of 112), which peaked at
    # 49.6-67.8 MiB over 182 steps of 9 processes; 128 (8 even ones) at 35.0-56.7 over as many.
    steps = {16: (14.6, 14.6, 14.6, 14.6, 14.6), 64: (25.3, 25.3, 25.3, 25.3, 25.3),
             171: (95.6, 82.2, 96.9)}
    budget = 64 * 2**20
    assert _scripted(steps, budget).next_size(LOGICAL) == 114  # the trained size nearest the middle
    assert _scripted(steps, budget, LOGICAL).next_size(LOGICAL) == 128
    # Between 16 and 64 (a jump over at 64), 1024 rows split evenly as 32.
    two_conv = _scripted({16: (23.7,) * 5, 64: (66.5, 66.7, 69.0)}, BUDGET, LOGICAL)
    assert two_conv.next_size(LOGICAL) == 32


def test_a_size_that_fits_without_room_does_not_hide_the_sizes_above_it():
    # small_cnn at 64 MiB, steps measured in two processes (MiB): 114 rows fitted, too spread for
    # the room; 103 fitted with room, and nothing trains between them. Peaks need not grow with
    # the rows, so the search tries the next size up, 128, before settling for 103 (0.80x of 128).
    steps = {16: (14.6,) * 5, 64: (25.3,) * 5, 114: (54.4, 60.3, 58.4, 61.8, 54.4),
             103: (45.3, 48.4, 50.5, 47.8, 54.5)}
    search = _scripted(steps, 64 * 2**20, LOGICAL)
    assert search.trials[2].fits and not search.safe(search.trials[2]) and search.chosen() == 103
    assert search.next_size(LOGICAL) == 128
    search.trials.append(ProbeTrial(128, int(48.6 * 2**20), 1e-4, True, (int(48.6 * 2**20),) * 5))
    assert search.chosen() == 128 and search.next_size(LOGICAL) is None  # five trials
    # A size that did not fit at all is no such case: the search ends below it.
    over = _scripted({**steps, 114: (54.4, 66.1, 58.4)}, 64 * 2**20, LOGICAL)
    assert over.next_size(LOGICAL) is None and over.chosen() == 103
