"""`plan_batch`: how a logical batch splits into micro-batches."""

from __future__ import annotations

import dataclasses
import math

from kadapt.validation import check_micro_batch_size


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """A logical batch run as `num_micro_batches` forward/backward passes.

    Attributes:
        logical_batch_size: Rows per optimizer step.
        micro_batch_size: Rows per forward/backward pass (at most the logical size).
        num_micro_batches: ceil(logical / micro).
        tail_size: Rows in the last micro-batch when it is ragged, else 0.
    """

    logical_batch_size: int
    micro_batch_size: int
    num_micro_batches: int
    tail_size: int

    def __str__(self) -> str:
        tail = f", last one {self.tail_size} rows" if self.tail_size else ""
        return (
            f"logical batch {self.logical_batch_size} = {self.num_micro_batches} "
            f"micro-batch(es) of {self.micro_batch_size}{tail}"
        )


def plan_batch(logical_batch_size: int, micro_batch_size: int) -> BatchPlan:
    """Returns the `BatchPlan` for a logical batch and a micro-batch size.

    Example:

    >>> plan_batch(100, 32)
    BatchPlan(logical_batch_size=100, micro_batch_size=32, num_micro_batches=4, tail_size=4)
    """
    logical = check_micro_batch_size(logical_batch_size, name="logical_batch_size")
    micro = min(check_micro_batch_size(micro_batch_size), logical)
    full, tail = divmod(logical, micro)
    return BatchPlan(logical, micro, full + (1 if tail else 0), tail)


def balanced_micro_batch(logical_batch_size: int, micro_batch_size: int) -> int:
    """The micro-batch that splits a logical batch into as many micro-batches
    as `micro_batch_size` does, as evenly as possible: ceil(B / ceil(B / m)).

    It is never larger than `micro_batch_size`, so it fits wherever that
    fits. BatchNormalization normalizes each micro-batch by its own
    statistics; a ragged split (252 + 4 rows) would update the moving
    statistics from a 4-row micro-batch every step.

    Example:

    >>> balanced_micro_batch(256, 252)
    128
    >>> balanced_micro_batch(256, 100)
    86
    """
    logical = check_micro_batch_size(logical_batch_size, name="logical_batch_size")
    micro = min(check_micro_batch_size(micro_batch_size), logical)
    return math.ceil(logical / math.ceil(logical / micro))
