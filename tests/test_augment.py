"""kadapt.augment: Keras' augmentation layers in tf.data, and `expand`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from kadapt.augment import augment_dataset
from kadapt.augment import augmentation
from kadapt.augment import expand


def _images(rows=12, size=6, seed=0):
    return np.random.default_rng(seed).uniform(1.0, 2.0, size=(rows, size, size, 1)).astype("float32")


def _one_hot(rows, classes=3):
    return np.eye(classes, dtype="float32")[np.arange(rows) % classes]


def _batches(images, labels, pipeline):
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(len(images))
    return [(a.numpy(), b.numpy()) for a, b in augment_dataset(dataset, pipeline).repeat(3)]


def test_flip_returns_each_image_or_its_mirror_and_keeps_labels():
    images, labels = _images(), _one_hot(12)
    flipped_any = False
    for out, out_labels in _batches(images, labels, augmentation(flip=True, seed=3)):
        mirrored = np.all(out == images[:, :, ::-1], axis=(1, 2, 3))
        assert np.all(mirrored | np.all(out == images, axis=(1, 2, 3)))
        np.testing.assert_array_equal(out_labels, labels)
        flipped_any |= mirrored.any()
    assert flipped_any


def test_translation_moves_a_pixel_by_at_most_the_limit():
    images = np.zeros((8, 9, 9, 1), "float32")
    images[:, 4, 4] = 1.0
    moved = set()
    for out, _ in _batches(images, _one_hot(8), augmentation(flip=False, translate=2 / 9, seed=0)):
        for image in out:
            (row, column), = np.argwhere(image[..., 0] == 1.0)
            assert abs(row - 4) <= 2 and abs(column - 4) <= 2 and image.sum() == 1.0
            moved.add((row, column))
    assert len(moved) > 1


@pytest.mark.parametrize("kwargs", [dict(cutmix=1.0), dict(mixup=0.4), dict(cutout=1.0, cutmix=1.0, mixup=0.4)])
def test_mixing_layers_make_soft_labels_that_sum_to_one(kwargs):
    images, labels = _images(), _one_hot(12)
    mixed = False
    for out, out_labels in _batches(images, labels, augmentation(flip=False, seed=0, **kwargs)):
        assert out.shape == images.shape
        np.testing.assert_allclose(out_labels.sum(axis=1), 1.0, rtol=1e-6)
        assert np.all(out_labels >= 0)
        mixed |= not np.isin(out_labels, [0.0, 1.0]).all()
    assert mixed  # unchanged one-hot labels would pass the checks above


def test_empty_pipeline_is_the_identity():
    images, labels = _images(), _one_hot(12)
    out, out_labels = _batches(images, labels, augmentation(flip=False))[0]
    np.testing.assert_array_equal(out, images)
    np.testing.assert_array_equal(out_labels, labels)


@pytest.mark.parametrize("method", ["mixup", "cutmix", "cutout"])
def test_expand_appends_the_right_count_with_labels_summing_to_one(method):
    images, labels = _images(rows=10)[..., 0], np.arange(10) % 3
    x, y = expand(images, labels, method=method, factor=0.5, seed=0)
    assert x.shape == (15, 6, 6) and y.shape == (15, 3) and x.dtype == y.dtype == np.float32
    np.testing.assert_array_equal(x[:10], images)
    np.testing.assert_array_equal(y[:10], np.eye(3)[labels])
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
    if method != "cutout":  # cutout keeps the label; mixing must make soft ones
        assert not np.isin(y[10:], [0.0, 1.0]).all()


def test_expand_cutout_erases_a_patch_of_a_training_image_and_keeps_its_label():
    images, labels = _images(rows=10, size=12), np.arange(10) % 3
    x, y = expand(images, labels, method="cutout", factor=1.0, seed=1)
    for new, new_label in zip(x[10:], y[10:]):
        kept = new != 0
        sources = [i for i in range(10) if np.array_equal(new[kept], images[i][kept])]
        assert sources and (~kept).any()
        assert any(np.array_equal(new_label, np.eye(3)[labels[i]]) for i in sources)


def test_expand_is_reproducible_with_a_seed():
    images, labels = _images(rows=10), np.arange(10) % 3
    first, second = expand(images, labels, "mixup", seed=5), expand(images, labels, "mixup", seed=5)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(method="blend"), ValueError, r"`method` must be one of \['cutmix', 'cutout', 'mixup'\]. Received: method='blend'"),
        (dict(factor=0.0), ValueError, r"`factor` must be in \(0.0, None\]. Received: factor=0.0"),
        (dict(factor="half"), TypeError, r"`factor` must be a number. Received: factor='half'"),
        (dict(y=np.zeros(4, int)), ValueError, r"`x` and `y` must have the same length. Received: len\(x\)=10, len\(y\)=4"),
        (dict(y=np.zeros(10, "float32")), TypeError, r"`y` must be int labels \(N,\) or one-hot labels"),
        (dict(num_classes=2), ValueError, r"`num_classes` must be an int above the largest label 2. Received: num_classes=2"),
        (dict(x=np.zeros((10, 6))), ValueError, r"`x` must be images of shape \(N, H, W\) or \(N, H, W, C\). Received: x.shape=\(10, 6\)"),
    ],
)
def test_expand_rejects_bad_arguments(kwargs, error, message):
    arguments = {"x": _images(rows=10), "y": np.arange(10) % 3, **kwargs}
    with pytest.raises(error, match=message):
        expand(**arguments)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(flip=1), TypeError, r"`flip` must be a bool. Received: flip=1"),
        (dict(translate=1.0), ValueError, r"`translate` must be in \[0.0, 1.0\). Received: translate=1.0"),
        (dict(cutmix=2.0), ValueError, r"`cutmix` must be in \[0.0, 1.0\]. Received: cutmix=2.0"),
        (dict(mixup=-0.1), ValueError, r"`mixup` must be in \[0.0, None\]. Received: mixup=-0.1"),
    ],
)
def test_augmentation_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        augmentation(**kwargs)


def test_pipeline_is_keras_layers():
    pipeline = augmentation(flip=True, translate=0.1, cutout=0.5, cutmix=1.0, mixup=0.2)
    assert [type(layer) for layer in pipeline.layers] == [
        keras.layers.RandomFlip, keras.layers.RandomTranslation, keras.layers.RandomErasing,
        keras.layers.CutMix, keras.layers.MixUp,
    ]


@pytest.mark.backends("tensorflow", "jax")  # on JAX the layers must compute with TensorFlow ops in tf.data
def test_indexed_augmentation_is_a_function_of_the_batch_index_alone():
    images, labels = np.random.default_rng(0).random((20, 8, 8, 1), "float32"), _one_hot(20)
    pipeline = augmentation(flip=True, translate=0.25, cutout=0.5, cutmix=1.0, mixup=0.2, seed=3)
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(5)

    def run(dataset, first_batch, parallel=True):
        return [(a.numpy(), b.numpy()) for a, b in augment_dataset(dataset, pipeline, parallel, first_batch)]

    whole = run(batches, 0)
    for again in (run(batches, 0, parallel=False), [None, None] + run(batches.skip(2), 2)):
        for got, want in zip(again, whole):
            if got is not None:
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
    assert not np.array_equal(whole[0][0], images[:5])  # augmented
    shifted = run(batches, 1)  # the same rows as other batches of a run: other draws
    assert not np.array_equal(shifted[1][0], whole[1][0])


def test_indexed_augmentation_needs_seeded_layers():
    batches = tf.data.Dataset.from_tensor_slices((np.zeros((4, 8, 8, 1), "float32"), _one_hot(4))).batch(2)
    with pytest.raises(ValueError, match="seeded Keras image preprocessing layers"):
        augment_dataset(batches, augmentation(flip=True), first_batch=0)
    with pytest.raises(ValueError, match="first_batch"):
        augment_dataset(batches, augmentation(flip=True, seed=0), first_batch=-1)
