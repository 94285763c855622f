"""`micro_batch_size="auto"`: probe at the first `fit`, cache the answer on disk.

The cache key is the model's signature (its config and weight shapes), the
input shapes and dtypes, the dtype policy, the optimizer, `jit_compile` (as
the model resolved it), the allocator's mode, the replica count, the device,
its model name and budget, and the largest size worth having; a run with the
same key reuses the micro-batch without probing. Either way the first step's
peak is checked where the model trains (`FirstStepCheck`). The cache lives in
`$KADAPT_CACHE_DIR` (default `~/.cache/kadapt`), one JSON file.
"""

from __future__ import annotations

import logging
import math
import platform
from pathlib import Path
from typing import Any

import keras

from kadapt.batching import micro_batch_probe
from kadapt.batching import probe
from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.layer_walk import reachable_layers
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.memory_model import MemoryModel
from kadapt.batching.oom_recovery import smaller_micro_batch
from kadapt.batching.peak_search import PeakSearch
from kadapt.batching.tensorflow.allocator_mode import allocator_mode
from kadapt.batching.tensorflow.allocator_region import reserve_region
from kadapt.environment import allocator_statistics_available
from kadapt.measurement_cache import cache_file
from kadapt.measurement_cache import digest
from kadapt.measurement_cache import read_cache
from kadapt.measurement_cache import write_cache
from kadapt.precision import cpu_model_name

logger = logging.getLogger("kadapt")
KERAS_DEFAULT_BATCH_SIZE = 32
MIB = 2**20
# The first step of a `fit` peaks lower than the next: tf.data fills its
# prefetch buffers while it runs (measured on the CPU: 16 then 20.5 MiB held
# before a step of 128 rows of 32x32x3). The check reads both.
CHECKED_STEPS = 2
# Where a cached size overflows, the probe saw a size above it fail by a jump
# and measured nothing within this fraction below it, the check falls back to
# this fraction of the size and checks those steps too: the measured shrink
# has nothing near the size (issue 44's net on an Intel Xeon: a cached 40
# with no trial between 16 and 40 shrank to 20, 20, 26 in fresh processes;
# 32 rows trained at 42.3-42.4 MiB of 48 in every process that shrank to
# them). The probe used to run this fallback as a trial wherever the chosen
# size's trial left under 20% of the budget free: with oneDNN off (BFC
# allocator) two_conv's 128 rows at 128 MiB left 13-16% free and fitted in
# every cached process, and the trial at 103 ran in all five probes for
# nothing (benchmarks/README.md#probe). Measured where it trains, the
# fallback costs nothing where the size fits.
FALLBACK = 0.8
PROBE_CACHE = "probe-cache.json"


def cache_path() -> Path:
    return cache_file(PROBE_CACHE)


def resolve_auto_micro_batch(model: keras.Model, x: Any, y: Any, batch_size: int | None, sample_weight: Any) -> None:
    """Sets `model.micro_batch_size` from the cache or a fresh probe, and has
    the first step's peak checked where the model trains (`FirstStepCheck`)."""
    if keras.backend.backend() == "jax":  # XLA's plan: no allocator statistics, region or first-step check
        return resolve_planned_micro_batch(model, x, y, batch_size, sample_weight)
    data, sample, cap = _data_sample_and_cap(x, y, batch_size, sample_weight)
    budget = device_budget(model.memory_budget)
    key = cache_key(model, sample, budget, cap)
    cached = _read_cache().get(key)
    if cached is not None:
        reserve_region(budget)  # the region the cached size was measured in (a probe holds its own)
        model.micro_batch_size = cached["micro_batch_size"]
        logger.info("micro_batch_size=%d from the probe cache", model.micro_batch_size)
        memory_model, trials = _cached_memory_model(cached), _cached_trials(cached)
        probe_trials = _cached_probe_trials(cached)
        jumped = _jumped(probe_trials, model.micro_batch_size)
        fallback = unmeasured_fallback(probe_trials, model.micro_batch_size, cap, cached.get("checked", {}))
    else:
        result = micro_batch_probe.probe_micro_batch(model, data, model.memory_budget,
                                                     max_micro_batch_size=cap, logical_batch_size=cap)
        model.probe_result = result
        # As many passes as the largest size that fits needs, split evenly (never a sliver).
        model.micro_batch_size = balanced_micro_batch(cap, result.micro_batch_size)
        _write_cache(key, {"micro_batch_size": model.micro_batch_size, "probe": result.to_dict()})
        logger.info(
            "micro_batch_size=%d after %d trial steps and %d compiles (the largest that fits: %d; "
            "budget %d bytes, %s)", model.micro_batch_size, len(result.trials), result.compiles,
            result.micro_batch_size, budget.bytes, budget.source,
        )
        memory_model, trials = result.memory_model, _measured(result.trials)
        jumped = _jumped(result.trials, model.micro_batch_size)
        fallback = unmeasured_fallback(result.trials, model.micro_batch_size, cap)
    if model.distribute_strategy.num_replicas_in_sync > 1:
        return  # replicas and workers must agree on one size: only OOM recovery changes theirs
    if not allocator_statistics_available(budget.device):
        logger.warning("micro_batch_size=%d is not checked on the first step: %s keeps no allocator "
                       "statistics", model.micro_batch_size, budget.device)
        return
    model.first_step_check = FirstStepCheck(model, budget, cap, memory_model, trials, jumped, fallback, key)
    model.train_function = model.first_step_check


class FirstStepCheck:
    """The train function of the first steps after `"auto"` chose a size.

    A size is judged where the model trains with it: a cached size was
    measured in another process, whose allocator layout can sit 15-20%
    lower (docs/probe.md), and training holds what no trial does (the
    logical batch, prefetched input). This runs the first CHECKED_STEPS
    steps, reads their peak and, over the budget, sets the size
    `size_after_first_step` re-solves before the next step; then it hands
    the model back its own train function. Where the probe saw a size
    above fail by a jump and measured nothing within FALLBACK x below the
    size (`fallback`, from `unmeasured_fallback`), an overflow shrinks to
    that fallback instead and checks CHECKED_STEPS more steps there: the
    fallback trial the probe no longer runs, measured by this process's
    own steps and only where the size overflowed. Within the budget, the
    fallback is written to the probe cache under `key` (later processes
    start from it); over it, the size shrinks once more, to
    `size_after_first_step`'s measured sizes or half, and the cache
    records the fallback's peak (later processes skip it).
    `peak_bytes` (at the first size), `fallback_peak_bytes` and
    `shrunk_to` record what it saw; `steps` counts the steps checked.
    `trials`: the probe's `(micro_batch_size, mean peak bytes)` of the
    trials that fitted; `jumped`: a size above the chosen one failed by a
    jump in the probe (`PeakSearch.jumped_above`).
    """

    def __init__(self, model: keras.Model, budget: MemoryBudget, cap: int,
                 memory_model: MemoryModel | None, trials: tuple = (), jumped: bool = False,
                 fallback: int | None = None, key: str | None = None) -> None:
        self.model, self.budget, self.cap = model, budget, cap
        self.memory_model, self.trials, self.jumped = memory_model, trials, jumped
        self.fallback, self.key = fallback, key
        self.train_function = model.make_train_function()
        self.peak_bytes = self.shrunk_to = self.fallback_peak_bytes = None
        self.started = model.micro_batch_size
        self.steps = self.fallback_steps = 0
        self.on_fallback = False

    def __call__(self, iterator: Any) -> Any:
        import tensorflow as tf  # the TensorFlow backend's check (JAX plans instead)

        device = self.budget.device
        tf.config.experimental.reset_memory_stats(device)
        logs = self.train_function(iterator)
        peak = tf.config.experimental.get_memory_info(device)["peak"]
        self.steps += 1
        if self.on_fallback:
            self.check_fallback(peak)
            return logs
        self.peak_bytes = max(peak, self.peak_bytes or 0)
        size = self.model.micro_batch_size
        smaller = size_after_first_step(size, self.peak_bytes, self.budget.bytes, self.memory_model,
                                        self.trials, self.jumped)
        if smaller == size and self.steps < CHECKED_STEPS:
            return logs
        if smaller == size:
            self.model.train_function = self.train_function
            logger.info("first steps at micro_batch_size=%d peaked at %.1f MiB, within the budget (%.1f MiB)",
                        size, self.peak_bytes / MIB, self.budget.bytes / MIB)
            return logs
        if self.fallback is not None:
            self.on_fallback = True
            self.shrunk_to = self.model.micro_batch_size = self.fallback
            logger.warning("first step at micro_batch_size=%d peaked at %.1f MiB, over the budget (%.1f MiB): "
                           "micro_batch_size=%d (unmeasured, checked) from the next step", size,
                           self.peak_bytes / MIB, self.budget.bytes / MIB, self.fallback)
            return logs
        self.shrink(smaller)
        return logs

    def check_fallback(self, peak: int) -> None:
        """Judges a step at the fallback: over the budget, shrinks once more;
        after CHECKED_STEPS within it, keeps it and writes it to the cache."""
        self.fallback_peak_bytes = max(peak, self.fallback_peak_bytes or 0)
        self.fallback_steps += 1
        if self.fallback_peak_bytes > self.budget.bytes:
            self.record({"checked": {str(self.fallback): self.fallback_peak_bytes}})
            # What the shrink from the first size takes without a fallback: measured sizes or half.
            smaller = size_after_first_step(self.started, self.peak_bytes, self.budget.bytes, self.memory_model,
                                            self.trials, self.jumped)
            self.shrink(min(smaller, self.fallback - 1))
        elif self.fallback_steps >= CHECKED_STEPS:
            self.model.train_function = self.train_function
            self.record({"micro_batch_size": self.fallback,
                         "checked": {str(self.fallback): self.fallback_peak_bytes}})
            logger.info("steps at the fallback micro_batch_size=%d peaked at %.1f MiB, within the budget "
                        "(%.1f MiB)", self.fallback, self.fallback_peak_bytes / MIB, self.budget.bytes / MIB)

    def shrink(self, smaller: int) -> None:
        """Hands the model back its train function at `smaller` rows (split evenly)."""
        self.model.train_function = self.train_function
        size = self.model.micro_batch_size
        self.shrunk_to = balanced_micro_batch(self.cap, smaller)
        logger.warning("step at micro_batch_size=%d peaked at %.1f MiB, over the budget (%.1f MiB): "
                       "micro_batch_size=%d from the next step", size,
                       max(self.peak_bytes, self.fallback_peak_bytes or 0) / MIB,
                       self.budget.bytes / MIB, self.shrunk_to)
        self.model.micro_batch_size = self.shrunk_to

    def record(self, update: dict) -> None:
        """Merges `update` into this key's probe-cache entry (`checked` merged
        size by size), where there is one."""
        entry = _read_cache().get(self.key) if self.key else None
        if entry is None:
            return
        checked = {**entry.get("checked", {}), **update.get("checked", {})}
        _write_cache(self.key, {**entry, **update, "checked": checked})


def unmeasured_fallback(trials: Any, size: int, cap: int, checked: dict | None = None) -> int | None:
    """The size FirstStepCheck falls back to where `size` overflows: FALLBACK
    x `size` (as `cap` rows train it), where a size above `size` failed by a
    jump among the probe's `trials` (peaks that jump with the size jump with
    the process, and no line foretells an unmeasured size) and nothing lies
    measured in [fallback, `size`): no trial, and no earlier process's
    checked steps (`checked`: the cache's `{size: peak}`). Else `None`
    (the measured sizes decide). Issue 44's net on an Intel Xeon: 40 rows
    fitted at 37.2-41.2 MiB of 48 in 4 probing processes of 24 and peaked
    at 49.1-57.8 MiB in the other 20; 32 rows trained at 42.3-42.4 MiB in
    every process that shrank to them.

    Args:
        trials: The probe's `ProbeTrial`s.
        size: Int. The micro-batch the process trains with.
        cap: Int. The logical batch (the fallback is a size it trains as).
        checked: Dict `{str(size): peak bytes}` or `None`: steps checked
            in earlier processes (a probe-cache entry's `"checked"`).
            Defaults to `None`.

    Example:

    ```python
    fallback = unmeasured_fallback(result.trials, model.micro_batch_size, 1024)
    ```
    """
    fallback = balanced_micro_batch(cap, math.ceil(FALLBACK * size))
    measured = {t.micro_batch_size for t in trials} | {int(m) for m in (checked or {})}
    if fallback >= size or not _jumped(trials, size) or any(fallback <= m < size for m in measured):
        return None
    return fallback


def size_after_first_step(size: int, peak_bytes: int, budget_bytes: int,
                          memory_model: MemoryModel | None, trials: tuple = (), jumped: bool = False) -> int:
    """The micro-batch for the steps after a first step of `size` rows that
    peaked at `peak_bytes`: `size` within the budget. Over it, two answers,
    the larger taken. The probe's line moved up through the measured point
    (this process's allocator and input pipeline sit higher, a row costs the
    same) and solved with the probe's margin, at least half of `size`
    (without a line, x0.75). And the measurements: the first step's peak
    less the trial's at `size` is how much higher this process runs at
    `size` (`trials`: the probe's `(micro_batch_size, mean peak bytes)` of
    the trials that fitted); the largest smaller trial size whose peak plus
    its share of that excess fits. The share is in proportion to the rows
    (`m / size`): what a process's allocator layout adds is in the chunks of
    the micro-batch's buffers, which grow with the rows (issue 44: a cached
    40 rows peaked at 53.9 MiB of 48 in a fresh process, and the whole
    excess added to every smaller trial sent the size to half). Peaks are not
    monotonic in rows, so a measured size, not a line. Where the probe saw
    a size above `size` fail by a jump (`jumped`), the line is no guide
    between its points (issue 44's net on an Intel Xeon: a cached 64 at
    54.0 MiB of 48 shrank down the line to 40, a size that jumps, and
    overflowed at 52.7 MiB), so only measured sizes are taken, at least
    half of `size`. Always smaller than `size`."""
    if peak_bytes <= budget_bytes:
        return size
    if memory_model is None:
        by_line = smaller_micro_batch(size)
    else:
        slope = memory_model.bytes_per_row
        moved = MemoryModel(peak_bytes - slope * size, slope)
        target = moved.largest_fitting(budget_bytes, probe.MARGIN)
        by_line = max(1, math.ceil(size / 2), min(target, size - 1))
    measured = dict(trials)
    if size not in measured:
        return by_line
    excess = peak_bytes - measured[size]
    fitting = [m for m, peak in trials if m < size and peak + excess * m / size <= budget_bytes]
    if jumped:
        return max([math.ceil(size / 2), *fitting])
    return max([by_line, *fitting])


def _measured(trials):
    """`(micro_batch_size, mean peak bytes)` of the trials that fitted."""
    return tuple((t.micro_batch_size, t.mean_peak_bytes) for t in trials if t.fits)


def _cached_probe_trials(entry):
    """A cache entry's probe trials (stored as dicts) as `ProbeTrial`s."""
    return [probe.ProbeTrial(**{**t, "step_peaks": tuple(t.get("step_peaks", ()))})
            for t in entry.get("probe", {}).get("trials", ())]


def _cached_trials(entry):
    """`_measured` of a cache entry's probe."""
    return _measured(_cached_probe_trials(entry))


def _jumped(trials, size):
    """Whether a size above `size` failed by a jump among `trials`."""
    search = PeakSearch(None, 0)
    search.trials = list(trials)
    return search.jumped_above(size)


def _cached_memory_model(entry):
    """The memory model of a cache entry's probe (`None` where it had none)."""
    found = entry.get("probe", {}).get("memory_model")
    return None if found is None else MemoryModel(**found)


def _data_sample_and_cap(x, y, batch_size, sample_weight):
    """What `fit` was given (a dataset, or `(x, y, sample_weight)`), its first rows and the
    logical batch size (the largest micro-batch worth having)."""
    data = x if probe.is_dataset(x) else (x, y, sample_weight)
    sample = probe.sample_rows(data)
    return data, sample, _logical_batch_size(x, sample, batch_size)


def _logical_batch_size(x, sample, batch_size):
    if probe.is_dataset(x):
        return probe.row_count(sample)
    return batch_size or KERAS_DEFAULT_BATCH_SIZE


def cache_key(model: keras.Model, sample: tuple, budget: MemoryBudget, cap: int) -> str:
    import tensorflow as tf  # the TensorFlow backend's key (the JAX plan has `plan_cache_key`)

    signature = {
        **_model_signature(model, sample),
        "allocator": allocator_mode(budget.device),
        "replicas": model.distribute_strategy.num_replicas_in_sync,
        "device": budget.device,
        "device_name": device_name(budget.device),
        "budget": budget.bytes,
        "cap": cap,
        "versions": [tf.__version__, keras.__version__],
    }
    return _digest(signature)


def _model_signature(model, sample):
    inputs = [
        (list(a.shape[1:]), str(a.dtype)) for a in keras.tree.flatten(sample[0]) if a is not None
    ]
    try:
        config = model.get_config()
    except (NotImplementedError, TypeError):
        config = type(model).__qualname__  # a subclassed model without get_config
    signature = {
        "model": config,
        "weights": [list(w.shape) for w in model.weights],
        "inputs": inputs,
        # The policies the layers compute under (a network built under mixed_bfloat16 and
        # trained after the global policy went back to float32 is a bfloat16 network).
        "dtype_policy": sorted({layer.dtype_policy.name for layer in reachable_layers(model)}),
        "optimizer": type(model.optimizer).__name__,
        # Each traces another step: XLA's buffers are not the graph's.
        "jit_compile": bool(model.jit_compile),
    }
    return signature


def _digest(signature):
    return digest(_without_names(signature))


def device_name(device: str) -> str:
    """The model of `device` ("CPU:0", "GPU:1"): a GPU's name as TensorFlow
    reports it, a CPU's from /proc/cpuinfo where there is one."""
    import tensorflow as tf  # TensorFlow's device names

    kind, _, index = device.upper().partition(":")
    physical = tf.config.list_physical_devices(kind)
    if kind == "GPU" and physical:
        details = tf.config.experimental.get_device_details(physical[min(int(index or 0), len(physical) - 1)])
        return details.get("device_name", "GPU")
    return cpu_model_name() or platform.processor() or platform.machine()


def _without_names(value):
    if isinstance(value, dict):
        return {k: _without_names(v) for k, v in value.items() if k != "name"}
    if isinstance(value, (list, tuple)):
        return [_without_names(v) for v in value]
    return value


def _read_cache():
    return read_cache(PROBE_CACHE)


def _write_cache(key, entry):
    write_cache(PROBE_CACHE, key, entry)


def resolve_planned_micro_batch(model: keras.Model, x: Any, y: Any, batch_size: int | None,
                                sample_weight: Any) -> None:
    """`"auto"` on the JAX backend: the size from the cache or the plan-based
    probe (`kadapt.batching.jax.probe`). A plan is the same in every process,
    so a cached size is not checked again on the first step."""
    from kadapt.batching.jax.probe import plan_budget  # JAX is optional

    data, sample, cap = _data_sample_and_cap(x, y, batch_size, sample_weight)
    budget = plan_budget(model.memory_budget)
    key = plan_cache_key(model, sample, budget, cap)
    cached = _read_cache().get(key)
    if cached is not None:
        model.micro_batch_size = cached["micro_batch_size"]
        logger.info("micro_batch_size=%d from the probe cache", model.micro_batch_size)
        return
    result = micro_batch_probe.probe_micro_batch(model, data, model.memory_budget, max_micro_batch_size=cap,
                                                 logical_batch_size=cap)
    model.probe_result = result
    model.micro_batch_size = balanced_micro_batch(cap, result.micro_batch_size)
    _write_cache(key, {"micro_batch_size": model.micro_batch_size, "probe": result.to_dict()})
    logger.info("micro_batch_size=%d after %d planned sizes (the largest that fits: %d; budget %d "
                "bytes, %s)", model.micro_batch_size, len(result.trials), result.micro_batch_size,
                budget.bytes, budget.source)


def plan_cache_key(model: keras.Model, sample: tuple, budget: MemoryBudget, cap: int) -> str:
    """The cache key of a plan-based probe: the model's signature, the
    backend, the device's kind, the budget and the cap."""
    import jax  # JAX is optional

    from kadapt.batching.jax.data_parallel import batch_shards

    device = jax.devices()[0]
    signature = {
        **_model_signature(model, sample),
        "backend": "jax",
        "device": budget.device,
        "device_name": device.device_kind,
        "batch_shards": batch_shards(),  # a plan under a mesh is one device's share
        "budget": budget.bytes,
        "cap": cap,
        "versions": [jax.__version__, keras.__version__],
    }
    return _digest(signature)
