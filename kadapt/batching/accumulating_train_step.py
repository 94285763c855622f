"""The accumulating model's backend-neutral front: arguments, `compile`, `fit`.

As Keras lays out its trainers, the step itself is the backend's:
`kadapt.batching.tensorflow.train_step.TensorFlowAccumulation` (micro-batches
in a `tf.while_loop`) or `kadapt.batching.jax.train_step.JaxAccumulation`
(micro-batches in a `jax.lax.scan`), chosen by `keras.backend.backend()` when
this module loads (Keras itself fixes its backend then). The step never calls
up into the probe: `micro_batch_size="auto"` is resolved here, by the resolver
`set_auto_resolver` registers (the probe's, loaded on first use, by default).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import keras

from kadapt.batching import logical_batch_loss
from kadapt.batching.memory_budget import parse_memory_size
from kadapt.callbacks.schedule_free_evaluation import with_schedule_free_evaluation
from kadapt.validation import check_micro_batch_size
from kadapt.validation import check_non_negative_int

AUTO = "auto"
SUPPORTED_BACKENDS = ("tensorflow", "jax")
_DEFAULT_AUTO_RESOLVER = ("kadapt.batching.auto_micro_batch", "resolve_auto_micro_batch")
_auto_resolver = None


def set_auto_resolver(resolver: Callable | None) -> None:
    """Registers what resolves `micro_batch_size="auto"` at the first `fit`.

    Args:
        resolver: Callable `(model, x, y, batch_size, sample_weight) -> None`
            that sets `model.micro_batch_size`, or `None` for the default
            (`kadapt.batching.auto_micro_batch.resolve_auto_micro_batch`).

    Example:

    ```python
    set_auto_resolver(lambda model, x, y, batch_size, sample_weight: setattr(model, "micro_batch_size", 16))
    ```
    """
    global _auto_resolver
    if resolver is not None and not callable(resolver):
        raise TypeError(f"Argument `resolver` must be callable or None. Received: resolver={resolver!r}")
    _auto_resolver = resolver


def _resolve_auto(model, x, y, batch_size, sample_weight):
    resolver = _auto_resolver
    if resolver is None:
        module, name = _DEFAULT_AUTO_RESOLVER
        resolver = getattr(importlib.import_module(module), name)
    resolver(model, x, y, batch_size, sample_weight)


class UnsupportedBackend:
    """The step of a backend kadapt has none for: construction raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(
            "kadapt's accumulating models run on the TensorFlow and JAX backends of Keras. "
            f"Set `KERAS_BACKEND` to one of {SUPPORTED_BACKENDS} before Keras is imported. "
            f"Received: backend={keras.backend.backend()!r}"
        )


def backend_step_class(backend: str | None = None) -> type:
    """The class that holds the accumulating step on `backend` (Keras' own by
    default): `TensorFlowAccumulation`, `JaxAccumulation`, or for any other
    backend `UnsupportedBackend`, which raises at construction."""
    backend = backend or keras.backend.backend()
    if backend == "tensorflow":
        from kadapt.batching.tensorflow.train_step import TensorFlowAccumulation

        return TensorFlowAccumulation
    if backend == "jax":
        from kadapt.batching.jax.train_step import JaxAccumulation

        return JaxAccumulation
    return UnsupportedBackend


class AccumulatingTrainStep(backend_step_class()):
    """Mixin for subclassed models: one logical batch, k micro-batches.

    List it before `keras.Model` in the bases of a subclassed model and pass
    `micro_batch_size` to `super().__init__`. See `kadapt.AccumulatingModel`
    for the training semantics.

    Args:
        micro_batch_size: Positive int, or `"auto"`: probe device memory at
            the first `fit` and take the largest micro-batch that fits (see
            `kadapt.probe_micro_batch`; results are cached on disk).
        memory_budget: Bytes or a string like `"2GiB"`, or `None`. The memory
            a step may use, for `"auto"` and for re-solving the micro-batch
            after running out of memory. Defaults to `None` (the device's,
            see `kadapt.batching.memory_budget`).
        max_oom_retries: Non-negative int. How many times one logical batch is
            retried with a smaller micro-batch after running out of memory (any
            form of `kadapt.batching.out_of_memory`) before it raises; 0
            turns recovery off. Defaults to `8`.
        measure_noise: Bool. Estimate the gradient noise scale B_simple from
            the micro-batch gradients of every step (one squared norm per
            micro-batch) and report it as `noise_scale` in the logs and History
            (see `kadapt.batching.noise_scale`). With an Adam-family
            optimizer it is the preconditioned noise scale, of the steps Adam
            takes. Needs >= 2 micro-batches per step; steps with one leave the
            estimate unchanged. Defaults to `False`.
        *args, **kwargs: Passed on to `keras.Model`.

    Example:

    ```python
    class Regressor(kadapt.AccumulatingTrainStep, keras.Model):
        def __init__(self, micro_batch_size=32, **kwargs):
            super().__init__(micro_batch_size=micro_batch_size, **kwargs)
            self.dense = keras.layers.Dense(1)

        def call(self, inputs):
            return self.dense(inputs)
    ```
    """

    def __init__(self, *args: Any, micro_batch_size: int | str, memory_budget: int | str | None = None,
                 max_oom_retries: int = 8, measure_noise: bool = False, **kwargs: Any) -> None:
        micro = None if micro_batch_size == AUTO else check_micro_batch_size(micro_batch_size)
        if memory_budget is not None:
            parse_memory_size(memory_budget)
        retries = check_non_negative_int(max_oom_retries, "max_oom_retries")
        if not isinstance(measure_noise, bool):
            raise TypeError(f"Argument `measure_noise` must be a bool. Received: measure_noise={measure_noise!r}")
        if measure_noise and not getattr(self, "MEASURES_NOISE", False):
            raise ValueError(
                "`measure_noise=True` is implemented on the TensorFlow backend only for now. "
                f"Use `KERAS_BACKEND=tensorflow`, or leave it False. Received: measure_noise=True on "
                f"backend={keras.backend.backend()!r}"
            )
        super().__init__(*args, **kwargs)
        self._micro_batch_size = micro
        self.memory_budget = memory_budget
        self.max_oom_retries = retries
        self.measure_noise = measure_noise
        self.noise_scale = self._new_noise_scale() if measure_noise else None
        self.probe_result = None
        self._oom_events = []

    @property
    def micro_batch_size(self) -> int | str:
        """Rows per forward/backward pass; `"auto"` until the first `fit` probes."""
        return AUTO if self._micro_batch_size is None else self._micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, value: int) -> None:
        # The size is a trace-time constant (static shapes, XLA-friendly); the
        # train function retraces at the next step, even inside `fit`.
        self._micro_batch_size = check_micro_batch_size(value)

    @property
    def oom_events(self) -> tuple[tuple[int, int, int], ...]:
        """`(logical step, micro-batch before, micro-batch after)` per recovery."""
        return tuple(self._oom_events)

    def accumulation_config(self) -> dict[str, Any]:
        """The constructor arguments this mixin adds, for `get_config`."""
        return {
            "micro_batch_size": self.micro_batch_size,
            "memory_budget": self.memory_budget,
            "max_oom_retries": self.max_oom_retries,
            "measure_noise": self.measure_noise,
        }

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, **kwargs: Any) -> None:
        """As `keras.Model.compile`; each loss is divided by the logical
        batch's count (`kadapt.batching.logical_batch_loss`)."""
        super().compile(optimizer=optimizer, loss=logical_batch_loss.wrap(loss), **kwargs)

    # Keras compiles a loaded model whose `compile` is its own only through its own
    # `compile_from_config` (as Keras' own does it).
    def get_compile_config(self) -> dict[str, Any] | None:
        return super().get_compile_config()

    def compile_from_config(self, config: dict[str, Any]) -> None:
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None,
            **kwargs: Any) -> keras.callbacks.History:
        """As `keras.Model.fit`. With a Schedule-Free optimizer it adds
        `kadapt.callbacks.ScheduleFreeEvaluation`: validation at x, training at y."""
        if not self.compiled:
            raise ValueError(
                "The model must be compiled before `fit`: call "
                "`model.compile(optimizer=..., loss=...)` first. "
                f"Received: model={self.name!r}, which is not compiled."
            )
        self._check_noise_batch(batch_size)
        if self._micro_batch_size is None:
            _resolve_auto(self, x, y, batch_size, kwargs.get("sample_weight"))
        kwargs["callbacks"] = with_schedule_free_evaluation(self, kwargs.get("callbacks"))
        return super().fit(x, y, batch_size=batch_size, **kwargs)

    def _check_noise_batch(self, batch_size):
        micro = self._micro_batch_size
        if self.measure_noise and batch_size is not None and micro is not None and batch_size <= micro:
            raise ValueError(
                "`measure_noise=True` compares micro-batch gradients, so it needs at "
                f"least 2 micro-batches per step: use a `batch_size` above "
                f"micro_batch_size={micro}, or a smaller micro-batch. "
                f"Received: batch_size={batch_size}"
            )

    def _traced_micro_batch_size(self):
        if self._micro_batch_size is None:
            raise ValueError(
                "`micro_batch_size='auto'` is resolved by the first `fit`; call "
                "`fit`, or set `model.micro_batch_size` to an int first. "
                "Received: micro_batch_size='auto'"
            )
        return self._micro_batch_size
