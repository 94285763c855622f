"""On the CPU: the micro-steps as jitted calls looped on the host, one update after them.

XLA on the CPU runs a convolution's gradient inside a loop body (the fused
step's `lax.scan`) many times slower than outside one (JAX 0.10; no XLA flag
changed it), and unrolling the scan lets XLA keep several micro-batches'
activations alive at once. So on the CPU the same micro-step
(`JaxAccumulation._micro_step`) is jitted alone and called once per
micro-batch, the last of them also applying the float32 sum (`_apply_once`,
`_track_loss`): the same arithmetic in the same order as the fused step, one
micro-batch's activations alive at a time (each call ends before the next),
k dispatches per logical batch instead of one. Elsewhere (a GPU) the fused
step runs, one dispatch.

XLA's memory plan (`kadapt.batching.jax.memory_plan.step_plan`) is of the
fused step; the host loop holds the same buffers between calls (the state, the
logical batch, the float32 sum) and one micro-step's temporaries within one.

Not used where an output may carry a mask (the logical batch's mask counts
come from the fused step's inference scan), nor for a single micro-batch (the
fused step has no loop then).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import keras

from kadapt.batching import ghost_batch_norm
from kadapt.batching import logical_batch_loss
from kadapt.batching.jax.data_parallel import batch_shards
from kadapt.batching.jax.data_parallel import device_local
from kadapt.batching.jax.data_parallel import local_slice

# Platforms whose XLA runs a convolution's gradient in a loop body slowly (measured on "cpu").
PLATFORMS = ("cpu",)


def wanted(model: keras.Model) -> bool:
    """Whether `model`'s accumulating step should loop on the host here: not
    under a mesh of several devices in this process (`keras.distribution`),
    where each micro-step would be a program of its own with collectives;
    with many in flight, the CPU's in-process collectives aborted a step
    after 40 s waiting for a device (48 one-row micro-steps on 4 simulated
    devices). One device per process (`kadapt.jax_processes`) collects over
    gloo between processes instead."""
    return (jax.devices()[0].platform in PLATFORMS and not logical_batch_loss.may_mask(model)
            and (batch_shards() == 1 or jax.local_device_count() == 1))


class HostLoopStep:
    """Callable `(state, data) -> (logs, state)`: one logical batch, its
    micro-steps looped on the host; `fused` (the jitted one-call step) where
    the batch is one micro-batch.

    One dispatch per micro-batch: each call slices its rows out of the
    logical batch inside the jitted step, the first also starts the float32
    sum, and the last also applies it (no host-side slices or zeros, each of
    which would be a dispatch of its own).

    Args:
        model: An accumulating model (`kadapt.AccumulatingTrainStep`) on JAX.
        fused: The jitted fused step for the model's micro-batch size.
    """

    def __init__(self, model: keras.Model, fused: Any) -> None:
        self.model, self.fused = model, fused
        self._step = jax.jit(self._step_of, static_argnames=("size", "first", "last", "num_micro", "logical_rows"))

    def __call__(self, state: tuple, data: Any) -> tuple[dict[str, Any], tuple]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        rows = _rows(x)
        micro = min(self.model.micro_batch_size, rows)
        starts = range(0, rows, micro)
        if len(starts) < 2:
            return self.fused(state, data)
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        step = functools.partial(self._step, trainable=trainable, optimizer_variables=optimizer_variables,
                                 batch=(x, y, sample_weight), num_micro=len(starts), logical_rows=rows)
        carry = (non_trainable, metrics_variables)
        for start in starts:
            carry = step(carry, start=start, size=min(micro, rows - start), first=start == 0,
                         last=start == starts[-1])
        return carry

    def _step_of(self, carry, trainable, optimizer_variables, batch, start, size, first, last, num_micro,
                 logical_rows):
        """One micro-step on rows `start:start + size`; the first starts the sum
        from `carry = (non_trainable, metrics)`, the last ends in the update."""
        model = self.model
        if first:
            carry = ([jax.numpy.zeros(v.shape, "float32") for v in trainable], jax.numpy.zeros((), "float32"),
                     *carry)
        shards = device_local(logical_rows, model.micro_batch_size)
        rows = keras.tree.map_structure(
            lambda t: None if t is None else local_slice(t, start, size, shards), batch)
        sample_weight = batch[2]
        context = (trainable, optimizer_variables, logical_batch_loss.LogicalTotals(sample_weight), logical_rows)
        with ghost_batch_norm.per_logical_step_momentum(ghost_batch_norm.batch_norm_layers(model), num_micro):
            carry = model._micro_step(carry, rows, context)
        if not last:
            return carry
        gradients, loss, non_trainable, metrics_variables = carry
        trainable, optimizer_variables = model._apply_once(gradients, trainable, optimizer_variables)
        logs, metrics_variables = model._track_loss(loss, logical_rows, metrics_variables)
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)


def _rows(x):
    return next(t for t in keras.tree.flatten(x) if t is not None).shape[0]
