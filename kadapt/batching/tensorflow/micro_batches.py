"""Slicing a logical batch into micro-batches inside a traced train step."""

import tensorflow as tf


def batch_size_of(x):
    """Returns the number of rows of the first tensor in `x` as an int32 scalar."""
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.shape(first, out_type=tf.int32)[0]


def slice_rows(structure, start, size):
    """Returns rows `[start, start + size)` of every tensor in `structure`.

    `size` is a Python int when the slice is a full micro-batch, so the
    result keeps a static leading dimension (XLA needs it) even though
    `start` is a loop variable.
    """

    def take(tensor):
        if tensor is None:
            return None
        begin = tf.concat([[start], tf.zeros([tf.rank(tensor) - 1], tf.int32)], 0)
        extent = tf.concat([[size], tf.fill([tf.rank(tensor) - 1], -1)], 0)
        rows = tf.slice(tensor, begin, extent)
        if isinstance(size, int):
            rows = tf.ensure_shape(rows, [size] + tensor.shape[1:].as_list())
        return rows

    return tf.nest.map_structure(take, structure)


def first_rows(structure, size):
    """Returns the first `min(size, rows)` rows of every tensor in `structure`."""
    return tf.nest.map_structure(
        lambda t: None if t is None else t[:size], structure
    )


def rows_from(structure, start):
    """Returns rows `[start, end)` of every tensor in `structure`."""
    return tf.nest.map_structure(
        lambda t: None if t is None else t[start:], structure
    )


def fold(batch, size, num_full, tail, step, first):
    """`first` (micro-batch 0's value) plus `step(rows)` of every other
    micro-batch of `size` rows: the full ones in a `tf.while_loop`, then the
    ragged tail. `step` returns a list of scalars."""

    def body(index, total):
        rows = slice_rows(batch, index * size, size)
        return index + 1, [a + b for a, b in zip(total, step(rows))]

    _, total = tf.while_loop(lambda index, _: index < num_full, body, (tf.constant(1, tf.int32), first),
                             parallel_iterations=1)
    return tf.cond(
        tf.logical_and(tail > 0, num_full > 0),
        lambda: [a + b for a, b in zip(total, step(rows_from(batch, num_full * size)))],
        lambda: total,
    )
