"""What watching a run costs: observations against the steps between them, and the interval that fits.

An observation reduces every weight's update and copies every weight and
optimizer slot for the rollback point (on the host, or on the device:
`kadapt.meta.observe.device_observer`), so its cost grows with the model while a step's
may not: measured on a 2-core CPU inside `fit`, read to the host, ~1 ms for a
50,890-weight MLP (3.3-4.6 ms steps) and ~50 ms for a 5.8M-weight one (40-90 ms
steps), 10% of the time at `check_every=10`.
`ObservationCost` is the pure rule the `MetaAdjuster` feeds with wall times: once
the median observation costs more than `warn_share` of the steps it watches, and
more than `min_seconds` (below that it is a call's fixed cost, a share only where
steps take a millisecond or two and a run seconds), it names the cost and the
`check_every` that keeps it near `target_share`. The
adjuster warns once a run; it does not stretch the interval itself (the meta-model
reads its features per observation; the interval is the user's to choose).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics

TARGET_SHARE = 0.03  # issue 46's bound on the overhead of observing every 10 steps
WARN_SHARE = 0.05  # above the target by more than a loaded host's swing of the measurement
MIN_OBSERVATIONS = 3  # the first one reads with fit's input pipeline starting beside it
MIN_SECONDS = 0.005  # a 50,890-weight MLP's observation: ~1 ms; a 5.8M-weight one's: ~50 ms
RECENT = 16  # observations the medians are taken over: a long run's watch costs no more than a short one's


@dataclasses.dataclass
class ObservationCost:
    """Wall times of observations and of the steps between them; when the former outweigh the latter.

    Args:
        check_every: Int. Steps between observations.
        warn_share: Float > 0. The share (observation time / the steps' time)
            above which `advice` speaks. Defaults to `WARN_SHARE`.
        target_share: Float > 0. The share the advised `check_every` aims at.
            Defaults to `TARGET_SHARE`.
        min_seconds: Float >= 0. The median observation time below which
            `advice` stays silent. Defaults to `MIN_SECONDS`.

    Example:

    ```python
    cost = ObservationCost(check_every=10)
    for _ in range(3):
        cost.add(observation_seconds=0.06, steps_seconds=0.5)
    cost.advice()  # 'observing every 10 steps takes 12% ... check_every=40 ...'
    ```
    """

    check_every: int
    warn_share: float = WARN_SHARE
    target_share: float = TARGET_SHARE
    min_seconds: float = MIN_SECONDS
    observations: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=RECENT))
    steps: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=RECENT))

    def add(self, observation_seconds: float, steps_seconds: float) -> None:
        """One observation's wall time and that of the `check_every` steps before it."""
        self.observations.append(float(observation_seconds))
        self.steps.append(float(steps_seconds))

    def share(self) -> float | None:
        """Median observation time over the median steps' time, over the last `RECENT`
        observations; `None` before `MIN_OBSERVATIONS`."""
        if len(self.observations) < MIN_OBSERVATIONS:
            return None
        steps = statistics.median(self.steps)
        return statistics.median(self.observations) / steps if steps > 0 else math.inf

    def advice(self) -> str | None:
        """A sentence naming the cost and the interval that fits, where the share is above
        `warn_share` and an observation takes more than `min_seconds`; else `None`."""
        share = self.share()
        if share is None or share <= self.warn_share or statistics.median(self.observations) <= self.min_seconds:
            return None
        interval = self.check_every * math.ceil(share / self.target_share)
        milliseconds = 1000 * statistics.median(self.observations)
        return (f"MetaAdjuster: observing every {self.check_every} steps takes {share:.0%} of the steps' "
                f"time ({milliseconds:.0f} ms an observation: every weight's update is reduced and every "
                f"weight and optimizer slot copied). Pass check_every={interval} (or 'epoch') to keep it near "
                f"{self.target_share:.0%}.")
