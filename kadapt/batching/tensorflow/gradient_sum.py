"""Summing micro-batch gradients, dense or sparse, inside a `tf.while_loop`.

A dense gradient is summed in float32. A sparse one (`tf.IndexedSlices`,
an `Embedding`'s on TensorFlow) is summed as the full batch would have it,
because Keras' Adam, RMSprop and AdamW square each slice before summing
duplicates (`ops.square` on `IndexedSlices`); a densified sum would square
the sum instead, a different update. Two kinds:

- `Slices`: the looked-up rows come from the data (token ids): one slice per
  row and lookup, so the full batch's slices are the micro-batches' slices
  together. They are concatenated; the loop state's first dimension grows.
- `SameSlices`: the looked-up rows do not depend on the data (positions
  `0 .. length - 1` added to every row): the full batch looks them up once,
  each slice summing all rows. The micro-batches' slices are summed slice by
  slice.

XLA compiles no loop state that grows. Under XLA the `Slices` go into a
buffer reserved after the first micro-batch: one slot per micro-batch, each as
large as the first micro-batch's slices (a later one, the ragged tail, may
have fewer). The unused rows of a slot stay zero slices of row 0, which add
nothing to any sum over slices, squared or not.
"""

import collections

import tensorflow as tf


Slices = collections.namedtuple("Slices", ["values", "indices"])
SameSlices = collections.namedtuple("SameSlices", ["values", "indices"])


def as_parts(gradient, variable, data):
    """A micro-batch's gradient as loop state: a float32 tensor (zeros for
    `None`), or for `IndexedSlices` float32 `Slices` when their indices are
    computed from `data` (the micro-batch's tensors), else `SameSlices`."""
    if gradient is None:
        return tf.zeros(variable.shape, tf.float32)
    if isinstance(gradient, tf.IndexedSlices):
        kind = Slices if _depends_on(gradient.indices, data) else SameSlices
        return kind(tf.cast(gradient.values, tf.float32), gradient.indices)
    return tf.cast(tf.convert_to_tensor(gradient), tf.float32)


def _depends_on(tensor, data):
    """Whether graph tensor `tensor` is computed from any of `data`. Eagerly
    (`run_eagerly=True`) there is no graph to read: data is assumed."""
    if tf.executing_eagerly() or not hasattr(tensor, "op"):
        return True
    sources = {t.name for t in tf.nest.flatten(data) if t is not None and hasattr(t, "op")}
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        for source in op.inputs:
            if source.name in sources:
                return True
            stack.append(source.op)
    return False


def add(parts_a, parts_b):
    """The sum of two micro-batches' gradients (lists of parts)."""
    return [_add_one(a, b) for a, b in zip(parts_a, parts_b, strict=True)]


def _add_one(a, b):
    if isinstance(a, Slices):
        return Slices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0))
    if isinstance(a, SameSlices):
        return SameSlices(a.values + b.values, a.indices)
    return a + b


def reserve(parts, slots):
    """The first micro-batch's parts with room for `slots` micro-batches'
    slices (under XLA); dense parts as they are."""
    return [Slices(_pad(p.values, slots), _pad(p.indices, slots)) if isinstance(p, Slices) else p for p in parts]


def _pad(tensor, slots):
    rows = tf.shape(tensor)[0] * (slots - 1)
    return tf.concat([tensor, tf.zeros(tf.concat([[rows], tf.shape(tensor)[1:]], 0), tensor.dtype)], 0)


def put(parts, step_parts, slot, slots):
    """`add` for reserved parts: a sparse gradient's slices go into `slot`."""
    return [_put_one(a, b, slot, slots) for a, b in zip(parts, step_parts, strict=True)]


def _put_one(a, b, slot, slots):
    if not isinstance(a, Slices):
        return _add_one(a, b)
    rows = slot * (tf.shape(a.values)[0] // slots) + tf.range(tf.shape(b.values)[0])
    rows = rows[:, None]
    return Slices(tf.tensor_scatter_nd_update(a.values, rows, b.values),
                  tf.tensor_scatter_nd_update(a.indices, rows, b.indices))


def shape_invariants(parts):
    """`tf.while_loop` shape invariants: a sparse gradient gains slices."""
    return [
        Slices(tf.TensorShape([None]).concatenate(p.values.shape[1:]), tf.TensorShape([None]))
        if isinstance(p, Slices) else tf.nest.map_structure(lambda t: t.shape, p)
        for p in parts
    ]


def as_gradients(parts, variables):
    """Loop state back to gradients: tensors, or `IndexedSlices` shaped as
    their variables."""
    return [
        tf.IndexedSlices(p.values, p.indices, tf.constant(list(v.shape), p.indices.dtype))
        if isinstance(p, (Slices, SameSlices)) else p
        for p, v in zip(parts, variables, strict=True)
    ]


def scale(gradient, factor):
    """`gradient * factor`, slices kept."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * factor, gradient.indices, gradient.dense_shape)
    return gradient * factor


def cast(gradient, dtype):
    """`gradient` cast to `dtype`, slices kept."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(tf.cast(gradient.values, dtype), gradient.indices, gradient.dense_shape)
    return tf.cast(gradient, dtype)


def dense(gradient):
    """The gradient as one tensor (duplicate slices summed), for norms."""
    return tf.convert_to_tensor(gradient)
