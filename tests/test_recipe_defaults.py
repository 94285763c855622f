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


def _images(side):
    import numpy as np

    from kadapt.recipes.task import Task
    from kadapt.run.data import TrainingData

    x, y = np.zeros((4, side, side, 1), "float32"), np.zeros(4, "int64")
    return TrainingData(x, y, x, y, x, y, Task(outputs=2))


@pytest.mark.parametrize("side, augment, shift", [(8, "auto", 0), (15, "auto", 0), (16, "auto", 1), (8, "on", 1),
                                                  (28, "off", 0)])
def test_augment_auto_shifts_images_of_16_pixels_and_more(side, augment, shift):
    from kadapt.run.config import RunConfig
    from kadapt.run.train_plan import plan_training

    recipe = plan_training(RunConfig(data="x.npz", augment=augment), _images(side)).recipe
    assert recipe.test_time_augmentation["shift"] == shift
    assert (recipe.translate > 0) == (shift == 1)


def test_a_run_without_batch_size_takes_the_recipe_batch_for_its_rows():
    from kadapt.run.config import RunConfig
    from kadapt.run.config import with_batch_size

    assert with_batch_size(RunConfig(data="digits"), 1_294).batch_size == 16
    assert with_batch_size(RunConfig(data="digits", batch_size=100), 1_294).batch_size == 100
