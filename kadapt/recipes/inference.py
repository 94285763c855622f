"""Inference with flip test-time augmentation."""

import numpy as np


def predict_with_flips(model, x, batch_size=512, flip=True):
    """Mean of the model's outputs on `x` and on `x` flipped left-right.

    The speed records average the logits of each test image and its mirror
    image (flip test-time augmentation): a free fraction of a percent on data
    whose labels survive a horizontal flip.

    Args:
        model: A Keras model on images (N, H, W, C).
        x: Array (N, H, W, C), or (N, H, W) for one channel.
        batch_size: Positive int. Defaults to `512`.
        flip: Bool. `False` returns `model.predict(x)`. Defaults to `True`.

    Returns:
        Array (N, ...) of the averaged outputs (logits for `fast_resnet`).

    Example:

    ```python
    logits = kadapt.recipes.predict_with_flips(model, x_test)
    accuracy = (logits.argmax(-1) == y_test).mean()
    ```
    """
    x = np.asarray(x, "float32")
    if x.ndim == 3:
        x = x[..., None]
    outputs = model.predict(x, batch_size=batch_size, verbose=0)
    if not flip:
        return outputs
    return (outputs + model.predict(x[:, :, ::-1], batch_size=batch_size, verbose=0)) / 2
