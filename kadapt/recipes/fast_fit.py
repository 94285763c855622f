"""`fast_fit`: a fast ResNet trained with the speed records' recipe, in one call."""

import keras
import numpy as np

from kadapt.extras import require
from kadapt.precision import global_policy
from kadapt.recipes import training
from kadapt.recipes.batch_size import RECIPE_BATCH_SIZE
from kadapt.recipes.batch_size import recipe_batch_size
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.optimizer_choice import RECIPE_NETWORK
from kadapt.recipes.optimizer_choice import choose_optimizer
from kadapt.recipes.optimizer_choice import with_choice
from kadapt.validation import check_range

# The recipe feeds tf.data pipelines, on any Keras backend.
tf = require("tensorflow", extra="tensorflow")


def fast_fit(
    x: "np.ndarray | tf.data.Dataset",
    y: np.ndarray | None = None,
    validation_data: tuple | None = None,
    epochs: int = 10,
    batch_size: int | None = None,
    config: FastFitConfig | None = None,
    num_classes: int | None = None,
    callbacks: list | None = None,
    seed: int | None = None,
    verbose: int | str = 0,
    micro_batch_size: int | str | None = None,
    memory_budget: int | str | None = None,
) -> keras.Model:
    """Trains a `fast_resnet` with the speed-record recipe and returns it.

    Images go in unscaled (any scale: the whitening layer, or the stem's
    batch normalization, absorbs it). Labels become one-hot and are smoothed
    by the loss; the optimizer is `kadapt.optimizers.SGD` with Nesterov
    momentum and decoupled weight decay; see `FastFitConfig` for the rest.
    Use the model on new data with `predict_with_tta`, and save it with
    `kadapt.portable_model(model).save("m.keras")`, which plain Keras loads
    (`keras.saving.load_model("m.keras")`, no kadapt needed).

    Args:
        x: Images (N, H, W) or (N, H, W, C), or a finite batched
            `tf.data.Dataset` of `(images (B, H, W, C), labels)` (then `y` is
            `None`, the batches are used as they come and `batch_size` only
            batches `validation_data`).
        y: Int labels (N,) or one-hot labels (N, num_classes).
        validation_data: `(x_val, y_val)` arrays, or `None`. Defaults to `None`.
        epochs: Positive int. Defaults to `10`.
        batch_size: Positive int, or `None` for the recipe's: 256, halved
            down to 16 while an epoch would have fewer than 64 steps
            (`kadapt.recipes.batch_size`). Defaults to `None`.
        config: `FastFitConfig` or `None` for the defaults. Defaults to `None`.
        num_classes: Int, or `None` to infer it from array labels. Required
            with a dataset of int labels. Defaults to `None`.
        callbacks: List of Keras callbacks, or `None`. Defaults to `None`.
        seed: Int or `None`. Seeds Keras, the shuffle and the augmentation.
            Defaults to `None`.
        verbose: As in `Model.fit`. Defaults to `0`.
        micro_batch_size: `None` (each batch in one pass), a positive int,
            or `"auto"` (probe the largest that fits `memory_budget`): train
            each batch as micro-batches with exact gradient accumulation
            (`kadapt.accumulate`). Defaults to `None`.
        memory_budget: Bytes or a size string such as `"2GiB"`, or `None`
            for the device's memory; used with `micro_batch_size`.
            Defaults to `None`.

    Returns:
        The trained `keras.Model` (logits out); `model.history` holds the
        History, `model.precision` the `kadapt.precision.PrecisionChoice`,
        `model.range_test` the `kadapt.RangeTestResult` of
        `FastFitConfig(learning_rate="auto")` (else `None`). Unless
        `config.restore_best_weights` is off, it holds the weights of the
        epoch with the best `val_loss` (`loss` without validation data).

    Example:

    ```python
    (x, y), (x_test, y_test) = kadapt.datasets.fashion_mnist()
    model = kadapt.recipes.fast_fit(x, y, epochs=10, seed=0)
    tta = kadapt.recipes.FastFitConfig().test_time_augmentation  # {"flip": True, "shift": 1}
    logits = kadapt.recipes.predict_with_tta(model, x_test, **tta)
    accuracy = (logits.argmax(-1) == y_test).mean()
    ```

    With the MetaAdjuster watching the run, and batches of 512 trained as
    micro-batches that fit 1 GiB:

    ```python
    model = kadapt.recipes.fast_fit(
        x, y, validation_data=(x_val, y_val), batch_size=512, micro_batch_size="auto",
        memory_budget="1GiB", callbacks=[kadapt.meta.MetaAdjuster()])
    ```
    """
    config = config or FastFitConfig()
    # "auto" as `kadapt train` decides it for fast_resnet on images: the recipe's SGD; a given rate and schedule stand
    config = with_choice(config, choose_optimizer(RECIPE_NETWORK, True, config.optimizer, config.learning_rate,
                                                  config.schedule))
    check_range("epochs", epochs, low=1, integer=True)
    batch_size = _batch_size(x, batch_size)
    if seed is not None:
        keras.utils.set_random_seed(seed)
    train, images, num_classes, steps_per_epoch = _training_data(x, y, batch_size, num_classes, seed, config, epochs)
    steps = epochs * steps_per_epoch

    def build():
        return training.compile_recipe(training.recipe_network(config, images, num_classes), config, steps)

    precision = training.recipe_precision(config, build, images, num_classes, batch_size)
    if seed is not None and precision.seconds_per_step:
        keras.utils.set_random_seed(seed)  # the timed networks drew from the generator
    with global_policy(precision.policy):
        model = build()
    config, model.range_test = training.with_found_learning_rate(
        config, model, steps, train, lambda: training.micro_batched(model, micro_batch_size, memory_budget), seed)
    trainer = training.micro_batched(model, micro_batch_size, memory_budget)
    history, _ = training.fit_recipe(
        trainer, train, config, epochs=epochs, steps_per_epoch=steps_per_epoch, total_steps=steps,
        arrange_callbacks=lambda schedule, best: [*schedule, *(callbacks or []), *([best] if best else [])],
        validation_data=_validation(validation_data, num_classes, batch_size), seed=seed, verbose=verbose,
    )
    model.history, model.precision = history, precision
    return model


def _batch_size(x, batch_size):
    """The given batch, else the recipe's for the rows of `x` (a dataset brings its own batches)."""
    if batch_size is not None:
        check_range("batch_size", batch_size, low=1, integer=True)
        return batch_size
    return RECIPE_BATCH_SIZE if isinstance(x, tf.data.Dataset) else recipe_batch_size(len(x))


def _training_data(x, y, batch_size, num_classes, seed, config, epochs):
    """`(batches of all the epochs, images for the whitening, num_classes, steps per epoch)`."""
    if isinstance(x, tf.data.Dataset):
        if config.expand:
            raise ValueError("`config.expand` appends samples to arrays; with a dataset, expand the arrays "
                             "before making it (kadapt.augment.expand). Received: a tf.data.Dataset")
        if y is not None:
            raise ValueError(f"Argument `y` must be None when `x` is a dataset. Received: y={type(y).__name__}")
        batches, num_classes = _dataset_batches(x, num_classes)
        images = next(iter(batches.unbatch().batch(training.WHITENING_IMAGES)))[0].numpy()
        steps = int(batches.cardinality())
        return batches.repeat(epochs), images, num_classes, steps
    images, labels, num_classes = _arrays(x, y, num_classes)
    rows, labels = training.expanded(images, labels, config, num_classes, seed)
    batches = training.shuffled_batches(rows, labels, batch_size, num_classes, seed, epochs=epochs)
    return batches, images, num_classes, training.steps_per_epoch(len(rows), batch_size)


def _dataset_batches(dataset, num_classes):
    if dataset.cardinality() < 0:
        raise ValueError(
            "Argument `x` must be a finite dataset of known length (the schedules need the "
            "number of steps); use `dataset.take(n)` or `.apply(tf.data.experimental.assert_cardinality(n))`. "
            f"Received: cardinality={int(dataset.cardinality())}"
        )
    label_spec = dataset.element_spec[1]
    if label_spec.shape.rank == 2:
        return dataset.map(lambda a, b: (tf.cast(a, "float32"), tf.cast(b, "float32"))), label_spec.shape[-1]
    if num_classes is None:
        raise ValueError("Argument `num_classes` is required with a dataset of int labels. Received: num_classes=None")
    return dataset.map(lambda a, b: (tf.cast(a, "float32"), tf.one_hot(b, num_classes))), num_classes


def _arrays(x, y, num_classes):
    """`(float32 images (N, H, W, C), labels, num_classes)`."""
    images = np.asarray(x, "float32")
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise ValueError(f"Argument `x` must be images (N, H, W) or (N, H, W, C). Received: x.shape={images.shape}")
    labels = np.asarray(y)
    if labels.ndim == 2:
        return images, labels, labels.shape[-1]
    return images, labels, num_classes or int(labels.max()) + 1


def _validation(validation_data, num_classes, batch_size):
    if validation_data is None:
        return None
    images, labels, _ = _arrays(*validation_data, num_classes)
    return tf.data.Dataset.from_tensor_slices((images, training.one_hot(labels, num_classes))).batch(batch_size)
