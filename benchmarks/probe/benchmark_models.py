"""Models shared by the benchmarks (imported by the scripts beside it)."""

import keras


def conv_bn():
    """Three conv-BatchNorm-ReLU-pool stages at 32x32x3, then a dense head."""
    layers = [keras.Input((32, 32, 3))]
    for width in (32, 64, 128):
        layers += [keras.layers.Conv2D(width, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.MaxPooling2D()]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers, name="conv_bn")


def conv_pool_dropout():
    """Two convolutions, each pooled, with dropout (issue 68: a family the probe's benchmark did not have)."""
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25), keras.layers.Flatten(), keras.layers.Dense(10),
    ], name="conv_pool_dropout")
