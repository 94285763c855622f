"""The range test's curve: the rates it sweeps, the smoothed loss, and the
rules that read a suggested rate off it. Pure functions on arrays (NumPy).

The sweep and the smoothing follow fastai's `LRFinder` and `Recorder`
(fastai/callback/schedule.py, fastai/learner.py): the rate rises
exponentially, the loss is smoothed by a debiased exponential moving average
(beta 0.98), and the test stops once the smoothed loss exceeds 4 times its
best. The rules:

- `"valley"` (fastai's default, `valley` in fastai/callback/schedule.py,
  written by ESRI): the longest strictly decreasing run of the smoothed curve
  (a subsequence, not necessarily contiguous), and the point two thirds
  down it.
- `"steepest"` (Lightning's `Tuner.lr_find` suggestion,
  lightning/pytorch/tuner/lr_finder.py): the steepest descent of the smoothed
  loss, its gradient taken over log10(rate) as Lightning PR #21171 fixes
  (a gradient over the raw rate, as before, is biased towards high rates on
  a log-spaced sweep).
- `"minimum/10"` (fastai's `minimum`): the rate at the smoothed minimum
  divided by 10.

Before a rule reads the curve, its first `num_steps // 10` points (the
smoothing's start, where the debiased average still swings) and its last 5
(the climb into divergence) are dropped, as fastai's `lr_find` does.
"""

from __future__ import annotations

import numpy as np

SKIP_END = 5
FASTAI_SMOOTHING = 0.98  # fastai's beta, for its 100-step sweep: a horizon of half the sweep
MIN_SMOOTHING = 0.5


def sweep_rates(start: float, stop: float, num_steps: int) -> np.ndarray:
    """The rates of the sweep: `start * (stop / start) ** (i / (num_steps - 1))`.

    Evenly spaced in log(rate), both ends included (fastai's `SchedExp` stops
    one step short of `stop`; Lightning PR #21931 fixes the same skew).
    """
    return start * (stop / start) ** (np.arange(num_steps) / (num_steps - 1))


def sweep_smoothing(num_steps: int) -> float:
    """A moving average's beta whose horizon is half of a `num_steps` sweep.

    beta = 1 - 2 / num_steps, within [0.5, 0.98]: fastai's 0.98 at its 100
    steps (a horizon 1 / (1 - beta) of 50 steps), and the same horizon
    relative to the sweep for a shorter one. At 0.98, a 40-step sweep is
    shorter than the horizon: the debiased average stays near the running
    mean of every loss so far (on a linear curve it ends 0.42 of the sweep
    behind, against 0.32 at 0.95).
    """
    return min(max(1.0 - 2.0 / num_steps, MIN_SMOOTHING), FASTAI_SMOOTHING)


def smooth(losses: np.ndarray, beta: float) -> np.ndarray:
    """The debiased exponential moving average of `losses`.

    average_t = beta * average_(t-1) + (1 - beta) * loss_t, average_(-1) = 0;
    smoothed_t = average_t / (1 - beta ** (t + 1)).
    """
    losses = np.asarray(losses, dtype=np.float64)
    average, smoothed = 0.0, np.empty_like(losses)
    for step, loss in enumerate(losses):
        average = beta * average + (1.0 - beta) * loss
        smoothed[step] = average / (1.0 - beta ** (step + 1))
    return smoothed


def valley(rates: np.ndarray, losses: np.ndarray) -> tuple[float, int]:
    """fastai's `valley`: the point two thirds down the longest decreasing run.

    `run[i]` is the length of the longest strictly decreasing subsequence
    ending at `i`; the valley ends at the first `i` with the longest run and,
    as fastai counts it, starts `run[end]` points before; the suggestion is
    `start + int(length / 3) + int(length / 6)` with `length = end - start`.

    Returns:
        Tuple `(rate, index)`.
    """
    run = np.ones(len(losses), dtype=int)
    for i in range(1, len(losses)):
        higher = run[:i][losses[:i] > losses[i]]
        if higher.size:
            run[i] = higher.max() + 1
    end = int(np.argmax(run))
    start = end - int(run[end])
    third = (end - start) / 3
    index = max(start + int(third) + int(third / 2), 0)
    return float(rates[index]), index


def steepest(rates: np.ndarray, losses: np.ndarray) -> tuple[float, int]:
    """Lightning's suggestion: the steepest descent of the loss over log10(rate).

    Returns:
        Tuple `(rate, index)`: the point where `np.gradient(losses,
        np.log10(rates))` is lowest.
    """
    index = int(np.argmin(np.gradient(losses, np.log10(rates))))
    return float(rates[index]), index


def minimum_over_ten(rates: np.ndarray, losses: np.ndarray) -> tuple[float, int]:
    """fastai's `minimum`: a tenth of the rate at the lowest loss.

    Returns:
        Tuple `(rate, index)`: `rates[index] / 10` and the lowest point's index.
    """
    index = int(np.argmin(losses))
    return float(rates[index]) / 10.0, index


RULES = {"valley": valley, "steepest": steepest, "minimum/10": minimum_over_ten}


def suggest(rates: np.ndarray, smoothed: np.ndarray, rule: str, num_steps: int) -> tuple[float, int]:
    """Applies `rule` to the readable part of the curve.

    Drops the first `num_steps // 10` and the last `SKIP_END` points, and
    everything from the first non-finite loss on.

    Returns:
        Tuple `(rate, index)`, `index` into the whole curve.

    Raises:
        ValueError: too few points are left, or the loss never falls below
            its first readable value (no rate can be read off such a curve).
    """
    skip = num_steps // 10
    finite = np.isfinite(smoothed)
    usable = len(smoothed) if finite.all() else int(np.argmin(finite))
    end = usable - SKIP_END
    if end - skip < 3:
        raise ValueError(
            f"The range test stopped after {len(smoothed)} steps (at rate {rates[len(smoothed) - 1]:.3g}), "
            f"too few to suggest a rate from: {skip} are skipped at the start and {SKIP_END} at the end. "
            "Lower `start`, so that the loss diverges later, or raise `num_steps`."
        )
    rates, losses = rates[skip:end], smoothed[skip:end]
    if not (losses[1:] < losses[0]).any():
        raise ValueError(
            f"The smoothed loss never fell below its first value {losses[0]:.4g} at rates "
            f"{rates[0]:.3g} to {rates[-1]:.3g} (lowest {losses.min():.4g}, highest {losses.max():.4g}): "
            "no rate can be suggested. Widen the range (a lower `start`, a higher `stop`), "
            "or check that the model can learn from the data."
        )
    rate, index = RULES[rule](rates, losses)
    return rate, index + skip
