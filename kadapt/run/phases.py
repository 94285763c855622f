"""Where a run's seconds go: a clock per phase of `kadapt train`, and the first step's own.

`run.json` records `"seconds"`, e.g. `{"start-up": 4.1, "data": 1.2, "network":
0.3, "pipeline": 0.8, "probe": 21.4, "first step": 6.2, "epochs": 240.5,
"evaluation": 3.9, "saving": 0.7}`, and the command prints it as one line, so
a change to the recipe is judged by where the time goes (issue 42's split).

- `start-up`: from the process's start (the interpreter, the imports,
  TensorFlow's loading) to the run's start; only where the `kadapt` command
  started the process (`process_age`), not in a notebook or a benchmark.
- `data`: loading and encoding the rows; `network`: building it (and timing
  steps under `--precision auto`); `pipeline`: the expanded rows and compiling.
- `probe`, `range test`: their trial and sweep steps (traces included).
- `first step`: the first training step of the fit, from `fit`'s start: the
  trace (and XLA compile), the input pipeline's first batch, one step.
- `epochs`: the rest of the fit, validation and callbacks included.
- `evaluation`: the test scores with test-time augmentation; `saving`:
  `model.keras` and the plots.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import keras

from kadapt.run.report import seconds_text


def process_age() -> float | None:
    """Seconds since this process started (Linux' `/proc`), or `None` where unknown."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
        return since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class PhaseClock:
    """Seconds per named phase, in the order the phases were first entered.

    Args:
        start_up: Float or `None`. Seconds the process took to reach the run
            (`process_age()` where the command started it). Defaults to `None`.

    Example:

    ```python
    clock = PhaseClock()
    with clock.phase("data"):
        rows = load()
    clock.text()  # "data 1.2 s"
    ```
    """

    def __init__(self, start_up: float | None = None) -> None:
        self.seconds: dict[str, float] = {} if start_up is None else {"start-up": float(start_up)}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Adds the seconds of the `with` block to phase `name`."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def add(self, name: str, seconds: float) -> None:
        """Adds `seconds` to phase `name`."""
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)

    @contextlib.contextmanager
    def fit(self, first_step: FirstStepClock) -> Iterator[None]:
        """Times a `fit` call that `first_step` (one of its callbacks) watches:
        to the first step's end as `"first step"`, the rest as `"epochs"`."""
        began = time.perf_counter()
        try:
            yield
        finally:
            ended = time.perf_counter()
            first = 0.0 if first_step.ended_at is None else first_step.ended_at - began
            self.add("first step", first)
            self.add("epochs", ended - began - first)

    def to_dict(self) -> dict[str, float]:
        """`{phase: seconds}`, rounded to 0.1 s."""
        return {name: round(seconds, 1) for name, seconds in self.seconds.items()}

    def text(self) -> str:
        """One line: each phase that took 0.05 s or more and its seconds, then the total."""
        return f"time: {seconds_text(self.seconds)}"


class FirstStepClock(keras.callbacks.Callback):
    """When `fit`'s first training step ended (`time.perf_counter()`), or `None` before it.

    `fit`'s phase minus this, measured from the call of `fit`, is the rest of
    the fit: `PhaseClock.fit` does the sum.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ended_at = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.ended_at is None:
            self.ended_at = time.perf_counter()
