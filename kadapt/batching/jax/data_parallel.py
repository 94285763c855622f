"""kadapt's JAX step under `keras.distribution`: a mesh whose batch axis splits every batch.

Keras' JAX trainer places each batch on the mesh of the current distribution
(`keras.distribution.DataParallel`, or `ModelParallel` with a batch axis):
its rows are split over the devices of the batch axis, so every batch a step
sees must have a multiple of that axis' size in rows, the ragged last one
included. Keras' own message for a batch that does not divide is JAX's
sharding error; kadapt checks the batch size at `fit` and names the fix.

The accumulating step itself is one SPMD program of the logical batch: XLA
partitions the micro-steps and the one update over the mesh, so every device
takes the same micro-batch, and out-of-memory recovery's smaller micro-batch
is every device's at once. Its memory plan (`kadapt.batching.jax.memory_plan`)
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
