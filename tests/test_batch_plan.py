"""`plan_batch` and the affine memory model, against hand-computed values."""

import pytest

from kadapt import BatchPlan
from kadapt import MemoryModel
from kadapt import balanced_micro_batch
from kadapt import plan_batch


@pytest.mark.parametrize(
    "logical, micro, expected",
    [(100, 32, (100, 32, 4, 4)), (64, 16, (64, 16, 4, 0)), (10, 32, (10, 10, 1, 0)), (7, 1, (7, 1, 7, 0))],
)
def test_plan(logical, micro, expected):
    assert plan_batch(logical, micro) == BatchPlan(*expected)


def test_plan_reads_well():
    assert str(plan_batch(100, 32)) == "logical batch 100 = 4 micro-batch(es) of 32, last one 4 rows"


@pytest.mark.parametrize("logical", [1, 7, 100, 256, 257])
def test_balanced_micro_batch_is_the_smallest_even_split_with_as_many_passes(logical):
    for micro in range(1, logical + 3):
        passes = plan_batch(logical, micro).num_micro_batches
        balanced = balanced_micro_batch(logical, micro)
        # Oracle by search: the smallest size that still needs no more passes than `micro` does.
        smallest = min(size for size in range(1, logical + 1) if -(-logical // size) <= passes)
        assert balanced == smallest <= micro
        assert plan_batch(logical, balanced).num_micro_batches == passes
        assert plan_batch(logical, balanced).tail_size in (0, *range(balanced - passes + 1, balanced))


def test_balanced_micro_batch_rejects_bad_sizes():
    with pytest.raises(ValueError, match="Received: logical_batch_size=0"):
        balanced_micro_batch(0, 4)
    with pytest.raises(TypeError, match="Received: micro_batch_size=2.0"):
        balanced_micro_batch(8, 2.0)


def test_plan_rejects_bad_sizes():
    with pytest.raises(ValueError, match="Received: logical_batch_size=0"):
        plan_batch(0, 4)
    with pytest.raises(TypeError, match="Received: micro_batch_size=2.0"):
        plan_batch(8, 2.0)


def test_memory_model_fits_a_line_and_solves_it():
    model = MemoryModel.fit([10, 30], [1_000 + 10 * 50, 1_000 + 30 * 50])
    assert model.fixed_bytes == pytest.approx(1_000)
    assert model.bytes_per_row == pytest.approx(50)
    # room above the fixed part: (6_000 - 1_000) * 0.95 = 4_750 -> 95 rows
    assert model.largest_fitting(6_000, margin=0.05) == 95
    assert model.largest_fitting(500) == 0
