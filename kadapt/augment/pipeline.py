"""`augmentation`: Keras' image-augmentation layers composed for a `tf.data` pipeline.

`augmentation` is Keras layers only, for any backend. `augment_dataset` maps a
`tf.data.Dataset`, so it needs TensorFlow installed (`kadapt[tensorflow]`) on
any Keras backend: Keras runs its preprocessing layers inside tf.data with
TensorFlow ops, also under JAX.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import keras

from kadapt.extras import require
from kadapt.validation import check_range

if TYPE_CHECKING:
    import tensorflow as tf


def augmentation(flip: bool = True, translate: float = 0.0, cutout: float = 0.0, cutmix: float = 0.0,
                 mixup: float = 0.0, seed: int | None = None) -> keras.layers.Pipeline:
    """A `keras.layers.Pipeline` of Keras' augmentation layers, in this order.

    Every layer maps a batch `{"images": x, "labels": y}` to a new one, so
    the pipeline runs inside `tf.data` (`augment_dataset`). Flips,
    translations and cutout leave labels alone; CutMix and MixUp mix them,
    so they need one-hot (float) labels.

    - flip: `keras.layers.RandomFlip("horizontal")`.
    - translate: `keras.layers.RandomTranslation` by up to `translate` of the
      height and width, nearest-pixel, zero fill (the background of
      Fashion-MNIST and MNIST).
    - cutout: `keras.layers.RandomErasing` erasing one patch with probability
      `cutout` (its `factor=(cutout, cutout)`; a single float would draw the
      probability from [0, cutout]), filled with 0.
    - cutmix: `keras.layers.CutMix(factor=cutmix)`.
    - mixup: `keras.layers.MixUp(alpha=mixup)`.

    Args:
        flip: Bool. Random horizontal flips. Defaults to `True`.
        translate: Float in [0, 1). Largest shift as a fraction of the image
            size (2 pixels of 28: `2 / 28`); 0 turns it off. Defaults to `0.0`.
        cutout: Float in [0, 1]. Erasing probability; 0 turns it off.
            Defaults to `0.0`.
        cutmix: Float in [0, 1]. CutMix's `factor`; 0 turns it off.
            Defaults to `0.0`.
        mixup: Float >= 0. MixUp's `alpha`; 0 turns it off. Defaults to `0.0`.
        seed: Int or `None`. Seed of the first layer; layer i gets seed + i.
            Defaults to `None`.

    Returns:
        A `keras.layers.Pipeline` (possibly empty) taking and returning
        `{"images": ..., "labels": ...}` batches.

    Example:

    ```python
    pipeline = kadapt.augment.augmentation(flip=True, translate=2 / 28, cutout=0.5)
    batch = pipeline({"images": images, "labels": one_hot_labels})
    ```
    """
    if not isinstance(flip, bool):
        raise TypeError(f"Argument `flip` must be a bool. Received: flip={flip!r}")
    check_range("translate", translate, low=0.0, high=1.0, high_open=True)
    check_range("cutout", cutout, low=0.0, high=1.0)
    check_range("cutmix", cutmix, low=0.0, high=1.0)
    check_range("mixup", mixup, low=0.0)
    makers = [
        (flip, lambda s: keras.layers.RandomFlip("horizontal", seed=s)),
        (translate, lambda s: keras.layers.RandomTranslation(
            translate, translate, fill_mode="constant", interpolation="nearest", seed=s)),
        (cutout, lambda s: keras.layers.RandomErasing(
            factor=(cutout, cutout), fill_value=0.0, seed=s)),
        (cutmix, lambda s: keras.layers.CutMix(factor=cutmix, seed=s)),
        (mixup, lambda s: keras.layers.MixUp(alpha=mixup, seed=s)),
    ]
    chosen = [make for enabled, make in makers if enabled]
    return keras.layers.Pipeline(
        [make(None if seed is None else seed + i) for i, make in enumerate(chosen)]
    )


def augment_dataset(dataset: tf.data.Dataset, pipeline: keras.layers.Pipeline, parallel: bool = True,
                    first_batch: int | None = None) -> tf.data.Dataset:
    """Applies `pipeline` to every `(images, labels)` batch of `dataset`.

    Args:
        dataset: Batched `tf.data.Dataset` of `(images, labels)`, labels one-hot
            float if the pipeline mixes labels.
        pipeline: Callable on `{"images", "labels"}` batches, e.g. `augmentation()`.
        parallel: Bool. Map batches in parallel. Without `first_batch`, a
            seeded pipeline draws from one seed generator per layer, so
            parallel batches race for its state: pass `False` for the same
            augmentation on every run. Defaults to `True`.
        first_batch: `None`, or the int index of the dataset's first batch in
            the whole run (0 from the start; `epoch * steps_per_epoch` for a
            stream that starts at `epoch`). Then every draw of a layer is a
            function of its seed and the batch's index alone: the same batch
            gets the same augmentation in any run, in parallel too, and a run
            resumed at an epoch continues as the uninterrupted one would.
            Needs a `keras.layers.Pipeline` of seeded Keras image
            preprocessing layers (`augmentation(..., seed=...)`). Defaults to
            `None`.

    Returns:
        The mapped dataset of `(images, labels)` batches.

    Raises:
        kadapt.extras.MissingExtraError: TensorFlow is not installed.
    """
    tf = require("tensorflow", extra="tensorflow")
    if isinstance(pipeline, keras.layers.Pipeline) and not pipeline.layers:
        return dataset  # Keras' Pipeline cannot be called without layers.
    calls = tf.data.AUTOTUNE if parallel else None
    if first_batch is None:
        def apply(images, labels):
            out = pipeline({"images": images, "labels": labels}, training=True)
            return out["images"], out["labels"]

        return dataset.map(apply, num_parallel_calls=calls)
    check_range("first_batch", first_batch, low=0, integer=True)
    layers = _seeded_layers(pipeline)

    def apply_indexed(index, batch):
        images, labels = batch
        for layer in layers:
            with _tensorflow_ops(layer):
                seeds = _BatchSeeds(layer.seed, index)
                data = {"images": images, "labels": labels}
                transformation = layer.get_random_transformation(data, training=True, seed=seeds)
                images = layer.transform_images(images, transformation, training=True)
                labels = layer.transform_labels(labels, transformation, training=True)
        return images, labels

    return dataset.enumerate(start=first_batch).map(apply_indexed, num_parallel_calls=calls)


@contextlib.contextmanager
def _tensorflow_ops(layer):
    """The layer computes with TensorFlow ops inside tf.data whatever the Keras backend (JAX's
    random ops cannot take a graph tensor), as Keras' own `__call__` does there."""
    layer.backend.set_backend("tensorflow")
    try:
        yield
    finally:
        layer.backend.reset()


def _seeded_layers(pipeline):
    layers = getattr(pipeline, "layers", None)
    if not isinstance(pipeline, keras.layers.Pipeline) or not all(
            hasattr(layer, "get_random_transformation") and isinstance(getattr(layer, "seed", None), int)
            for layer in layers):
        raise ValueError(
            "Argument `first_batch` needs a keras.layers.Pipeline of seeded Keras image preprocessing "
            "layers, e.g. kadapt.augment.augmentation(flip=True, seed=0). "
            f"Received: pipeline={pipeline!r} with layers {layers!r}")
    return layers


class _BatchSeeds(keras.random.SeedGenerator):
    """A seeded layer's seeds for one batch: draw k is `[64 * seed + k, batch index]`.

    Keras' random ops take it as a `SeedGenerator`; unlike one, it holds no
    state, so a batch's draws depend on the batch's index alone. Layer
    seeds one apart (`augmentation` gives layer i `seed + i`) never share a
    seed while a layer draws fewer than 64 times per batch.
    """

    def __init__(self, seed, batch_index):  # noqa: D107  (no state variable: not SeedGenerator's __init__)
        import tensorflow as tf  # inside tf.data's graph (augment_dataset required it)

        self._tf = tf
        self._first = 64 * seed
        self._batch = tf.cast(batch_index, "int64")
        self._draws = 0

    def next(self, ordered=True):
        if self._draws >= 64:
            raise RuntimeError("An augmentation layer drew more than 64 seeds for one batch.")
        tf = self._tf
        seed = tf.stack([tf.constant(self._first + self._draws, "int64"), self._batch])
        self._draws += 1
        return seed
