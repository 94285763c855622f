"""The recipe's logical batch for a data set of a given size."""

RECIPE_BATCH_SIZE = 256  # measured on Fashion-MNIST's 54,000 training rows (benchmarks/README.md#main_job)
SMALLEST_BATCH_SIZE = 16
MIN_STEPS_PER_EPOCH = 64  # digits' 1,294 rows at 256 gave 6 steps an epoch and 90% (benchmarks/README.md#digits_defaults)


def recipe_batch_size(train_rows: int) -> int:
    """The logical batch the recipe trains `train_rows` rows with.

    `256`, halved (down to `16`) while an epoch would have fewer than 64
    optimizer steps: a small data set gets enough updates in the recipe's
    epochs, a large one keeps the batch the recipe was measured with.

    Args:
        train_rows: Positive int. Rows in one epoch.

    Example:

    >>> recipe_batch_size(54_000), recipe_batch_size(1_294)
    (256, 16)
    """
    if isinstance(train_rows, bool) or not isinstance(train_rows, int) or train_rows <= 0:
        raise ValueError(f"Argument `train_rows` must be a positive int. Received: train_rows={train_rows!r}")
    batch_size = RECIPE_BATCH_SIZE
    while batch_size > SMALLEST_BATCH_SIZE and train_rows < MIN_STEPS_PER_EPOCH * batch_size:
        batch_size //= 2
    return batch_size
