"""`RangeTestResult`: what a learning-rate range test saw and suggests."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from kadapt.range_test.curve import SKIP_END


@dataclasses.dataclass(frozen=True)
class RangeTestResult:
    """The curve of a learning-rate range test and the rate read off it.

    Args:
        rates: Tuple of floats. The rate applied at each step run.
        losses: Tuple of floats. The training loss of each step's batch (before
            that step's update), as `train_on_batch` reports it.
        smoothed_losses: Tuple of floats. `losses` smoothed by the debiased
            moving average.
        suggestion: Float. The suggested rate.
        suggestion_index: Int. The point of the curve the rule chose (for
            `"minimum/10"` the minimum, ten times the suggestion).
        rule: String. The rule that chose it.
        steps_run: Int. Steps run (`num_steps`, or fewer if it diverged).
        diverged: Bool. Whether the test stopped at divergence (smoothed loss
            over `divergence` times its best, or a non-finite loss).

    Example:

    ```python
    result = kadapt.find_learning_rate(model, x, y, batch_size=64)
    model.optimizer.learning_rate = result.suggestion
    result.plot("range_test.png")
    ```
    """

    rates: tuple[float, ...]
    losses: tuple[float, ...]
    smoothed_losses: tuple[float, ...]
    suggestion: float
    suggestion_index: int
    rule: str
    steps_run: int
    diverged: bool

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values."""
        return dataclasses.asdict(self)

    def plot(self, path_or_ax: Any = None) -> Any:
        """Draws the smoothed loss over the rate (log scale), the suggestion marked.

        Args:
            path_or_ax: A path (string or `os.PathLike`) to save the figure to,
                a matplotlib `Axes` to draw on, or `None` for a new figure.
                Defaults to `None`.

        Returns:
            The path, the given `Axes`, or the new `Figure`.
        """
        from kadapt.extras import require

        figure_module = require("matplotlib.figure", extra="plots")
        if path_or_ax is not None and not isinstance(path_or_ax, (str, os.PathLike)):
            self._draw(path_or_ax)
            return path_or_ax
        figure = figure_module.Figure(figsize=(6, 4))
        self._draw(figure.subplots())
        if path_or_ax is None:
            return figure
        figure.savefig(path_or_ax, dpi=120, bbox_inches="tight")
        return path_or_ax

    def _draw(self, ax: Any) -> None:
        ax.plot(self.rates, self.losses, color="0.8", linewidth=0.8, label="loss")
        ax.plot(self.rates, self.smoothed_losses, label="smoothed")
        marked = self.rates[self.suggestion_index], self.smoothed_losses[self.suggestion_index]
        ax.plot(*marked, "o", color="C3", label=f"{self.rule}: {self.suggestion:.3g}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        # The climb into divergence would squash the readable part of the curve.
        readable = [v for v in self.smoothed_losses[:-SKIP_END] if math.isfinite(v)] or [marked[1]]
        low, high = min(readable), max(readable)
        ax.set_ylim(low - 0.1 * (high - low), high + 0.2 * (high - low) + 1e-12)
        ax.legend(loc="best")
