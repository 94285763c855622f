"""Keras 3 `fit` and `evaluate` under `tf.distribute.MultiWorkerMirroredStrategy`.

Keras (3.15) cannot run either there (keras-team/keras#20585): it builds the
model from `strategy.reduce("MEAN", first batch)`, which fails on a structure
of per-replica values, and it averages each step's metric results with
`strategy.reduce("MEAN", value, axis=0)`, which fails on a scalar. kadapt's
models build from this replica's own part of the first batch
(`AccumulatingTrainStep._maybe_symbolic_build`) and, in multi-worker mode,
evaluate with `StepsFunction` over `test_step`: the metrics are synchronized
across workers already, so any replica's results are the global ones — as in
kadapt's train function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kadapt._compat import spans_several_workers
from kadapt.batching.tensorflow.step_functions import replica_step_function


class WorkerLostError(RuntimeError):
    """A peer of a multi-worker job stopped answering (killed, crashed, cut off) mid-run."""


# What a collective raises when a peer is gone: the connection reset (Unavailable), the
# collective timeout (DeadlineExceeded), or the abort that follows on the other ops.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
               tf.errors.AbortedError)


def worker_lost(error: Exception) -> WorkerLostError:
    """`WorkerLostError` for a collective's `error`: what happened, in one line, and what to do."""
    first = next((line.strip() for line in str(error.message).splitlines() if line.strip()), "")
    return WorkerLostError(
        f"A worker of the multi-worker job stopped answering mid-run ({type(error).__name__}: {first[:300]}). "
        "Every worker stops; restart all of them (with `--resume`, or your BackupAndRestore callback) to "
        "continue from the last checkpoint.")


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` is a `MultiWorkerMirroredStrategy` spanning more than this process."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and spans_several_workers(strategy)


class StepsFunction:
    """Callable `iterator -> logs` that runs `steps_per_execution` steps of `step`."""

    def __init__(self, model: keras.Model, step: Callable) -> None:
        self.model, self.step = model, step
        self._function = None

    def __call__(self, iterator: Iterator) -> dict[str, Any] | None:
        if self._function is None:
            self._function = replica_step_function(self.model, self.step)
        outputs = None
        for _, data in zip(range(self.model.steps_per_execution), iterator):
            outputs = self._function(data)
        if outputs is None:
            raise StopIteration
        return outputs


def chief_values(strategy: tf.distribute.Strategy, values: Sequence[float]) -> list[float]:
    """The chief's `values` (a list of floats) on every worker: one all-gather.

    Under MultiWorkerMirroredStrategy the chief is the collective group's
    first member (task "chief", else worker 0)."""
    return gather_values(strategy, values)[0].tolist()


def gather_values(strategy: tf.distribute.Strategy, values: Sequence[float]) -> np.ndarray:
    """Every worker's `values` (a list of floats, the same length on all):
    an array of shape (workers, len(values)), in task order. One all-gather."""
    gathered = _gather_function(strategy)(tf.constant(values, tf.float32))
    return strategy.experimental_local_results(gathered)[0].numpy().reshape(-1, len(values))


_GATHER_FUNCTIONS = {}


def _gather_function(strategy):
    key = id(strategy)
    if key not in _GATHER_FUNCTIONS:
        @tf.function
        def gather(values):
            # A copy made inside the replica function: an argument gathered as it is fails
            # under MultiWorkerMirroredStrategy ("destinations can not be empty").
            return strategy.run(
                lambda v: tf.distribute.get_replica_context().all_gather(tf.reshape(v, [-1]), axis=0),
                args=(values,))

        _GATHER_FUNCTIONS[key] = gather
    return _GATHER_FUNCTIONS[key]
