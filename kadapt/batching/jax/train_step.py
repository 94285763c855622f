"""The accumulating step on JAX: micro-batches in a `jax.lax.scan`, one `stateless_apply`.

Keras' JAX trainer is functional: `train_step(state, data) -> (logs, state)`
with `state = (trainable, non_trainable, optimizer, metrics)` variables as
arrays. Under `jit` the shapes are static, so the logical batch's rows B, the
micro-batch m, the full micro-batches k_f = B // m and the ragged tail
t = B - k_f m are Python ints: the full micro-batches run in one `lax.scan`
(one micro-batch's activations alive at a time) and the tail, if any, as one
more micro-step. Each micro-step is `jax.value_and_grad` of Keras'
`compute_loss_and_updates` with its loss times its share n_i / B (shares sum
to 1, so a regularizer, which depends only on the weights, counts once; the
compiled losses divide by the logical batch's count through
`kadapt.batching.logical_batch_loss`). The gradients are summed in float32 and
the optimizer applies once; metrics see every micro-batch, the loss tracker
the logical batch's loss once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import keras
from keras import ops

from kadapt.batching import ghost_batch_norm
from kadapt.batching import logical_batch_loss
from kadapt.batching.jax import data_parallel

_ZERO = 0.0


class JaxAccumulation:
    """The JAX half of `kadapt.AccumulatingTrainStep`: its train function and
    `train_step` (Keras' JAX trainer's methods, overridden)."""

    MEASURES_NOISE = False

    def make_train_function(self, force: bool = False) -> Callable:
        from kadapt.batching.jax.train_function import JaxTrainFunction

        if self.train_function is None or force:
            self.train_function = JaxTrainFunction(self)
        return self.train_function

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, **kwargs: Any) -> Any:
        from kadapt.batching.jax.data_parallel import check_fit_batches

        check_fit_batches(x, batch_size)  # under a mesh: every batch splits over its batch axis
        return super().fit(x, y, batch_size=batch_size, **kwargs)

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        step = logical_batch_loss.active_step()
        if step is not None:
            # JAX's step sees the outputs only here (inside `compute_loss_and_updates`).
            step.outputs_are(y_pred)
        return super().compute_loss(x, y, y_pred, sample_weight, training=training)

    def train_step(self, state: tuple, data: Any) -> tuple[dict[str, Any], tuple]:
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        batch = keras.utils.unpack_x_y_sample_weight(data)
        rows = _rows(batch[0])
        micro = min(self._traced_micro_batch_size(), rows)
        num_full, tail = divmod(rows, micro)
        totals = self._logical_totals(batch, trainable, non_trainable, micro, num_full, tail)
        context = (trainable, optimizer_variables, totals, rows)
        carry = (_zeros_like(trainable), ops.zeros((), "float32"), non_trainable, metrics_variables)
        layers = ghost_batch_norm.batch_norm_layers(self)
        with ghost_batch_norm.per_logical_step_momentum(layers, num_full + (tail > 0)):
            carry = self._accumulate_full(carry, batch, micro, num_full, context)
            if tail:
                carry = self._micro_step(carry, _local_rows(batch, num_full * micro, tail, micro), context)
        gradients, loss, non_trainable, metrics_variables = carry
        trainable, optimizer_variables = self._apply_once(gradients, trainable, optimizer_variables)
        logs, metrics_variables = self._track_loss(loss, rows, metrics_variables)
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def _accumulate_full(self, carry, batch, micro, num_full, context):
        """The full micro-batches, one `lax.scan` step each."""
        step = functools.partial(self._micro_step, context=context)
        if num_full == 1:
            # No loop for one: XLA on the CPU runs a convolution's gradient inside a loop
            # body far slower than outside one (measured 40x, JAX 0.10).
            return step(carry, _local_rows(batch, 0, micro, micro))
        shards = data_parallel.device_local(_rows(batch[0]), micro)
        stacked = keras.tree.map_structure(
            lambda t: None if t is None else data_parallel.local_stack(t, micro, num_full, shards), batch)
        carry, _ = jax.lax.scan(lambda c, rows: (step(c, rows), None), carry, stacked)
        return carry

    def _micro_step(self, carry, rows, context):
        """`carry` plus one micro-batch's float32 gradients and loss share;
        its BatchNorm statistics and metrics updated."""
        gradients, loss, non_trainable, metrics_variables = carry
        trainable, optimizer_variables, totals, logical_rows = context
        x, y, sample_weight = rows
        share = _rows(x) / logical_rows

        def shared_loss(trainable):
            with logical_batch_loss.MicroStep(share, totals):
                scaled, aux = self.compute_loss_and_updates(
                    trainable, non_trainable, metrics_variables, x, y, sample_weight,
                    training=True, optimizer_variables=optimizer_variables)
            return ops.cast(scaled, "float32") * share, aux

        (_, aux), step_gradients = jax.value_and_grad(shared_loss, has_aux=True)(trainable)
        unscaled, y_pred, non_trainable, metrics_variables = aux
        gradients = [g + ops.cast(s, "float32") for g, s in zip(gradients, step_gradients)]
        metrics_variables = self._update_metrics(metrics_variables, x, y, y_pred, sample_weight)
        return gradients, loss + ops.cast(unscaled, "float32") * share, non_trainable, metrics_variables

    def _apply_once(self, gradients, trainable, optimizer_variables):
        # One update per logical batch: `iterations` counts logical steps, and a
        # LossScaleOptimizer checks the summed (scaled) gradients once.
        if not trainable:
            return trainable, optimizer_variables
        gradients = [ops.cast(g, v.dtype) for g, v in zip(gradients, trainable)]
        return self.optimizer.stateless_apply(optimizer_variables, gradients, trainable)

    def _update_metrics(self, metrics_variables, x, y, y_pred, sample_weight):
        """The compiled metrics (not the loss tracker) over one micro-batch."""
        with _scope(self.metrics_variables, metrics_variables) as scope:
            self.compute_metrics(x, y, y_pred, sample_weight)
        return _current(scope, self.metrics_variables, metrics_variables)

    def _track_loss(self, loss, rows, metrics_variables):
        """The logical batch's loss into the loss tracker, once; the logs."""
        with _scope(self.metrics_variables, metrics_variables) as scope:
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss, sample_weight=rows)
            logs = self.get_metrics_result()
        return logs, _current(scope, self.metrics_variables, metrics_variables)

    def _logical_totals(self, batch, trainable, non_trainable, micro, num_full, tail):
        """The logical batch's loss divisors per output, counted before the
        micro-steps (`kadapt.batching.logical_batch_loss`): where a layer can
        make a mask, an inference pass over the micro-batches counts the
        outputs' masks (in a `lax.scan`, as the micro-steps run)."""
        x, _, sample_weight = batch
        count = functools.partial(self._counts, trainable, non_trainable)
        rows = (x, sample_weight)
        first = count(_rows_to(rows, micro)) if logical_batch_loss.may_mask(self) else None
        if first is None:
            return logical_batch_loss.LogicalTotals(sample_weight)
        # `first` only showed which outputs have masks; XLA drops its unused pass.
        zeros = [ops.zeros((), "float32") for _ in first]
        totals, _ = jax.lax.scan(lambda total, part: (_plus(total, count(part)), None),
                                 zeros, _stack(rows, micro, num_full))
        if tail:
            totals = _plus(totals, count(_rows_from(rows, num_full * micro)))
        return logical_batch_loss.LogicalTotals(sample_weight, totals[0::2], totals[1::2])

    def _counts(self, trainable, non_trainable, rows):
        """[mask count, weight sum] per output of one micro-batch, or `None`
        where no output has a mask."""
        x, sample_weight = rows
        with _scope([*self.trainable_variables, *self.non_trainable_variables], [*trainable, *non_trainable]):
            outputs = keras.tree.flatten(self(x, training=False))
        masks = [logical_batch_loss.mask_of(output) for output in outputs]
        if all(mask is None for mask in masks):
            return None
        counts = []
        for mask, weight in zip(masks, logical_batch_loss.output_weights(sample_weight, len(outputs))):
            counts.append(_ZERO if mask is None else logical_batch_loss.mask_count(mask))
            counts.append(logical_batch_loss.weight_sum(weight, mask)
                          if mask is not None or weight is not None else _ZERO)
        return counts


def _rows(x):
    return next(t for t in keras.tree.flatten(x) if t is not None).shape[0]


def _stack(batch, micro, num_full):
    """The full micro-batches of `batch`, stacked on a new leading axis (for `lax.scan`)."""
    return keras.tree.map_structure(
        lambda t: None if t is None else ops.reshape(t[: num_full * micro], (num_full, micro, *t.shape[1:])),
        batch)


def _local_rows(batch, start, size, micro):
    """Rows `start:start + size` of the micro-batch layout (`data_parallel.device_local`)."""
    shards = data_parallel.device_local(_rows(batch[0]), micro)
    return keras.tree.map_structure(
        lambda t: None if t is None else data_parallel.local_slice(t, start, size, shards), batch)


def _rows_to(batch, end):
    return keras.tree.map_structure(lambda t: None if t is None else t[:end], batch)


def _plus(total, counts):
    return [a + ops.cast(b, "float32") for a, b in zip(total, counts)]


def _rows_from(batch, start):
    return keras.tree.map_structure(lambda t: None if t is None else t[start:], batch)


def _zeros_like(variables):
    return [ops.zeros(v.shape, "float32") for v in variables]


def _scope(references, values):
    return keras.StatelessScope(state_mapping=list(zip(references, values)))


def _current(scope, references, values):
    """The scope's value of each variable, or its value before where unchanged."""
    updated = [scope.get_current_value(v) for v in references]
    return [value if new is None else new for new, value in zip(updated, values)]
