"""Inference with test-time augmentation: flips and shifts."""

import numpy as np

from kadapt.validation import check_range


def predict_with_tta(model, x, batch_size=512, flip=True, shift=0):
    """The model's outputs on `x` averaged over mirrored and shifted copies.

    The speed records average each test image's logits over augmented copies
    of it (test-time augmentation), a free fraction of a percent for a
    network trained on flips and shifts. With `flip`, `view(a)` is the mean
    of the outputs on `a` and on `a` mirrored left-right, else the outputs on
    `a`. With `shift=s > 0` the result is airbench's
    `0.5 * view(x) + 0.25 * view(x shifted by (+s, +s)) + 0.25 * view(x
    shifted by (-s, -s))`, the shifts in pixels down and right, the pixels
    shifted in zero (as `kadapt.augment.augmentation`'s translation fills).

    Args:
        model: A Keras model on images (N, H, W, C).
        x: Array (N, H, W, C), or (N, H, W) for one channel.
        batch_size: Positive int. Defaults to `512`.
        flip: Bool. Average in the mirrored images. Defaults to `True`.
        shift: Int >= 0, less than the image's height and width. Pixels of
            the two diagonal shifts; 0 turns them off. Defaults to `0`.

    Returns:
        Float32 array (N, ...) of the averaged outputs (logits for `fast_resnet`),
        whatever the model's dtype policy.

    Example:

    ```python
    logits = kadapt.recipes.predict_with_tta(model, x_test, shift=1)
    accuracy = (logits.argmax(-1) == y_test).mean()
    ```
    """
    x = np.asarray(x, "float32")
    if x.ndim == 3:
        x = x[..., None]
    check_range("shift", shift, low=0, high=min(x.shape[1:3]), high_open=True, integer=True)

    def outputs(images):  # in float32 whatever the policy: NumPy sums bfloat16 in bfloat16
        return np.asarray(model.predict(images, batch_size=batch_size, verbose=0), "float32")

    def view(images):
        return (outputs(images) + outputs(images[:, :, ::-1])) / 2 if flip else outputs(images)

    if not shift:
        return view(x)
    return 0.5 * view(x) + 0.25 * view(shifted_images(x, shift)) + 0.25 * view(shifted_images(x, -shift))


def shifted_images(images, pixels):
    """`images` (N, H, W, C) moved `pixels` down and right (up and left when
    negative), the pixels shifted in zero."""
    out = np.zeros_like(images)
    if pixels >= 0:
        out[:, pixels:, pixels:] = images[:, :images.shape[1] - pixels, :images.shape[2] - pixels]
    else:
        out[:, :pixels, :pixels] = images[:, -pixels:, -pixels:]
    return out
