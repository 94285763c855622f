import pytest

from kadapt.recipes.batch_size import recipe_batch_size


@pytest.mark.parametrize("rows, expected", [
    (60_000, 256), (64 * 256, 256), (64 * 256 - 1, 128), (64 * 64, 64), (1_294, 16), (1, 16),
])
def test_halves_until_an_epoch_has_64_steps(rows, expected):
    assert recipe_batch_size(rows) == expected


@pytest.mark.parametrize("rows", [0, -5, 2.5, True, "100"])
def test_rejects_what_is_not_a_row_count(rows):
    with pytest.raises(ValueError, match=r"Argument `train_rows` must be a positive int. Received: train_rows="):
        recipe_batch_size(rows)
