"""Out-of-memory recovery on TensorFlow: shrink the micro-batch and retry the same batch.

`RecoveringTrainFunction` is what an accumulating model's `train_function`
is. It pulls each logical batch from the iterator in Python, so when the step
runs out of memory (any form `kadapt.batching.out_of_memory` recognizes) it
still holds the batch: it restores what the failed step touched (BatchNorm
statistics, RNG seed states, metrics, the loss scale and iteration counter),
shrinks the micro-batch and runs the SAME batch again. The weights need no
restoring: the optimizer applies only after every micro-batch succeeded. The
logical batch, and so the training trajectory, is unchanged.

With more than one replica (`MirroredStrategy`, or a multi-worker job) the
step runs in two halves, so that running out of memory never interrupts a
collective: a failed all-reduce aborts TensorFlow's collectives for the rest
of the process. All replicas then retry with the same smaller micro-batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from kadapt._compat import build_training_state
from kadapt.batching import training_state
from kadapt.batching.oom_recovery import proposed_micro_batch
from kadapt.batching.oom_recovery import shrink
from kadapt.batching.tensorflow.out_of_memory import is_out_of_memory
from kadapt.batching.tensorflow.step_functions import replica_step_function
from kadapt.batching.tensorflow.step_functions import rows_unknown
from kadapt.batching.tensorflow.step_functions import traces
from kadapt.batching.tensorflow.step_functions import two_step_functions


class RecoveringTrainFunction:
    """Callable `iterator -> logs` that trains `steps_per_execution` batches.

    Args:
        model: An accumulating model (`kadapt.AccumulatingTrainStep`).
    """

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        # One traced step (or pair of halves) per micro-batch size, kept: a size
        # traced before runs that same trace again, so the probe's trial at a
        # size and training at it run one compiled step, not two traces of it.
        self._steps = {}  # {micro-batch size: {"one": one micro-batch's step, "any": any batch's}}
        self._larger_batch_seen = {}  # {micro-batch size: whether a batch of more rows came}
        self._halves_by_size = {}
        self._needs_trace = True
        self._reader = None

    @property
    def compiles(self) -> int:
        """Traces of the step so far, each an XLA compile under `jit_compile`:
        one per micro-batch size (a trace-time constant) and input shape."""
        halves = [f for pair in self._halves_by_size.values() for f in pair]
        return sum(traces(f) for steps in self._steps.values() for f in steps.values()) + \
            sum(traces(f) for f in halves)

    def __call__(self, iterator: Iterator) -> dict[str, Any] | None:
        outputs = None
        for _, data in zip(range(self.model.steps_per_execution), iterator):
            outputs = self._run_with_recovery(data)
        if outputs is None:
            raise StopIteration
        return outputs

    def _run_with_recovery(self, data):
        model = self.model
        if model.max_oom_retries == 0:
            return self._traced_step(data)(data)
        if _replicas(model) > 1 or _in_multi_worker_mode(model):
            return self._run_with_recovery_on_every_replica(data)
        if self._needs_trace and not model.run_eagerly:
            # Trace first: the first trace creates the model's, the metrics'
            # and the optimizer's variables, which the snapshot must include.
            self._traced_step(data)
            self._needs_trace = False
        saved = self._snapshot()
        attempt = 0
        while True:  # ends by returning, or by shrink raising
            try:
                return self._traced_step(data)(data)
            except tf.errors.OpError as error:
                if not is_out_of_memory(error):
                    raise
                training_state.restore(saved)
                shrink(model, error, attempt)
                attempt += 1

    def _run_with_recovery_on_every_replica(self, data):
        """One step on every replica, in two halves.

        Every replica computes its micro-batches' gradients (`compute_step`, no
        collective after them). In one process a replica that runs out of
        memory fails that half on all of them; the workers of a multi-worker
        job then exchange one flag: whether they ran out of memory, with the
        micro-batch each would retry with. If any did, every replica restores
        its state and retries the same logical batch with the smallest of
        those micro-batches, so all trace the same step and none waits alone
        in a collective; else all finish the step (the gradients' all-reduce
        and the one update)."""
        model = self.model
        if self._needs_trace and not model.run_eagerly:
            self._halves()[0].get_concrete_function(data)  # builds what the snapshot must hold
            self._needs_trace = False
        saved = self._snapshot()
        attempt = 0
        while True:  # ends by returning, or by raising OutOfMemoryError on every replica
            compute, finish = self._halves()
            try:
                outputs, error = compute(data), None
            except tf.errors.OpError as caught:
                if not is_out_of_memory(caught):
                    raise
                outputs, error = None, caught
            failed, smallest = _agree(model, error)
            if not failed:
                return finish(outputs)
            training_state.restore(saved)
            reason = error or tf.errors.ResourceExhaustedError(
                None, None, f"another worker of the job ran out of memory ({failed} of them)")
            shrink(model, reason, attempt, smaller=smallest)
            attempt += 1

    def _snapshot(self):
        """`(variable, value before the step)` for what a failed step may have
        touched (`training_state.state_variables` without the weights and
        slots), read in one traced call, not one eager copy per variable: it
        runs before every step (measured on a loaded 2-core Xeon, 4 variables:
        0.3-1.0 ms as eager copies, 0.2 ms in one call)."""
        variables = training_state.state_variables(self.model, include_weights=False, include_slots=False)
        key = tuple(id(v) for v in variables)
        if self._reader is None or self._reader[0] != key:
            self._reader = (key, _values_function(variables))
        return list(zip(variables, self._reader[1]()))

    def _halves(self):
        """The traced `compute_step` and `finish_step` for the current micro-batch size."""
        micro = self.model.micro_batch_size
        if micro not in self._halves_by_size:
            self._halves_by_size[micro] = two_step_functions(self.model)
        return self._halves_by_size[micro]

    def _traced_step(self, data):
        """`_step_function(data)`, traced once for any number of rows shaped as `data`'s.

        Keras traces its step for the dataset's element spec, whose batch
        dimension is unknown; this function sees each batch as a concrete
        tensor, and a trace for the first batch's rows alone would trace
        again at the epoch's smaller last batch (`reduce_retracing` relaxes
        the shape only on the second call): two traces, two XLA compiles under
        `jit_compile`. Traced first for a spec with the rows left unknown,
        every batch of the run calls that one trace; and with the model's,
        metrics' and optimizer's variables made before it (Keras makes them in
        the first trace without a distribution strategy, and a trace that
        makes variables is traced again)."""
        function = self._step_function(data)
        if not self.model.run_eagerly and traces(function) == 0:
            # Variables made in a trace make `tf.function` trace again: make them first.
            build_training_state(self.model, data)
            function.get_concrete_function(rows_unknown(data))
        return function

    def _step_function(self, data):
        """The traced one-step function for the current micro-batch size (kept
        per size): while no batch at that size has had more rows than a micro-batch, the step of one
        micro-batch (`one_micro_batch_step`: one build of the network's pass
        in the trace, not three), then the step of any batch for every batch
        after (one more trace, only where a larger batch follows smaller ones)."""
        micro = self.model.micro_batch_size
        steps = self._steps.setdefault(micro, {})
        larger = self._larger_batch_seen.get(micro, False) or not _at_most(data, micro)
        self._larger_batch_seen[micro] = larger
        kind = "any" if larger else "one"
        if kind not in steps:
            step = self.model.train_step if larger else self.model.one_micro_batch_step
            steps[kind] = replica_step_function(self.model, step)
        return steps[kind]


def _at_most(data, rows):
    """Whether the batch `data` has at most `rows` rows (its first tensor's, where known; `rows` an int)."""
    if not isinstance(rows, int):
        return False
    shapes = [tuple(t.shape) for t in tf.nest.flatten(data) if len(getattr(t, "shape", ())) > 0]
    return bool(shapes) and shapes[0][0] is not None and shapes[0][0] <= rows


def _values_function(variables):
    """A traced function returning the current values of `variables`. A value
    read stays as read: TensorFlow copies a variable's buffer on write while a
    read of it is alive. Traced from a partial, not a closure: TensorFlow
    counts traces by the Python code they come from and warns of retracing
    when one code traces often, as one reader per model would."""
    return tf.function(functools.partial(_values, variables))


def _values(variables):
    return [tf.identity(v.value) for v in variables]


def _agree(model, error):
    """`(how many workers ran out of memory, the micro-batch all retry with)`
    after this process's `compute` half raised `error` (or `None`)."""
    micro = model.micro_batch_size
    proposal = micro if error is None else proposed_micro_batch(model, micro)
    if not _in_multi_worker_mode(model):
        return int(error is not None), proposal  # one process: the half failed on every replica
    return _exchange(model.distribute_strategy, error is not None, proposal)


def _exchange(strategy, failed, proposal):
    """One collective over all workers: how many ran out of memory, and the
    smallest micro-batch any of them proposes."""
    from kadapt.batching.tensorflow.multi_worker import gather_values

    values = gather_values(strategy, [float(failed), float(proposal)]).astype(int)
    return int(values[:, 0].sum()), int(values[:, 1].min())


def _in_multi_worker_mode(model):
    from kadapt.batching.tensorflow.multi_worker import in_multi_worker_mode

    return in_multi_worker_mode(model.distribute_strategy)


def _replicas(model):
    return model.distribute_strategy.num_replicas_in_sync
