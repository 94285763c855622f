"""`step_plan`: the memory XLA plans for one train step, read without running it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import keras
import numpy as np

from kadapt._compat import build_training_state
from kadapt.batching.jax.data_parallel import sharded_batch
from kadapt.batching.jax.data_parallel import sharded_state
from kadapt.batching.jax.train_function import donated_arguments
from kadapt.validation import check_micro_batch_size


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The buffers XLA assigned to one compiled train step, in bytes.

    peak_bytes = argument_bytes + output_bytes - alias_bytes + temporary_bytes

    The arguments (the state and the batch) are live when the step starts,
    and the outputs (the new state and the logs) when it ends; XLA's
    temporaries are one buffer assignment, so `temporary_bytes` is already
    the most the step's intermediates hold at once. Keras donates the state
    (`donate_argnums=0`), so an output that reuses a donated argument's
    buffer (`alias_bytes`) is counted once, not twice; an accumulating
    model with recovery on does not (`train_function.donated_arguments`), and
    its plan holds the old state and the new one. The sum bounds what
    the step holds at once from above: an argument freed early or a
    temporary reused across phases only lowers the true figure. Compiled
    code (`code_bytes`, 0 on the CPU) is not in it: it is loaded once per
    compile, not per step.

    `rows` is the batch the step was planned on, `micro_batch_size` the
    micro-batch an accumulating model splits it into (`None` for a plain
    model).
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temporary_bytes: int
    code_bytes: int
    rows: int
    micro_batch_size: int | None = None

    @property
    def peak_bytes(self) -> int:
        """The bytes the step needs at once (see the class docstring)."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temporary_bytes


def step_plan(model: keras.Model, batch: Any, micro_batch_size: int | None = None) -> StepPlan:
    """Plans `model.train_step` on `batch` with XLA and returns its buffers.

    Lowers and compiles `jax.jit(model.train_step)` with the state donated as
    training donates it (`donated_arguments`: as in Keras, but not while an
    accumulating model's recovery is on) on abstract shapes (`jax.ShapeDtypeStruct`)
    of the model's state and of `batch`, sharded as under the current
    `keras.distribution` (the plan is then one device's): no step runs and no device memory
    is taken for the batch. It leaves no trace: the model's variables, its
    optimizer and `train_function` are untouched. A model or compiled
    loss/metrics not yet built are built from the batch's shapes as
    Keras' first step would build them (their `built` stays `True`, as after
    that step); an optimizer not yet built is not built: the plan uses a
    built copy of it (the same config, so the same slots), swapped in for
    the plan and swapped out after, so `model.optimizer.built` is as before.

    Args:
        model: Compiled `keras.Model` on the JAX backend, plain or
            accumulating (any model whose `train_step(state, data)` is
            Keras' JAX trainer's signature).
        batch: `(x, y)` or `(x, y, sample_weight)` of arrays or
            `jax.ShapeDtypeStruct`s (only shapes and dtypes are read).
        micro_batch_size: Positive int or `None`. For an accumulating model,
            the micro-batch its step splits `batch` into; `None` keeps the
            model's. Defaults to `None`.

    Returns:
        A `StepPlan`.

    Example:

    ```python
    x = jax.ShapeDtypeStruct((64, 28, 28, 1), "float32")
    y = jax.ShapeDtypeStruct((64,), "int32")
    print(kadapt.batching.jax.memory_plan.step_plan(model, (x, y)).peak_bytes)
    ```
    """
    check_jax_backend()
    check_compiled(model)
    specs = sharded_batch(abstract_batch(batch))  # under a mesh: one device's buffers
    with planned_micro_batch(model, micro_batch_size), built_for_plan(model, specs):
        state = sharded_state(state_variables(model), abstract_state(model))
        compiled = jax.jit(model.train_step, donate_argnums=donated_arguments(model)).lower(state, specs).compile()
    analysis = compiled.memory_analysis()
    return StepPlan(
        argument_bytes=int(analysis.argument_size_in_bytes),
        output_bytes=int(analysis.output_size_in_bytes),
        alias_bytes=int(analysis.alias_size_in_bytes),
        temporary_bytes=int(analysis.temp_size_in_bytes),
        code_bytes=int(analysis.generated_code_size_in_bytes),
        rows=batch_rows(specs),
        micro_batch_size=micro_batch_size,
    )


def check_jax_backend() -> None:
    backend = keras.backend.backend()
    if backend != "jax":
        raise ValueError(
            "A memory plan needs Keras' JAX backend: set `KERAS_BACKEND=jax` before "
            f"importing Keras. Received: keras.backend.backend()={backend!r}"
        )


def check_compiled(model: Any) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            "Argument `model` must be a compiled `keras.Model`. "
            f"Received: model={model!r} (of type {type(model).__name__})"
        )
    if not model.compiled:
        raise ValueError(
            "Argument `model` must be compiled before planning: call "
            f"`model.compile(optimizer=..., loss=...)`. Received: model={model.name!r}"
        )


def abstract_batch(batch: Any) -> tuple:
    """`(x, y, sample_weight)` as `jax.ShapeDtypeStruct`s (`None` kept)."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise TypeError(
            "Argument `batch` must be `(x, y)` or `(x, y, sample_weight)`. "
            f"Received: batch of type {type(batch).__name__}"
        )
    batch = tuple(batch) + (None,) * (3 - len(batch))
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), np.dtype(a.dtype)), batch)


def batch_rows(specs: tuple) -> int:
    return int(jax.tree_util.tree_leaves(specs[0])[0].shape[0])


def state_variables(model: keras.Model) -> tuple:
    """The variable groups of Keras' JAX train state, in its order."""
    return (model.trainable_variables, model.non_trainable_variables,
            model.optimizer.variables, model.metrics_variables)


def abstract_state(model: keras.Model) -> tuple:
    """The state Keras' JAX trainer passes to `train_step`, as shapes."""
    return tuple([jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in group]
                 for group in state_variables(model))


@contextlib.contextmanager
def planned_micro_batch(model: keras.Model, micro_batch_size: int | None) -> Iterator[None]:
    """The model's micro-batch set to `micro_batch_size` while planning."""
    if micro_batch_size is None:
        yield
        return
    check_micro_batch_size(micro_batch_size)
    if not hasattr(model, "micro_batch_size"):
        raise ValueError(
            "Argument `micro_batch_size` is for an accumulating model (`kadapt.accumulate`); "
            f"plan a plain model on a batch of that many rows. Received: "
            f"micro_batch_size={micro_batch_size} for model={model.name!r}"
        )
    # kadapt's own field, as `tensorflow.probe.leaves_no_trace` keeps it: the public
    # property reads "auto" before a probe, which its setter refuses.
    saved = model._micro_batch_size
    model.micro_batch_size = micro_batch_size
    try:
        yield
    finally:
        model._micro_batch_size = saved


@contextlib.contextmanager
def built_for_plan(model: keras.Model, specs: tuple) -> Iterator[None]:
    """The model built from `specs`, with a built copy of an unbuilt optimizer."""
    original = model.optimizer
    if not original.built:
        model.optimizer = keras.optimizers.deserialize(keras.optimizers.serialize(original))
    try:
        # No public call builds the compiled loss and metrics from shapes alone.
        build_training_state(model, specs)
        yield
    finally:
        model.optimizer = original
