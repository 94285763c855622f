"""Several JAX processes as one: `jax.distributed.initialize` under Keras' own variables.

Keras' JAX engine beyond one process is `keras.distribution`: every process
runs the same program on a mesh of all processes' devices, and
`keras.distribution.initialize` reads the cluster from
`KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator, process 0's
`host:port`), `KERAS_DISTRIBUTION_NUM_PROCESSES` and
`KERAS_DISTRIBUTION_PROCESS_ID` -- the variables `kadapt train --workers`
sets on JAX, as it sets `TF_CONFIG` on TensorFlow. `initialize_processes`
reads the same variables, checks them, and starts JAX with bounds on time
(JAX's defaults wait 5 minutes for the others to join and 100 s for a lost
heartbeat) and with CPU collectives (gloo, over TCP), then trains
data-parallel over every device (`keras.distribution.DataParallel`).

Each process feeds its own share of every global batch: Keras' JAX trainer
assembles the global batch from the processes' local rows (`jax.make_array_
from_process_local_data`), so a process hands `fit` its `process_rows` and
the per-process batch size. One step is then one global batch, exactly.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
JOIN_TIMEOUT_SECONDS = 60  # the others must join within this
HEARTBEAT_TIMEOUT_SECONDS = 10  # a process silent this long is lost: the others end


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """This process's place among the JAX processes of one run."""

    index: int
    count: int
    coordinator: str

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def cluster_from_environment(environ=None) -> ProcessGroup | None:
    """The `ProcessGroup` Keras' variables describe, or `None` where
    `KERAS_DISTRIBUTION_NUM_PROCESSES` is not set. Raises `ValueError` for a
    malformed one, before JAX starts."""
    environ = os.environ if environ is None else environ
    if not environ.get(NUM_PROCESSES):
        return None
    count, index = _int(environ, NUM_PROCESSES), _int(environ, PROCESS_ID)
    coordinator = environ.get(ADDRESSES, "").split(",")[0].strip()
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"`{PROCESS_ID}` must be in [0, {NUM_PROCESSES}) and {NUM_PROCESSES} positive. "
                         f"Received: {PROCESS_ID}={index}, {NUM_PROCESSES}={count}")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"`{ADDRESSES}` must start with the coordinator's host:port (process 0's), e.g. "
                         f"127.0.0.1:12345. Received: {ADDRESSES}={environ.get(ADDRESSES)!r}")
    return ProcessGroup(index, count, coordinator)


def initialize_processes(group: ProcessGroup) -> None:
    """Joins the JAX processes of `group` (CPU collectives over gloo) and sets
    `keras.distribution.DataParallel` over all of their devices; each process
    feeds its own rows (`process_rows`). Call before JAX runs anything."""
    import jax
    import keras

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(group.coordinator, group.count, group.index,
                               initialization_timeout=JOIN_TIMEOUT_SECONDS,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS)
    distribution = keras.distribution.DataParallel(devices=jax.devices())
    distribution.auto_shard_dataset = False  # each process feeds its own share
    keras.distribution.set_distribution(distribution)


def process_rows(rows: np.ndarray, batch_size: int, group: ProcessGroup) -> np.ndarray:
    """This process's rows of `rows` batched by the global `batch_size`: the
    `group.index`-th of `group.count` equal parts of each batch, the ragged
    last included, in order. Fit them with `batch_size // group.count`."""
    if batch_size % group.count:
        raise ValueError(f"Argument `batch_size` (the global batch) must be a multiple of the {group.count} "
                         f"processes: use {batch_size - batch_size % group.count or group.count}. "
                         f"Received: batch_size={batch_size}")
    parts = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        if len(batch) % group.count:
            raise ValueError(f"The last batch has {len(batch)} rows, not a multiple of the {group.count} processes: "
                             f"drop {len(batch) % group.count} row(s). Received: {len(rows)} rows, "
                             f"batch_size={batch_size}")
        share = len(batch) // group.count
        parts.append(batch[group.index * share:(group.index + 1) * share])
    return np.concatenate(parts)


def _int(environ, name):
    try:
        return int(environ.get(name, ""))
    except ValueError:
        raise ValueError(f"`{name}` must be an int. Received: {name}={environ.get(name)!r}") from None
