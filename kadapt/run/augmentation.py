"""On-the-fly augmentation of training images, from `kadapt.augment`."""

from kadapt import augment
from kadapt.run.errors import UsageError

TRANSLATE = 2 / 28  # of the image size: 2 pixels of Fashion-MNIST
FLIP_INVARIANT = ("fashion_mnist",)  # a mirrored digit is another symbol


def augmentation_pipeline(setting, data_name, data, seed):
    """`kadapt.augment.augmentation(...)` for image data, or `None`.

    Shifts by up to `TRANSLATE` of the size, and flips horizontally where the
    classes are known to survive a mirror. Labels stay integers (no mixing).
    With `setting="auto"` images are augmented when `kadapt.augment` is
    installed; `"on"` insists; `"off"` never augments.

    Args:
        setting: String. `"auto"`, `"on"` or `"off"`.
        data_name: String. The `--data` value.
        data: `TrainingData`.
        seed: Int. Seed of the augmentation layers.

    Returns:
        `(pipeline or None, description)`; the description goes to the config.
    """
    if setting == "off":
        return None, "off"
    if not data.is_image:
        if setting == "on":
            raise UsageError("--augment on needs image data; these rows are not images.")
        return None, "off (not images)"
    flip = data_name in FLIP_INVARIANT
    pipeline = augment.augmentation(flip=flip, translate=TRANSLATE, seed=seed)
    return pipeline, f"translate {TRANSLATE:.3f}" + (", horizontal flip" if flip else "")
