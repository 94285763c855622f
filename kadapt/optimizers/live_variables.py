"""What kadapt's optimizers share: hyperparameters kept in variables."""

from __future__ import annotations

from typing import Any

import keras

from kadapt._compat import distributed_container
from kadapt.validation import check_range


def slot_key(variable: Any) -> Any:
    """The same key for a Keras variable and what `update_step` receives for it.

    On JAX that is the Keras variable itself (keyed as Keras' own `_var_key`
    does). On TensorFlow it is the backend variable it holds, and under
    tf.distribute the replica's component of a mirrored variable.
    """
    if keras.backend.backend() != "tensorflow":
        return id(variable)
    return _tensorflow_slot_key(variable)


def _tensorflow_slot_key(variable: Any) -> Any:
    # Imported here: only the TensorFlow backend has tf.distribute values, and
    # kadapt's optimizers must import without TensorFlow on JAX.
    import tensorflow as tf

    if isinstance(variable, keras.Variable):
        variable = variable.value
    container = distributed_container(variable)
    if container is None and not isinstance(variable, tf.distribute.DistributedValues):
        container = distributed_container(getattr(variable, "handle", None))
    return (variable if container is None else container).ref()


def scalar_variable(optimizer: keras.optimizers.Optimizer, name: str, value: float) -> keras.Variable:
    """A float32 optimizer variable holding `value`, read by the compiled step."""
    return optimizer.add_variable(
        shape=(), initializer=keras.initializers.Constant(value), name=name
    )


class LearningRateMultiplier:
    """Mixin: `learning_rate_multiplier`, a variable the update multiplies the
    rate (or the schedule's value) by. Call `_init_multiplier` in `__init__`."""

    def _init_multiplier(self, value):
        check_range("learning_rate_multiplier", value, low=0.0, low_open=True)
        self._multiplier = scalar_variable(self, "learning_rate_multiplier", value)

    @property
    def learning_rate_multiplier(self) -> keras.Variable:
        """Multiplies the learning rate (or the schedule's value) at every step."""
        return self._multiplier

    @learning_rate_multiplier.setter
    def learning_rate_multiplier(self, value: float) -> None:
        check_range("learning_rate_multiplier", float(value), low=0.0, low_open=True)
        self._multiplier.assign(value)

    def _multiplied(self, learning_rate, dtype):
        return keras.ops.cast(learning_rate, dtype) * keras.ops.cast(self._multiplier, dtype)


class RestartableMoments:
    """Mixin: a bias correction counted from the step the moments last started from zero.

    A rollback that restarts the optimizer's slots (`kadapt.meta.observe.rollback.restore`
    with `restart_momentum`: the `MetaAdjuster`'s restart from the initial state or
    after a repeated divergence, `DeadRunRescue`) zeroes the moments while
    `iterations` counts on, since a schedule reads it. Counted from `iterations`,
    the correction would be ~1 at once: for a steady gradient the first Adam step
    after a restart would be 3.2x a corrected one, the 12th 6.6x. The optimizer
    counts from `moments_from` instead, which `slots_restarted()` sets: the steps
    after a restart are a fresh optimizer's. Call `_init_moments_from()` last in
    `build`: the variable is the optimizer's last, so a file saved before it
    existed (one variable fewer) still loads, counting from 0.
    """

    def _init_moments_from(self):
        self._moments_from = self.add_variable(shape=(), dtype=self.iterations.dtype, name="moments_from")

    def moments_step(self, dtype: Any) -> Any:
        """t of the bias correction at the step being applied: 1 at the moments' first step."""
        return keras.ops.cast(self.iterations - self._moments_from + 1, dtype)

    def slots_restarted(self) -> None:
        """Marks the next step as the first of zeroed moments (the rollback calls it)."""
        # A host copy: on JAX one buffer in two variables is donated twice by the next step.
        self._moments_from.assign(keras.ops.convert_to_numpy(self.iterations))

    def load_own_variables(self, store: Any) -> None:
        if self.built and len(store.keys()) == len(self.variables) - 1:
            for index, variable in enumerate(self.variables[:-1]):
                variable.assign(store[str(index)])
            self._moments_from.assign(0)
            return
        super().load_own_variables(store)


def current_momentum(optimizer: keras.optimizers.Optimizer) -> float:
    """Momentum (or `beta_1`) as a float; `0.0` for optimizers without one."""
    for name in ("momentum", "beta_1"):
        value = getattr(optimizer, name, None)
        if value is not None:
            return float(keras.ops.convert_to_numpy(value))
    return 0.0


def applied_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The rate the next step applies: schedule(step) (or the float) times the multiplier."""
    rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    multiplier = getattr(optimizer, "learning_rate_multiplier", None)
    if multiplier is not None:
        rate *= float(keras.ops.convert_to_numpy(multiplier))
    return rate


def reject_keras_accumulation(kwargs: dict[str, Any]) -> None:
    """Raises if `gradient_accumulation_steps` is passed: these optimizers keep
    per-step scalars that Keras' own accumulation would advance at every micro-batch."""
    steps = kwargs.get("gradient_accumulation_steps")
    if steps is not None:
        raise ValueError(
            "Argument `gradient_accumulation_steps` is not supported by this optimizer: "
            "accumulate with `kadapt.accumulate(model, micro_batch_size=...)`, which "
            f"calls the optimizer once per logical batch. Received: gradient_accumulation_steps={steps!r}"
        )

