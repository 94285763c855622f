"""The `tf.data` pipeline of the training rows."""

import tensorflow as tf


def training_dataset(x, y, batch_size, seed, augmentation=None):
    """Shuffled (a new order every epoch, seeded) logical batches of `batch_size`
    rows, the last one ragged, augmented on the fly by `augmentation` (a
    `kadapt.augment.augmentation` pipeline) when given."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.shuffle(len(x), seed=seed, reshuffle_each_iteration=True).batch(batch_size)
    if augmentation is not None:
        from kadapt.augment import augment_dataset

        dataset = augment_dataset(dataset, augmentation)
    return dataset.prefetch(tf.data.AUTOTUNE)
