"""Peak memory of a training step as an affine function of the micro-batch."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """peak_bytes(m) = fixed_bytes + bytes_per_row * m.

    `fixed_bytes` holds what does not grow with the micro-batch (weights,
    optimizer slots, the float32 gradient sum); `bytes_per_row` the
    activations and their gradients for one row.
    """

    fixed_bytes: float
    bytes_per_row: float

    @classmethod
    def fit(cls, sizes: Sequence[float], peaks: Sequence[float]) -> MemoryModel:
        """Least-squares line through (size, peak) points (two or more)."""
        sizes = np.asarray(sizes, dtype=np.float64)
        peaks = np.asarray(peaks, dtype=np.float64)
        if len(np.unique(sizes)) < 2:
            raise ValueError(f"Need two distinct sizes to fit a line. Received: sizes={sizes.tolist()}")
        if len(sizes) == 2:
            slope = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
            intercept = peaks[0] - slope * sizes[0]
        else:
            slope, intercept = np.polyfit(sizes, peaks, 1)
        # Memory never shrinks with more rows; a flat measurement means
        # "rows are cheap", not "rows are free".
        return cls(float(intercept), float(max(slope, 1.0)))

    def peak_bytes(self, micro_batch_size: float) -> float:
        return self.fixed_bytes + self.bytes_per_row * micro_batch_size

    def largest_fitting(self, budget_bytes: float, margin: float = 0.05) -> int:
        """Largest m whose predicted peak fits, keeping `margin` of the room
        above the fixed part free (so the choice is >= (1 - margin) of the
        true largest when the line is exact)."""
        room = (budget_bytes - self.fixed_bytes) * (1.0 - margin)
        return max(0, math.floor(room / self.bytes_per_row + 1e-9))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
