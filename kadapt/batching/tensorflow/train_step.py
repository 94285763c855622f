"""The accumulating step on TensorFlow: micro-batches in a `tf.while_loop`, one `optimizer.apply`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from kadapt._compat import creation_strategy
from kadapt._compat import epoch_iterator_spec
from kadapt._compat import per_replica_specs
from kadapt.batching import ghost_batch_norm
from kadapt.batching import logical_batch_loss
from kadapt.batching.noise_scale import NoiseScale
from kadapt.batching.noise_scale import squared_preconditioner
from kadapt.batching.tensorflow import gradient_sum
from kadapt.batching.tensorflow import micro_batches
from kadapt.batching.tensorflow import multi_worker
from kadapt.batching.tensorflow.micro_batches import batch_size_of as rows_of
from kadapt.batching.tensorflow.recovery import RecoveringTrainFunction


class TensorFlowAccumulation:
    """The TensorFlow half of `kadapt.AccumulatingTrainStep`: its train
    function, `train_step` and the tf.distribute hooks (Keras' TensorFlow
    trainer's methods, overridden)."""

    MEASURES_NOISE = True

    def _new_noise_scale(self):
        return NoiseScale()

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None,
            **kwargs: Any) -> keras.callbacks.History:
        if isinstance(x, tf.data.Dataset):
            # Keras ignores `shuffle` for a dataset (it shuffles itself) and
            # warns when the default True is left in: say what it does.
            kwargs.setdefault("shuffle", False)
        try:
            return super().fit(x, y, batch_size=batch_size, **kwargs)
        except multi_worker.PEER_ERRORS as error:
            if not multi_worker.in_multi_worker_mode(self.distribute_strategy):
                raise
            raise multi_worker.worker_lost(error) from None

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras (3.15) builds from the first batch by `strategy.reduce("MEAN", batch)`,
        # which MultiWorkerMirroredStrategy cannot do with a structure of per-replica
        # values (keras-team/keras#20585). The build needs only shapes and dtypes:
        # this replica's own part of the batch has them. The dataset's element spec has
        # them too, and reading it draws no batch: a batch drawn here would advance a
        # reshuffling dataset, so that the first epoch saw the second epoch's order.
        strategy = creation_strategy(self)
        if iterator is not None and strategy is not None:
            data_batch = _batch_spec(iterator)
            if data_batch is None:
                for _, _, batches in iterator:
                    data_batch = tf.nest.map_structure(
                        lambda value: strategy.experimental_local_results(value)[0], next(batches))
                    break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def make_test_function(self, force: bool = False) -> Callable:
        if not multi_worker.in_multi_worker_mode(self.distribute_strategy):
            return super().make_test_function(force)
        if self.test_function is None or force:
            self.test_function = multi_worker.StepsFunction(self, self.test_step)
        return self.test_function

    def make_train_function(self, force: bool = False) -> Callable:
        if self.train_function is None or force:
            self.train_function = RecoveringTrainFunction(self)
        return self.train_function

    def train_step(self, data: Any) -> dict[str, Any]:
        return self.finish_step(*self.compute_step(data))

    def one_micro_batch_step(self, data: Any) -> dict[str, Any]:
        """`train_step` for a batch of at most `micro_batch_size` rows: the same
        first micro-batch and update, traced without the loop over further
        micro-batches and the short last one, which never run on such a batch
        (each is one more build of the network's forward and backward pass in
        the trace). A subclass's own `train_step` runs as it is."""
        if type(self).train_step is not TensorFlowAccumulation.train_step:
            return self.train_step(data)
        return self.finish_step(*self.compute_step(data, one_micro_batch=True))

    def compute_step(self, data: Any, one_micro_batch: bool = False) -> tuple:
        """The first half of `train_step`: every micro-batch's forward and
        backward pass, with no collective after them. Returns `(gradients,
        loss, noise statistics, batch size, loss denominator)` for
        `finish_step`. A multi-worker step that runs out of memory here on one
        worker is retried by all (`kadapt.batching.oom_recovery`).
        `one_micro_batch`: the batch has at most `micro_batch_size` rows."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        batch = (x, y, sample_weight)
        batch_size = micro_batches.batch_size_of(x)
        micro = self._traced_micro_batch_size()
        num_full = batch_size // micro
        tail = batch_size - num_full * micro
        num_micro = num_full + tf.cast(tail > 0, tf.int32)
        layers = ghost_batch_norm.batch_norm_layers(self)
        context = (self._noise_weights(), None)
        # This replica's rows: no collective here (one in a function that runs out of memory on
        # one worker may never send its part, and the others would wait in it); `finish_step`
        # rescales to the global denominator.
        denominator = tf.cast(batch_size, tf.float32)
        context = (context[0], self._logical_totals(batch, micro, num_full, tail))
        with ghost_batch_norm.per_logical_step_momentum(layers, num_micro):
            # The first micro-batch runs outside the loop: it builds the model,
            # metrics and loss on the first trace (variables cannot be created
            # inside the loop) and its gradients seed the float32 sum.
            total = self._micro_step(micro_batches.first_rows(batch, micro), denominator, context)
            if self.jit_compile:
                total = (gradient_sum.reserve(total[0], num_micro), *total[1:])
            if not one_micro_batch:
                total = self._accumulate_full(batch, denominator, num_full, num_micro, total, context)
                total = tf.cond(
                    tf.logical_and(tail > 0, num_full > 0),
                    lambda: self._accumulate_tail(batch, denominator, num_full, num_micro, total, context),
                    lambda: total,
                )
        parts, loss, noise = total
        return gradient_sum.as_gradients(parts, self.trainable_variables), loss, noise, batch_size, denominator

    def finish_step(self, gradients: list, loss: tf.Tensor, noise: Any, batch_size: tf.Tensor,
                    denominator: tf.Tensor) -> dict[str, Any]:
        """The second half of `train_step`: the noise statistics, the one
        optimizer update (its all-reduce) and the loss; returns the metrics.

        `compute_step` averaged over this replica's rows (`denominator`);
        under tf.distribute the gradients and loss are rescaled here to the
        global rows over the replica count (`_global_denominator`)."""
        global_denominator = _global_denominator(batch_size)
        if global_denominator is not None:
            factor = denominator / global_denominator
            gradients = [gradient_sum.scale(g, factor) for g in gradients]
            loss, denominator = loss * factor, global_denominator
        if self.measure_noise:
            self._track_noise(*_across_replicas(gradients, noise, batch_size), self._noise_weights())
        self._apply_once(gradients)
        self._track_loss(loss, batch_size, denominator)
        return self.get_metrics_result()

    def _logical_totals(self, batch, micro, num_full, tail):
        """The logical batch's loss divisors per output, counted before the
        micro-steps (`kadapt.batching.logical_batch_loss`): an inference pass
        over the micro-batches counts the outputs' masks, where a layer can
        make one."""
        x, _, sample_weight = batch
        if not logical_batch_loss.may_mask(self):
            return logical_batch_loss.LogicalTotals(sample_weight)
        outputs = tf.nest.flatten(self(micro_batches.first_rows(x, micro), training=False))
        if all(logical_batch_loss.mask_of(output) is None for output in outputs):
            return logical_batch_loss.LogicalTotals(sample_weight)
        first = self._counts(outputs, micro_batches.first_rows(sample_weight, micro))
        counts = micro_batches.fold((x, sample_weight), micro, num_full, tail, self._counts_of, first)
        return logical_batch_loss.LogicalTotals(sample_weight, counts[0::2], counts[1::2])

    def _counts_of(self, rows):
        x, sample_weight = rows
        return self._counts(tf.nest.flatten(self(x, training=False)), sample_weight)

    @staticmethod
    def _counts(outputs, sample_weight):
        """[mask count, weight sum] per output of one micro-batch."""
        counts = []
        weights = logical_batch_loss.output_weights(sample_weight, len(outputs))
        for output, weight in zip(outputs, weights):
            mask = logical_batch_loss.mask_of(output)
            counts.append(tf.constant(0.0) if mask is None else logical_batch_loss.mask_count(mask))
            counts.append(logical_batch_loss.weight_sum(weight, mask)
                          if mask is not None or weight is not None else tf.constant(0.0))
        return counts

    def _noise_weights(self):
        """P^2 per variable when the optimizer preconditions (Adam family; see
        `kadapt.batching.noise_scale`), else `None`: plain squared norms."""
        variables = self.trainable_variables
        if not self.measure_noise or not variables:
            return None
        if not self.optimizer.built:
            self.optimizer.build(variables)
        return squared_preconditioner(self.optimizer, variables)

    def _track_noise(self, gradients, noise, batch_size, weights):
        """Feeds a = mean |g_i|^2, b = |g_B|^2, u = mean 1/n_i, v = 1/N."""
        squared_norms, inverse_sizes, count = tf.unstack(noise)
        scale = tf.cast(self.optimizer.scale_loss(tf.constant(1.0)), tf.float32)
        full = _squared_norm(gradients, weights) / scale**2
        # Adam's preconditioner is undefined before its first update (v = 0).
        measured = True if weights is None else self.optimizer.iterations > 0
        self.noise_scale.update_state(
            squared_norms / count, full, inverse_sizes / count, 1.0 / tf.cast(batch_size, tf.float32),
            measured=measured,
        )

    def _apply_once(self, gradients):
        variables = self.trainable_variables
        if not variables:
            return
        if not self.optimizer.built:
            self.optimizer.build(variables)  # outside the dependencies below
        # Nothing of the update (not even `iterations += 1`) may run before
        # every micro-batch succeeded: a step that fails part-way (out of
        # memory) must leave the weights and the optimizer untouched.
        with tf.control_dependencies(tf.nest.flatten(gradients, expand_composites=True)):
            self.optimizer.apply(
                [gradient_sum.cast(g, v.dtype) for g, v in zip(gradients, variables)], variables
            )

    def _accumulate_full(self, batch, denominator, num_full, num_micro, total, context):
        """Adds the full micro-batches 1 .. num_full - 1, one at a time."""
        micro = self._traced_micro_batch_size()

        def body(index, total):
            # Start a micro-batch only once the previous one's gradients
            # exist, so at most one micro-batch's activations are alive.
            with tf.control_dependencies(tf.nest.flatten(total)):
                rows = micro_batches.slice_rows(batch, index * micro, micro)
            return index + 1, self._add(total, self._micro_step(rows, denominator, context), index, num_micro)

        parts, loss, noise = total
        _, total = tf.while_loop(
            lambda index, _: index < num_full,
            body,
            (tf.constant(1, tf.int32), total),
            shape_invariants=(tf.TensorShape([]), (gradient_sum.shape_invariants(parts), loss.shape, noise.shape)),
            parallel_iterations=1,
        )
        return total

    def _accumulate_tail(self, batch, denominator, num_full, num_micro, total, context):
        with tf.control_dependencies(tf.nest.flatten(total)):
            rows = micro_batches.rows_from(batch, num_full * self._traced_micro_batch_size())
        return self._add(total, self._micro_step(rows, denominator, context), num_full, num_micro)

    def _micro_step(self, rows, denominator, context):
        """Returns the float32 gradients, loss share and noise statistics of
        one micro-batch (its share: its rows over this replica's). `context`:
        the noise statistics' preconditioner and the logical batch's loss
        divisors (`_logical_totals`)."""
        x, y, sample_weight = rows
        noise_weights, totals = context
        share = tf.cast(rows_of(x), tf.float32) / denominator
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            variables = self.trainable_variables
            with logical_batch_loss.MicroStep(share, totals, y_pred):
                loss = self.compute_loss(
                    x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
                )
            loss = tf.cast(loss, tf.float32) * share
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, variables) if variables else []
        self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        parts = [gradient_sum.as_parts(g, v, rows) for g, v in zip(gradients, variables)]
        gradients = gradient_sum.as_gradients(parts, variables)
        return parts, loss, self._noise_statistics(gradients, share, rows_of(x), noise_weights)

    def _noise_statistics(self, gradients, share, rows, weights):
        """[|g_i|^2, 1/n_i, 1] for this micro-batch's mean gradient g_i (zeros
        when not measuring). The summed gradients are of loss * share, scaled."""
        if not self.measure_noise or not gradients:
            return tf.zeros([3], tf.float32)
        scale = tf.cast(self.optimizer.scale_loss(tf.constant(1.0)), tf.float32) * share
        squared_norm = _squared_norm(gradients, weights) / scale**2
        return tf.stack([squared_norm, 1.0 / tf.cast(rows, tf.float32), 1.0])

    def _add(self, total, step, slot, slots):
        """`total` plus micro-batch number `slot` (of `slots`)."""
        parts, loss, noise = total
        step_parts, step_loss, step_noise = step
        if self.jit_compile:
            parts = gradient_sum.put(parts, step_parts, slot, slots)
        else:
            parts = gradient_sum.add(parts, step_parts)
        return parts, loss + step_loss, noise + step_noise

    def _track_loss(self, loss, batch_size, denominator):
        # `compute_loss` divides by the replica count under tf.distribute; the
        # reported loss is the mean over all replicas' rows (each replica adds
        # its own batch's mean, weighted by its rows), as in Keras.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        own_mean = loss * replicas * denominator / tf.cast(batch_size, tf.float32)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(own_mean, sample_weight=batch_size)


def _batch_spec(iterator):
    """The `tf.TensorSpec` structure of one replica's batch from a Keras epoch
    iterator's distributed dataset (each `PerReplicaSpec` leaf gives its first
    replica's spec), or `None` where it has no such structure."""
    spec = epoch_iterator_spec(iterator)
    if spec is None:
        return None
    spec = tf.nest.map_structure(
        lambda leaf: (per_replica_specs(leaf) or (leaf,))[0], spec)
    if all(isinstance(leaf, tf.TensorSpec) for leaf in tf.nest.flatten(spec)):
        return spec
    return None


def _across_replicas(gradients, noise, batch_size):
    """The noise statistics' inputs over all replicas' micro-batches (one
    replica: as they are): the global batch's mean gradient (an all-reduce of
    the gradients, made only when measuring), the micro-batches' summed
    statistics and the global row count.

    `compute_loss` divides each replica's loss by the replica count R, so a
    micro-batch's squared gradient norm measured in the step is 1/R^2 of its
    mean gradient's; the replicas' gradient sums add up to the global mean."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return gradients, noise, batch_size
    replicas = float(context.num_replicas_in_sync)
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, [gradient_sum.dense(g) for g in gradients])
    squared_norms, inverse_sizes, count = tf.unstack(context.all_reduce(tf.distribute.ReduceOp.SUM, noise))
    rows = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(batch_size, tf.float32))
    return total, tf.stack([squared_norms * replicas**2, inverse_sizes, count]), rows


def _global_denominator(batch_size):
    """Under tf.distribute, the rows one replica's loss is averaged over: the
    global batch over the replica count (one all-reduce), so that every row
    of the global batch weighs the same even when the replicas' shares differ
    (a ragged last batch split unevenly). `None` on one replica."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    rows = tf.cast(batch_size, tf.float32)
    return context.all_reduce(tf.distribute.ReduceOp.SUM, rows) / context.num_replicas_in_sync


def _squared_norm(gradients, weights=None):
    """sum |g|^2 over the variables, or sum P^2 |g|^2 with `weights` = P^2."""
    gradients = [gradient_sum.dense(g) for g in gradients]
    if weights is None:
        return tf.add_n([tf.reduce_sum(tf.square(g)) for g in gradients])
    return tf.add_n([tf.reduce_sum(w * tf.square(g)) for g, w in zip(gradients, weights)])
