"""`augmentation`: Keras' image-augmentation layers composed for a `tf.data` pipeline."""

import keras
import tensorflow as tf

from kadapt.validation import check_range


def augmentation(flip=True, translate=0.0, cutout=0.0, cutmix=0.0, mixup=0.0, seed=None):
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


def augment_dataset(dataset, pipeline, parallel=True):
    """Applies `pipeline` to every `(images, labels)` batch of `dataset`.

    Args:
        dataset: Batched `tf.data.Dataset` of `(images, labels)`, labels one-hot
            float if the pipeline mixes labels.
        pipeline: Callable on `{"images", "labels"}` batches, e.g. `augmentation()`.
        parallel: Bool. Map batches in parallel. A seeded pipeline draws from
            one seed generator per layer, so parallel batches race for its
            state: pass `False` for the same augmentation on every run.
            Defaults to `True`.

    Returns:
        The mapped dataset of `(images, labels)` batches.
    """
    if isinstance(pipeline, keras.layers.Pipeline) and not pipeline.layers:
        return dataset  # Keras' Pipeline cannot be called without layers.

    def apply(images, labels):
        out = pipeline({"images": images, "labels": labels}, training=True)
        return out["images"], out["labels"]

    return dataset.map(apply, num_parallel_calls=tf.data.AUTOTUNE if parallel else None)
