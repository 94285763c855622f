"""Train a small CNN on Fashion-MNIST with logical batches of 512 rows on a
simulated 96 MiB device: kadapt probes the largest micro-batch that fits with
real trial steps, then trains each logical batch as micro-batches of that
size in one optimizer step.

Run: `.venv/bin/python examples/accumulate_fashion_mnist.py` (after `make install`).
"""

from kadapt import environment

environment.configure_tensorflow()  # before Keras loads TensorFlow: CPU memory statistics

import keras  # noqa: E402

import kadapt  # noqa: E402

LOGICAL_BATCH_SIZE = 512
MEMORY_BUDGET = "96MiB"  # a simulated small device; on a GPU omit it to use the GPU's own
EPOCHS = 3
LEARNING_RATE = 3e-3  # Adam; a larger batch takes a somewhat larger step


def main():
    (x_train, y_train), (x_test, y_test) = kadapt.datasets.fashion_mnist()
    x_train = x_train[..., None].astype("float32") / 255.0
    x_test = x_test[..., None].astype("float32") / 255.0

    model = kadapt.accumulate(kadapt.models.small_cnn(), micro_batch_size="auto", memory_budget=MEMORY_BUDGET)
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
    if model.probe_result is not None:  # None when the probe cache answered
        for trial in model.probe_result.trials:
            peak = "out of memory" if trial.peak_bytes is None else f"{trial.peak_bytes / 2**20:.1f} MiB"
            print(f"  probe trial: micro-batch {trial.micro_batch_size:4d}, peak {peak}, fits: {trial.fits}")
    print(kadapt.plan_batch(LOGICAL_BATCH_SIZE, model.micro_batch_size))
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    steps = int(model.optimizer.iterations)
    print(f"test accuracy {accuracy:.4f} after {steps} optimizer steps of {LOGICAL_BATCH_SIZE} rows")


if __name__ == "__main__":
    main()
