"""Train a small CNN on Fashion-MNIST with logical batches of 512 rows run as
micro-batches of 128: one optimizer step per 512 rows, the memory of 128.

Run: `make demo` (or `.venv/bin/python examples/accumulate_fashion_mnist.py`).
"""

import keras

import kadapt

LOGICAL_BATCH_SIZE = 512
MICRO_BATCH_SIZE = 128
EPOCHS = 3
LEARNING_RATE = 3e-3  # Adam; a larger batch takes a somewhat larger step


def small_cnn():
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def main():
    (x_train, y_train), (x_test, y_test) = kadapt.datasets.fashion_mnist()
    x_train = x_train[..., None].astype("float32") / 255.0
    x_test = x_test[..., None].astype("float32") / 255.0

    model = kadapt.accumulate(small_cnn(), micro_batch_size=MICRO_BATCH_SIZE)
    model.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        x_train,
        y_train,
        batch_size=LOGICAL_BATCH_SIZE,
        epochs=EPOCHS,
        validation_split=0.1,
        verbose=2,
    )
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    steps = int(model.optimizer.iterations)
    print(
        f"test accuracy {accuracy:.4f} after {steps} optimizer steps of "
        f"{LOGICAL_BATCH_SIZE} rows, each run as micro-batches of {MICRO_BATCH_SIZE}"
    )


if __name__ == "__main__":
    main()
