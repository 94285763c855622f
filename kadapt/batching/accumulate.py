"""`accumulate(model, micro_batch_size)`: gradient accumulation for any model."""

from __future__ import annotations

from typing import Any

import keras

from kadapt.batching.accumulating_train_step import AccumulatingTrainStep


@keras.saving.register_keras_serializable(package="kadapt")
class AccumulatingWrapper(AccumulatingTrainStep, keras.Model):
    """Wraps a model so that `fit` trains its batches as micro-batches.

    The wrapper shares the wrapped model's layers and weights; training the
    wrapper trains the wrapped model. See `kadapt.AccumulatingModel` for the
    training semantics. Build it with `kadapt.accumulate`.

    Args:
        model: `keras.Model`. The model to train (Sequential, functional or
            subclassed).
        micro_batch_size: Positive int or `"auto"`. Rows per forward/backward
            pass.
        **kwargs: `memory_budget` and `max_oom_retries` (see
            `kadapt.AccumulatingTrainStep`), the rest passed to `keras.Model`.
    """

    def __init__(self, model: keras.Model, micro_batch_size: int | str, **kwargs: Any) -> None:
        if not isinstance(model, keras.Model):
            raise TypeError(
                "Argument `model` must be a `keras.Model` (Sequential, "
                "functional or subclassed). "
                f"Received: model={model!r} (of type {type(model).__name__})"
            )
        kwargs.setdefault("name", f"accumulating_{model.name}")
        super().__init__(micro_batch_size=micro_batch_size, **kwargs)
        self.model = model

    @property
    def output_names(self) -> list[str] | None:
        # Keras' `compile` maps dict losses, metrics and targets to outputs by
        # these names; a subclassed wrapper has none of its own.
        return getattr(self.model, "output_names", None)

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        return self.model(inputs, training=training)

    def get_config(self) -> dict[str, Any]:
        return {
            "model": keras.saving.serialize_keras_object(self.model),
            "name": self.name,
            **self.accumulation_config(),
        }

    def build_from_config(self, config: dict[str, Any]) -> None:
        # Keras builds a subclassed model here by tracing `call`, which builds
        # the wrapped model (every weight is its) but leaves the wrapper
        # unbuilt, and `load_weights` (KerasTuner's `get_best_models`) refuses
        # an unbuilt model.
        super().build_from_config(config)
        self.built = self.model.built

    def compile_from_config(self, config: dict[str, Any]) -> None:
        config = keras.saving.deserialize_keras_object(config)
        if self.model.compiled:
            # One optimizer, as before saving: its state is stored once,
            # under the wrapped model.
            config["optimizer"] = self.model.optimizer
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None) -> AccumulatingWrapper:
        config = dict(config)
        model = keras.saving.deserialize_keras_object(
            config.pop("model"), custom_objects=custom_objects
        )
        return cls(model, **config)


def accumulate(model: keras.Model, micro_batch_size: int | str, memory_budget: int | str | None = None,
               max_oom_retries: int = 8, measure_noise: bool = False) -> AccumulatingWrapper:
    """Returns a model that trains `model` with gradient accumulation.

    Inside `fit`, every batch (the logical batch, B rows) is trained as
    ceil(B / micro_batch_size) micro-batches in ONE optimizer step, exactly
    equal to a full-batch step for models without BatchNorm or dropout. See
    `kadapt.AccumulatingModel` for the semantics.

    If `model` is compiled, the returned model is compiled with the same
    optimizer object, loss and metrics; otherwise compile the returned model.

    With `micro_batch_size="auto"` the first `fit` probes device memory with
    real trial steps and takes the largest micro-batch that fits. A step that
    runs out of memory mid-run is retried with a smaller micro-batch.

    Args:
        model: `keras.Model`. Sequential, functional or subclassed.
        micro_batch_size: Positive int, or `"auto"`. Rows per forward/backward
            pass.
        memory_budget: Bytes, a string like `"2GiB"`, or `None` (the
            device's). The memory a step may use. Defaults to `None`.
        max_oom_retries: Non-negative int. Retries of one logical batch with a
            smaller micro-batch after running out of memory; 0 turns recovery
            off. Defaults to `8`.
        measure_noise: Bool. Report the gradient noise scale as `noise_scale`
            (see `kadapt.AccumulatingTrainStep`). Defaults to `False`.

    Returns:
        A `kadapt.AccumulatingWrapper` sharing `model`'s weights.

    Example:

    ```python
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    trainer = kadapt.accumulate(model, micro_batch_size=16)
    trainer.fit(x, y, batch_size=256)  # 16 micro-batches per update
    ```
    """
    wrapper = AccumulatingWrapper(
        model,
        micro_batch_size,
        memory_budget=memory_budget,
        max_oom_retries=max_oom_retries,
        measure_noise=measure_noise,
    )
    if model.compiled:
        config = keras.saving.deserialize_keras_object(model.get_compile_config())
        config["optimizer"] = model.optimizer
        wrapper.compile(**config)
    return wrapper
