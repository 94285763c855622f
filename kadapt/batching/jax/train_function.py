"""The JAX train function: one jitted accumulating step per micro-batch size, with recovery.

Keras' JAX `make_train_function` jits `train_step` with `donate_argnums=0`:
the state's buffers are handed to the step and are gone after it runs, so a
step that fails part-way (out of memory) could leave nothing to retry with.
While recovery is on (`max_oom_retries > 0`) the state is not donated: the
step returns a new state and the old one stays valid until it is dropped, so
a failed step leaves the state exactly as it was and the SAME batch is run
again with a smaller micro-batch (`kadapt.batching.oom_recovery`). The cost
is one more copy of the state (weights, optimizer slots) alive during a
step; a host copy instead would cost a device-to-host transfer every step.
With recovery off the state is donated, as in Keras.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import keras

from kadapt.batching.jax import host_loop
from kadapt.batching.jax.out_of_memory import is_out_of_memory
from kadapt.batching.oom_recovery import shrink


class JaxTrainFunction:
    """Callable `(state, iterator) -> (logs, state)` over `steps_per_execution` batches.

    Args:
        model: An accumulating model (`kadapt.AccumulatingTrainStep`) on JAX.
    """

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self._steps = {}

    @property
    def compiles(self) -> int:
        """Step functions made so far: one per micro-batch size (a trace-time constant)."""
        return len(self._steps)

    def __call__(self, state: tuple, iterator: Iterator) -> tuple[dict[str, Any], tuple]:
        logs = None
        for _, data in zip(range(self.model.steps_per_execution), iterator):
            logs, state = self._run_with_recovery(state, data)
        if logs is None:
            raise StopIteration
        return logs, state

    def _run_with_recovery(self, state, data):
        model = self.model
        attempt = 0
        while True:  # ends by returning, or by shrink raising
            try:
                return self._step_function()(state, data)
            except Exception as error:
                if model.max_oom_retries == 0 or not is_out_of_memory(error):
                    raise
                shrink(model, error, attempt, step=_iterations(model, state))
                attempt += 1

    def _step_function(self):
        micro = self.model.micro_batch_size
        if micro not in self._steps:
            self._steps[micro] = self._make_step()
        return self._steps[micro]

    def _make_step(self):
        model = self.model
        if model.run_eagerly or not model.jit_compile:
            return model.train_step
        def step(state, data):
            return model.train_step(state, data)

        # A new function per micro-batch size: `jit` caches its traces by the function, and
        # the size is read while tracing. Donated only without recovery: see the module docstring.
        fused = jax.jit(step, donate_argnums=donated_arguments(model))
        if host_loop.wanted(model):
            # The state is not donated there: the micro-steps read it after the loop began.
            return host_loop.HostLoopStep(model, fused)
        return fused


def donated_arguments(model: keras.Model) -> tuple:
    """The step's arguments whose buffers XLA may reuse: the state (argument 0)
    where recovery is off, as Keras donates it; none while it is on (the
    module docstring). XLA's memory plan compiles the step with the same
    (`kadapt.batching.jax.memory_plan.step_plan`): an undonated state is one
    more copy of it alive during the step."""
    return () if getattr(model, "max_oom_retries", 0) else (0,)


def _iterations(model, state):
    """The optimizer's step count in `state` (the variable itself is not current inside `fit`)."""
    optimizer = model.optimizer
    for variable, value in zip(optimizer.variables, state[2]):
        if variable is optimizer.iterations:
            return int(value)
    return 0

