"""Compiled losses divided by the logical batch's count, not the micro-batch's.

Keras divides a loss's weighted sum S by a count D that can depend on the
data (`keras.losses.Loss`, `reduce_weighted_values`):

- `"sum_over_batch_size"` / `"mean"`: the loss's elements; with a mask on
  `y_pred` (padding tokens), its true entries;
- `"mean_with_sample_weight"`: the sum of the sample weights (the mask
  merged in), or the elements without either;
- `"sum"` and `None`: nothing (D = 1).

Over micro-batches i of n_i rows (N in the logical batch) Keras computes
S_i / D_i, the logical batch S / D with S = sum S_i and D = sum D_i (for
`"sum"`, D = 1). The accumulating step weighs each micro-batch's loss by
n_i / N, which is D_i / D only when D_i is proportional to the rows. So
`LogicalBatchLoss`, which the accumulating models compile every loss into,
multiplies its micro-batch loss by (D_i / D) / (n_i / N): any split of the
batch then gives the full batch's loss and gradient, as Hugging Face's
`num_items_in_batch` does for token losses. D is counted before the
micro-steps (`LogicalTotals`): from the sample weights, and where a layer
can make a mask (`may_mask`), from an inference pass over the micro-batches.
Outside an accumulating step the wrapper is the loss it wraps.
"""

from __future__ import annotations

import threading
from typing import Any

import keras
from keras import ops

from kadapt._compat import get_keras_mask
from kadapt._compat import resolve_loss
from kadapt.layer_walk import reachable_layers

_SUMS = ("sum", "none", None)
_MEANS = ("sum_over_batch_size", "mean")
_ACTIVE = threading.local()  # per thread: MirroredStrategy traces each replica in its own


@keras.saving.register_keras_serializable(package="kadapt")
class LogicalBatchLoss(keras.losses.Loss):
    """A compiled loss, divided by the logical batch's count in a micro-step.

    Args:
        loss: What `compile` accepts for one output: a loss name, function,
            `keras.losses.Loss` or its config. Resolved as Keras resolves it
            (`"crossentropy"` from the shapes) at the first call.
    """

    def __init__(self, loss: Any, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name=name or _name_of(loss), **kwargs)
        self.loss = loss
        self._resolved = loss if isinstance(loss, keras.losses.Loss) else None

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        if self._resolved is None:
            self._resolved = resolve_loss(self.loss, y_true, y_pred)  # Keras' own resolution
        value = self._resolved(y_true, y_pred, sample_weight)
        step = getattr(_ACTIVE, "step", None)
        if step is None:
            return value
        return value * ops.cast(step.correction(self._resolved.reduction, y_pred, sample_weight), value.dtype)

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return self._resolved.call(y_true, y_pred)

    def get_config(self) -> dict[str, Any]:
        return {"loss": keras.saving.serialize_keras_object(self.loss), "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LogicalBatchLoss:
        config = dict(config)
        loss = config.pop("loss")
        if isinstance(loss, dict):
            loss = keras.saving.deserialize_keras_object(loss)
        return cls(loss, **config)


def _name_of(loss):
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def wrap(loss: Any) -> Any:
    """`compile`'s `loss` argument with every loss a `LogicalBatchLoss`."""
    if loss is None or isinstance(loss, LogicalBatchLoss):
        return loss
    if isinstance(loss, dict) and "class_name" not in loss:
        return {key: wrap(value) for key, value in loss.items()}
    if isinstance(loss, (list, tuple)):
        return type(loss)(wrap(value) for value in loss)
    return LogicalBatchLoss(loss)


def may_mask(model: keras.Model) -> bool:
    """Whether a layer of `model` can start a Keras mask: an `Embedding` with
    `mask_zero`, `Masking`, a `Lambda` with a `mask`, or a layer from outside
    Keras with a `compute_mask` of its own. (Keras' other masking layers only
    pass masks on.)"""
    return any(_starts_masks(layer) for layer in reachable_layers(model))


def _starts_masks(layer):
    if getattr(layer, "mask_zero", False) or isinstance(layer, keras.layers.Masking):
        return True
    if isinstance(layer, keras.layers.Lambda):
        return layer.mask is not None
    own = type(layer).compute_mask is not keras.layers.Layer.compute_mask
    return own and not type(layer).__module__.startswith("keras.")


def mask_of(tensor):
    """The Keras mask a layer attached to `tensor`, or `None`."""
    return get_keras_mask(tensor)  # no public reader: kadapt._compat says why


def mask_count(mask):
    """Keras' masked-mean divisor: the mask's true entries."""
    return ops.sum(ops.cast(mask, "float32"))


def weight_sum(sample_weight, mask):
    """Keras' `"mean_with_sample_weight"` divisor: the sample weights with
    the mask merged in (weights broadcast over the mask's trailing axes)."""
    if mask is None:
        return ops.sum(ops.cast(sample_weight, "float32"))
    mask = ops.cast(mask, "float32")
    if sample_weight is None:
        return ops.sum(mask)
    weight = ops.cast(sample_weight, "float32")
    while len(weight.shape) > len(mask.shape) and weight.shape[-1] == 1:
        weight = ops.squeeze(weight, -1)
    while len(weight.shape) < len(mask.shape):
        weight = weight[..., None]
    return ops.sum(weight * mask)


def output_weights(sample_weight, outputs):
    """The sample weight Keras hands each of `outputs` (flat): one weight
    structure per output, or the same weights for all."""
    if sample_weight is not None and keras.tree.is_nested(sample_weight):
        flat = keras.tree.flatten(sample_weight)
        if len(flat) == outputs:
            return flat
    return [sample_weight] * outputs


class LogicalTotals:
    """The logical batch's divisors per flat output.

    Args:
        sample_weight: The logical batch's sample weights (Keras' structure)
            or `None`.
        masked: `None` (no output has a mask), or per output its mask count
            over the logical batch.
        weighted: `None` or, with `masked`, per output its masked weight sum.
    """

    def __init__(self, sample_weight, masked=None, weighted=None):
        self.sample_weight, self.masked, self.weighted = sample_weight, masked, weighted

    def mask_count(self, index):
        if self.masked is None:
            raise ValueError(
                "An output of the model has a Keras mask that kadapt did not expect: no layer "
                "it found starts masks (`Embedding(mask_zero=True)`, `Masking`, a `Lambda` with a "
                "`mask`, or a custom layer with its own `compute_mask`), so it did not count the "
                "masks of the logical batch. Make the mask with one of those layers. "
                f"Received: a mask on output {index}")
        return self.masked[index]

    def weight_sum(self, index, outputs):
        if self.masked is not None:
            return self.weighted[index]
        return weight_sum(output_weights(self.sample_weight, outputs)[index], None)


class MicroStep:
    """The loss correction of one micro-batch (`share` = n_i / N) against
    the logical batch's `totals`; `y_pred` maps each output to its totals."""

    def __init__(self, share, totals, y_pred=None):
        self.share, self.totals = share, totals
        self._index, self._outputs = {}, 0
        if y_pred is not None:
            self.outputs_are(y_pred)

    def outputs_are(self, y_pred):
        """Maps each of the model's outputs to its totals (where the step
        sees `y_pred` only inside `compute_loss`: JAX's)."""
        outputs = keras.tree.flatten(y_pred)
        self._index, self._outputs = {id(t): i for i, t in enumerate(outputs)}, len(outputs)

    def correction(self, reduction, y_pred, sample_weight):
        """(D_i / D) / (n_i / N) for one output's loss (module docstring)."""
        if reduction in _SUMS:
            return 1.0 / self.share
        mask = mask_of(y_pred)
        if mask is None and (reduction in _MEANS or sample_weight is None):
            return ops.convert_to_tensor(1.0)
        index = self._index.get(id(y_pred))
        if index is None:
            raise ValueError(
                f"A `{reduction}` loss divides by a count that depends on the data, and kadapt "
                "could not tell which of the model's outputs it was given (the tensor is not one of "
                "the outputs), so it cannot divide by the logical batch's count. Compute this loss "
                "on an output of the model as it is returned. "
                f"Received: y_pred={y_pred!r}")
        if reduction in _MEANS:
            total = self.totals.mask_count(index)
            return ops.divide_no_nan(mask_count(mask), total) / self.share
        if mask is not None:
            self.totals.mask_count(index)  # the masked weight sums were counted with the masks
        total = self.totals.weight_sum(index, self._outputs)
        return ops.divide_no_nan(weight_sum(sample_weight, mask), total) / self.share

    def __enter__(self):
        _ACTIVE.step = self
        return self

    def __exit__(self, *exc):
        _ACTIVE.step = None


def active_step() -> MicroStep | None:
    """The micro-step this thread is computing a loss in, or `None`."""
    return getattr(_ACTIVE, "step", None)
