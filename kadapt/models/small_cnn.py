"""`small_cnn`: the 2 conv + dense baseline network of the benchmarks and examples."""

from __future__ import annotations

import keras


def small_cnn(input_shape: tuple[int, int, int] = (28, 28, 1), num_classes: int = 10,
              name: str = "small_cnn") -> keras.Model:
    """Conv(32)-pool-Conv(64)-pool-Dense(128)-Dense(num_classes), logits out.

    Args:
        input_shape: Tuple. Image shape without the batch axis. Defaults to `(28, 28, 1)`.
        num_classes: Int. Output logits. Defaults to `10`.
        name: String. Defaults to `"small_cnn"`.
    """
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(num_classes),
        ],
        name=name,
    )
