"""`AccumulatingModel`: a `keras.Model` that trains batches as micro-batches."""

from __future__ import annotations

from typing import Any

import keras

from kadapt.batching.accumulating_train_step import AccumulatingTrainStep


@keras.saving.register_keras_serializable(package="kadapt")
class AccumulatingModel(AccumulatingTrainStep, keras.Model):
    """A model that trains each batch as micro-batches inside one step.

    `fit` hands `train_step` a logical batch of B rows. The step runs
    ceil(B / micro_batch_size) forward and backward passes in a `tf.while_loop`
    on TensorFlow, a `jax.lax.scan` on JAX (iterations not overlapped, so peak
    memory is that of one micro-batch),
    sums the gradients in float32 and calls `optimizer.apply` once. Each
    micro-batch's loss is divided by the logical batch's count (rows, the
    real tokens of a masked loss, or the sample weights' sum: see
    `kadapt.batching.logical_batch_loss`), so the step's loss and gradient are
    the full batch's, with sample weights, class weights, a ragged last
    micro-batch and regularization losses (counted once per step). Sparse
    gradients (`Embedding`) reach the optimizer as the full batch's slices
    (`kadapt.batching.tensorflow.gradient_sum`). One fit step is one
    logical batch, so `optimizer.iterations`, schedules, callbacks and History
    count logical steps; the loss and metrics reported equal the full-batch
    ones.

    BatchNormalization normalizes each micro-batch ("ghost batch norm"). Its
    moving statistics use momentum `momentum ** (1 / k)` per micro-batch, so
    they decay by `momentum` per logical step, as in full-batch training.

    With a `LossScaleOptimizer` each micro-batch loss is scaled, the scaled
    gradients are summed in float32 and the optimizer unscales once: a
    non-finite gradient in any micro-batch skips the whole logical step.

    It is built with the functional API. For a subclassed model use the
    `kadapt.AccumulatingTrainStep` mixin; to wrap a model that already exists
    use `kadapt.accumulate`.

    Args:
        inputs: As in `keras.Model`: the model's input tensor(s).
        outputs: As in `keras.Model`: the model's output tensor(s).
        name: String or `None`. The model's name. Defaults to `None`.
        micro_batch_size: Positive int or `"auto"`. Rows per forward/backward
            pass. A micro-batch larger than the logical batch means one
            micro-batch. Can be changed between steps through the
            `micro_batch_size` property; the change takes effect at the next
            step. `"auto"` probes device memory at the first `fit`.
        **kwargs: `memory_budget` and `max_oom_retries` (see
            `kadapt.AccumulatingTrainStep`), the rest passed to `keras.Model`.

    Example:

    ```python
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(1)(inputs)
    model = kadapt.AccumulatingModel(inputs, outputs, micro_batch_size=16)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=64)  # 4 micro-batches, one update per batch
    ```
    """

    def __init__(self, inputs: Any, outputs: Any, name: str | None = None, *, micro_batch_size: int | str,
                 **kwargs: Any) -> None:
        super().__init__(
            inputs, outputs, name=name, micro_batch_size=micro_batch_size, **kwargs
        )

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(self.accumulation_config())
        return config
