"""kadapt's JAX step under `keras.distribution`: a mesh whose batch axis splits every batch.

Keras' JAX trainer places each batch on the mesh of the current distribution
(`keras.distribution.DataParallel`, or `ModelParallel` with a batch axis):
its rows are split over the devices of the batch axis, so every batch a step
sees must have a multiple of that axis' size in rows, the ragged last one
included. Keras' own message for a batch that does not divide is JAX's
sharding error; kadapt checks the batch size at `fit` and names the fix.

The accumulating step itself is one SPMD program of the logical batch: XLA
partitions the micro-steps and the one update over the mesh, and
out-of-memory recovery's smaller micro-batch is every device's at once. A
micro-batch counts global rows; where it divides over the batch axis, micro-
batch i is made of rows of every device's own share of the logical batch
(`local_slice`, `local_stack`), so no rows move between devices: the sum
over the logical batch is the same, in another order. Its memory plan (`kadapt.batching.jax.memory_plan`)
is of that partitioned program: the batch and state carry the mesh's
shardings, and XLA reports one device's buffers.
"""

from __future__ import annotations

from typing import Any

import jax
import keras
import numpy as np


def batch_shards() -> int:
    """The devices of the current distribution's batch axis: 1 without one."""
    distribution = keras.distribution.distribution()
    if distribution is None or getattr(distribution, "batch_dim_name", None) is None:
        return 1
    mesh = distribution.device_mesh
    return int(mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)])


def check_fit_batches(x: Any, batch_size: int | None) -> None:
    """Raises `ValueError` where a batch of `fit(x, batch_size=...)` would not
    divide over the batch axis of the current distribution's mesh.

    Arrays only: a dataset's batches are known when they come, and there
    Keras' own placement raises.
    """
    shards = batch_shards()
    rows = _rows(x)
    if shards == 1 or rows is None:
        return
    batch_size = batch_size or 32  # Keras' default for arrays
    axis = _axis_text(shards)
    if batch_size % shards:
        raise ValueError(
            f"Argument `batch_size` must be a multiple of the {axis} (every device trains an equal "
            f"share of each batch): use batch_size={_multiples(batch_size, shards)}, or a mesh whose "
            f"batch axis divides it. Received: batch_size={batch_size}"
        )
    last = rows % batch_size
    if last % shards:
        raise ValueError(
            f"The last batch of {rows} rows at batch_size={batch_size} has {last} rows, not a multiple "
            f"of the {axis}: drop the last {last % shards} row(s) or choose a batch_size that leaves a "
            f"multiple of {shards}. Received: {rows} rows, batch_size={batch_size}"
        )


def sharded_batch(specs: tuple) -> tuple:
    """`jax.ShapeDtypeStruct`s of a batch, with the distribution's data layout."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return specs
    return jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                       sharding=distribution.get_data_layout(s.shape).backend_layout), specs)


def sharded_state(groups: tuple, specs: tuple) -> tuple:
    """`specs` (the state's shapes, one list per variable group) with each
    variable's sharding, under a distribution."""
    if keras.distribution.distribution() is None:
        return specs
    return tuple([jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=getattr(v.value, "sharding", None))
                  for v, s in zip(group, group_specs)] for group, group_specs in zip(groups, specs))


def _rows(x):
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(x) if isinstance(leaf, (np.ndarray, jax.Array))]
    return int(np.shape(leaves[0])[0]) if leaves else None


def _axis_text(shards):
    name = keras.distribution.distribution().batch_dim_name
    return f"{shards} devices of the mesh's batch axis ({name!r})"


def _multiples(batch_size, shards):
    below = batch_size // shards * shards
    above = below + shards
    return f"{below} or {above}" if below else str(above)


def device_local(rows: int, micro: int) -> int:
    """The shards a logical batch of `rows` splits into micro-batches of
    `micro` by: each device's micro-batch i is rows of its own share of the
    batch (no rows move between devices); 1 (global rows, in order) without
    a mesh or where `rows` or `micro` does not divide over its batch axis."""
    shards = batch_shards()
    return shards if shards > 1 and rows % shards == 0 and micro % shards == 0 else 1


def local_slice(t: Any, start: Any, size: int, shards: int) -> Any:
    """Rows `start:start + size` of every device's share of `t` (`shards` of
    them, from `device_local`), as one micro-batch of `size` rows: device d's
    rows `d * rows / shards + start / shards` onwards. `start` may be traced."""
    if shards == 1:
        return jax.lax.dynamic_slice_in_dim(t, start, size)
    shares = t.reshape((shards, t.shape[0] // shards, *t.shape[1:]))
    part = jax.lax.dynamic_slice_in_dim(shares, start // shards, size // shards, axis=1)
    return part.reshape((size, *t.shape[1:]))


def local_stack(t: Any, micro: int, num_full: int, shards: int) -> Any:
    """The first `num_full` micro-batches of `t` stacked on a new leading
    axis (for `lax.scan`), each made of every device's own rows."""
    if shards == 1:
        return t[: num_full * micro].reshape((num_full, micro, *t.shape[1:]))
    shares = t.reshape((shards, t.shape[0] // shards, *t.shape[1:]))[:, : num_full * micro // shards]
    stacked = shares.reshape((shards, num_full, micro // shards, *t.shape[1:]))
    return jax.numpy.swapaxes(stacked, 0, 1).reshape((num_full, micro, *t.shape[1:]))
