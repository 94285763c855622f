"""`probe_micro_batch_jax`: the largest micro-batch whose XLA memory plan fits.

On Keras' JAX backend the compiled step's buffers are known before it runs
(`kadapt.batching.jax.memory_plan`), identical on every compile: the probe
plans trial sizes instead of running them (`PlanSearch`: a plan has no
run-to-run noise for `PeakSearch`'s room to cover) and returns the
same `ProbeResult` as the TensorFlow probe.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import keras
import numpy as np

from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.batching.jax.memory_plan import StepPlan
from kadapt.batching.jax.memory_plan import built_for_plan
from kadapt.batching.jax.memory_plan import check_compiled
from kadapt.batching.jax.memory_plan import check_jax_backend
from kadapt.batching.jax.memory_plan import planned_micro_batch
from kadapt.batching.jax.memory_plan import state_variables
from kadapt.batching.jax.memory_plan import step_plan
from kadapt.batching.jax.train_function import donated_arguments
from kadapt.batching.memory_budget import CPU_RAM_FRACTION
from kadapt.batching.memory_budget import ENVIRONMENT_VARIABLE
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.memory_budget import available_ram
from kadapt.batching.memory_budget import gpu_margin
from kadapt.batching.memory_budget import parse_memory_size
from kadapt.batching.plan_search import PlanSearch
from kadapt.batching.probe import ProbeResult
from kadapt.batching.probe import ProbeTrial
from kadapt.batching.probe import repeat_rows
from kadapt.batching.probe import row_count
from kadapt.batching.probe import sample_rows
from kadapt.validation import check_micro_batch_size


@dataclasses.dataclass(frozen=True)
class PlannedTrial(ProbeTrial):
    """A trial size planned by XLA: `peak_bytes` is `plan.peak_bytes`.

    On a device that reports `memory_stats()` (a GPU), the chosen size also
    runs one real step: `measured_peak_bytes` is what that step held at
    once, as the plan counts it (its arguments included), read without a
    reset as `peak_bytes_in_use` after the step less what was in use before
    it besides its arguments; `None` where no step ran, or where the step
    did not raise the process's peak (an earlier, higher peak hides it).
    `process_peak_bytes` is the device's `peak_bytes_in_use` after the step.
    """

    plan: StepPlan | None = None
    measured_peak_bytes: int | None = None
    process_peak_bytes: int | None = None


def probe_micro_batch_jax(
    model: keras.Model,
    data: Any,
    memory_budget: int | str | None = None,
    max_micro_batch_size: int | None = None,
    on_trial: Callable[[ProbeTrial], None] | None = None,
    logical_batch_size: int | None = None,
) -> ProbeResult:
    """Finds the largest micro-batch whose planned train step fits the budget.

    Each trial size is planned, not run: XLA compiles the model's train step
    on abstract shapes and reports its buffers (`step_plan`). An accumulating
    model is planned at the logical batch (`logical_batch_size`, else two
    micro-batches) split into micro-batches of the trial size; a plain model
    on a batch of the trial size. The search (`PlanSearch`) fits
    peak = a + b * m through the two largest plans, keeps 5% of the room
    above `a` free (what a plan does not hold: the allocator's gaps), and
    plans the size it predicts before choosing it (it never returns an
    unplanned size); typically three plans. On a device that reports `memory_stats()` the chosen
    size then runs one real step, whose measured peak is recorded beside the
    plan (`PlannedTrial.measured_peak_bytes`); the step leaves no trace.

    Args:
        model: Compiled `keras.Model` on the JAX backend, plain or accumulating.
        data: `(x, y)` or `(x, y, sample_weight)` arrays. Only their shapes
            and dtypes are planned; a GPU's real step trains on their first
            rows, repeated where needed.
        memory_budget: Bytes, a string like `"2GiB"`, or `None`: then
            `$KADAPT_MEMORY_BUDGET`, else the device's `bytes_limit` less
            kadapt's GPU margin; on JAX's CPU, which reports no limit, half
            the RAM available (`plan_budget`). Defaults to `None`.
        max_micro_batch_size: Positive int or `None`. The largest size worth
            having. Defaults to the rows of `data`.
        on_trial: Callable `ProbeTrial -> None` or `None`, called after each
            planned size. Defaults to `None`.
        logical_batch_size: Positive int or `None`. The rows of the steps an
            accumulating model will train. Defaults to `None`.

    Returns:
        A `ProbeResult` whose trials are `PlannedTrial`s.

    Example:

    ```python
    result = probe_micro_batch_jax(model, (x, y), memory_budget="4GiB")
    print(result.micro_batch_size, result.trials[-1].plan)
    ```
    """
    check_jax_backend()
    check_compiled(model)
    budget = plan_budget(memory_budget)
    sample = sample_rows(data)
    cap = row_count(sample) if max_micro_batch_size is None else check_micro_batch_size(
        max_micro_batch_size, name="max_micro_batch_size")
    rows = None if logical_batch_size is None else check_micro_batch_size(
        logical_batch_size, name="logical_batch_size")
    report = on_trial or (lambda trial: None)

    def runner(size):
        trial = planned_trial(model, sample, size, budget.bytes, rows)
        report(trial)
        return trial

    search = PlanSearch(runner, budget.bytes, lambda size: trial_rows(model, size, rows)[1] or size)
    chosen = search.largest(cap)
    trials = tuple(search.trials)
    if device_memory_stats() is not None:
        trials = with_measured_step(model, sample, trials, chosen, rows)
    return ProbeResult(chosen, trials, search.memory_model(), budget)


def plan_budget(memory_budget: int | str | None) -> MemoryBudget:
    """The budget: the argument, else `$KADAPT_MEMORY_BUDGET`, else the
    device's `bytes_limit` less `gpu_margin` (what a plan does not hold:
    autotuning workspaces, the allocator's free space between buffers); on a
    device that reports no limit (JAX's CPU) `CPU_RAM_FRACTION` of the RAM
    available now, as on TensorFlow's CPU."""
    device = str(jax.local_devices()[0])
    if memory_budget is not None:
        return MemoryBudget(parse_memory_size(memory_budget), device, "memory_budget argument")
    if os.environ.get(ENVIRONMENT_VARIABLE):
        size = parse_memory_size(os.environ[ENVIRONMENT_VARIABLE], name=ENVIRONMENT_VARIABLE)
        return MemoryBudget(size, device, ENVIRONMENT_VARIABLE)
    limit = (device_memory_stats() or {}).get("bytes_limit")
    if not limit:
        return MemoryBudget(int(available_ram() * CPU_RAM_FRACTION), device,
                            f"{CPU_RAM_FRACTION:.0%} of available RAM; {device} reports no memory limit")
    return MemoryBudget(int(limit) - gpu_margin(int(limit)), device,
                        f"bytes_limit {limit / 2**30:.1f} GiB less kadapt's GPU margin")


def device_memory_stats() -> dict | None:
    """`memory_stats()` of this process's first JAX device: `None` on the CPU."""
    return jax.local_devices()[0].memory_stats()


def trial_rows(model: keras.Model, size: int, rows: int | None) -> tuple[int, int | None]:
    """`(batch rows, micro-batch)` of a trial: an accumulating model's logical
    batch split evenly as it trains; a plain model's batch of `size` rows."""
    if not hasattr(model, "micro_batch_size"):
        return size, None
    rows = rows or 2 * size
    return rows, balanced_micro_batch(rows, size)


def planned_trial(model: keras.Model, sample: tuple, size: int, budget_bytes: int,
                  rows: int | None) -> PlannedTrial:
    batch_rows, micro = trial_rows(model, size, rows)
    plan = step_plan(model, abstract_rows(sample, batch_rows), micro)
    return PlannedTrial(size, plan.peak_bytes, None, plan.peak_bytes <= budget_bytes,
                        compiles=1, plan=plan)


def abstract_rows(sample: tuple, rows: int) -> tuple:
    """`sample`'s arrays as `jax.ShapeDtypeStruct`s of `rows` rows."""
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct((rows,) + tuple(np.shape(a)[1:]), np.dtype(a.dtype)), sample)


def with_measured_step(model: keras.Model, sample: tuple, trials: tuple, chosen: int,
                       rows: int | None) -> tuple:
    """`trials` with the chosen size's last trial carrying a real step's peak."""
    index = max(i for i, t in enumerate(trials) if t.micro_batch_size == chosen)
    measured, process_peak = measure_step(model, sample, trials[index].plan, chosen, rows)
    trial = dataclasses.replace(trials[index], measured_peak_bytes=measured,
                                process_peak_bytes=process_peak)
    return trials[:index] + (trial,) + trials[index + 1:]


def measure_step(model: keras.Model, sample: tuple, plan: StepPlan, size: int,
                 rows: int | None) -> tuple[int | None, int]:
    """Runs one real step of the planned shape and restores every variable.

    Returns `(measured_peak_bytes, process_peak_bytes)` (see `PlannedTrial`).
    JAX has no reset of `peak_bytes_in_use`, so the step's own peak is read
    as the rise above what was in use before it, plus its arguments (which
    were in use already); when the process's peak was higher before, the
    step's is hidden and `None` is returned for it."""
    batch_rows, micro = trial_rows(model, size, rows)
    batch = jax.device_put(repeat_rows(sample, batch_rows))
    with planned_micro_batch(model, micro), built_for_plan(model, abstract_rows(sample, batch_rows)):
        groups = state_variables(model)
        saved = [(v, np.array(v.value)) for group in groups for v in group]
        state = tuple([v.value for v in group] for group in groups)
        step = jax.jit(model.train_step, donate_argnums=donated_arguments(model)).lower(state, batch).compile()
        before = device_memory_stats()
        try:
            jax.block_until_ready(step(state, batch))
            after = device_memory_stats()
        finally:
            for variable, value in saved:
                variable.assign(value)
    peak = int(after["peak_bytes_in_use"])
    if peak <= int(before["peak_bytes_in_use"]):
        return None, peak
    return peak - int(before["bytes_in_use"]) + plan.argument_bytes, peak

