"""Numerics chosen by measurement: float32, bfloat16 or float16 for this device.

`choose_precision` times training steps of the actual model under each
Keras dtype policy the device has units for (`supported_policies`) and keeps
the fastest one that beats float32 by at least `min_speedup` (1.15x), else
float32: the gain depends on the CPU (benchmarks/README.md#precision_step),
and a CPU without BF16 units emulates bfloat16 and loses time. The variables stay float32 under every policy (Keras' mixed
precision); `"mixed_float16"` scales the loss (Keras wraps the optimizer).

The policies take turns in steady rounds after a warm-up (`alternated_timings`):
timed one after the other, a machine whose speed drifts (another process, the
first steps' caches) decides instead of the numerics, as an earlier version did
(1.07x measured where a longer run gave 1.27x). A choice is kept per machine and
model (`kadapt.measurement_cache`), so a machine pays for it once; and
`$KADAPT_PRECISION` pins one for every run on a machine, nothing timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras

from kadapt.measurement_cache import digest
from kadapt.measurement_cache import read_cache
from kadapt.measurement_cache import write_cache
from kadapt.validation import check_range

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
MIN_SPEEDUP = 1.15
NO_UNITS = "this device has no bfloat16 or float16 units"
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# Two untimed steps (the trace, the first run), then rounds of three steps per policy; an even number
# of rounds, so that a drift in speed as steady as a line biases neither policy (the median of six
# rounds against precision_step.py's longer measurement: benchmarks/README.md#precision_step).
WARMUP_STEPS, ROUNDS, STEPS_PER_ROUND = 2, 6, 3
PIN = "KADAPT_PRECISION"  # the environment variable that pins a precision on a machine
CACHE = "precision-cache.json"


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """What `choose_precision` measured and chose.

    Attributes:
        policy: The Keras dtype policy chosen (`"float32"`, `"mixed_bfloat16"`
            or `"mixed_float16"`).
        seconds_per_step: Dict, policy -> median seconds of one training step.
        reason: One sentence: why this policy.
    """

    policy: str
    seconds_per_step: dict[str, float]
    reason: str

    def speedup(self, policy: str) -> float:
        """float32's seconds per step over `policy`'s."""
        return self.seconds_per_step["float32"] / self.seconds_per_step[policy]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (Linux), or an empty set where they cannot be read."""
    return set(_cpuinfo("flags", path).split())


def cpu_model_name(path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux), or `""` where it cannot be read."""
    return _cpuinfo("model name", path)


def _cpuinfo(field, path):
    try:
        with open(path) as file:
            for line in file:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def supported_policies(gpus: Sequence[tuple[int, int]] | None = None,
                       flags: set[str] | None = None) -> list[str]:
    """The dtype policies this device has arithmetic units for, float32 first.

    A GPU of compute capability 8.0 or more (Ampere, Hopper) has bfloat16 and
    float16 units, 7.x (Volta, Turing) float16 only; a CPU has bfloat16 units
    where it reports `avx512_bf16` or `amx_bf16`.

    Args:
        gpus: List of `(major, minor)` compute capabilities, or `None` to
            ask TensorFlow. Defaults to `None`.
        flags: Set of CPU flags, or `None` to read them. Defaults to `None`.
    """
    gpus = _gpu_capabilities() if gpus is None else gpus
    if gpus:
        capability = min(gpus)
        return ["float32"] + (["mixed_bfloat16"] if capability >= (8, 0) else []) + (
            ["mixed_float16"] if capability >= (7, 0) else [])
    flags = cpu_flags() if flags is None else flags
    return ["float32"] + (["mixed_bfloat16"] if any(flag in flags for flag in _CPU_BF16_FLAGS) else [])


def _gpu_capabilities():
    if keras.backend.backend() == "jax":
        return _jax_gpu_capabilities()
    import tensorflow as tf

    return [tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0)))
            for gpu in tf.config.list_physical_devices("GPU")]


def _jax_gpu_capabilities():
    import jax

    # A CUDA device reports its compute capability as a string such as "9.0".
    return [tuple(int(part) for part in str(getattr(device, "compute_capability", "0.0")).split(".")[:2])
            for device in jax.devices() if device.platform == "gpu"]


def policy_name(precision: str) -> str:
    """The Keras policy of a precision name (`"float32"`, `"bfloat16"`,
    `"float16"`) or policy name; raises `ValueError` for anything else."""
    if precision in POLICIES.values():
        return precision
    if precision not in POLICIES:
        raise ValueError(f"Argument `precision` must be one of auto, {', '.join(POLICIES)}. "
                         f"Received: precision={precision!r}")
    return POLICIES[precision]


@contextlib.contextmanager
def global_policy(policy: str) -> Iterator[None]:
    """Keras' global dtype policy set to `policy` inside the block, restored after."""
    before = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(before)


def decide(seconds_per_step: dict[str, float], min_speedup: float = MIN_SPEEDUP) -> PrecisionChoice:
    """The `PrecisionChoice` for measured `seconds_per_step` (policy -> seconds):
    the fastest policy at least `min_speedup` times faster than float32, else
    float32."""
    base = seconds_per_step["float32"]
    fastest = min(seconds_per_step, key=seconds_per_step.get)
    speedup = base / seconds_per_step[fastest]
    if fastest != "float32" and speedup >= min_speedup:
        reason = f"{fastest} ran a step {speedup:.2f}x faster than float32 (at least {min_speedup}x needed)"
        return PrecisionChoice(fastest, dict(seconds_per_step), reason)
    if len(seconds_per_step) == 1:
        reason = NO_UNITS
    else:
        others = ", ".join(f"{p} {base / s:.2f}x" for p, s in seconds_per_step.items() if p != "float32")
        reason = f"no policy beat float32 by {min_speedup}x ({others})"
    return PrecisionChoice("float32", dict(seconds_per_step), reason)


def pinned_precision() -> PrecisionChoice | None:
    """The choice `$KADAPT_PRECISION` pins on this machine (`float32`,
    `bfloat16` or `float16`), nothing timed; `None` where it is not set."""
    value = os.environ.get(PIN, "")
    if not value:
        return None
    if value not in POLICIES:
        raise ValueError(f"The environment variable {PIN} must be one of {', '.join(POLICIES)}, or unset to "
                         f"measure. Received: {PIN}={value!r}")
    return PrecisionChoice(POLICIES[value], {}, f"{PIN}={value}")


def asked_precision(precision: str) -> PrecisionChoice:
    """The `PrecisionChoice` of a precision asked for by name, nothing timed;
    where the device has no units for it, it runs as asked and the reason says so."""
    policy = policy_name(precision)
    reason = f"--precision {precision}"
    if policy != "float32" and policy not in supported_policies():
        reason += (f"; this device has no {policy.removeprefix('mixed_')} units: it is emulated, which is usually "
                   "slower than float32 (--precision auto measures)")
    return PrecisionChoice(policy, {}, reason)


def choose_precision(build_model: Callable[[], keras.Model], x: Any, y: Any = None, batch_size: int = 256,
                     steps: int = STEPS_PER_ROUND, min_speedup: float = MIN_SPEEDUP,
                     policies: Sequence[str] | None = None, rounds: int = ROUNDS,
                     cache_key: Any = None) -> PrecisionChoice:
    """Times the model under each supported dtype policy and chooses one.

    `$KADAPT_PRECISION` set: its precision, nothing timed. With float32 the
    only candidate nothing is timed either. Otherwise `build_model()` is
    called under each policy as Keras' global policy, and the models take
    turns in `rounds` rounds of `steps` training steps on one batch, after
    two untimed steps each (`alternated_timings`); the median round decides.
    With a `cache_key`, the choice is kept for this machine and that key
    (`kadapt.measurement_cache`) and a later call reuses it. The global
    policy is restored afterwards: set the chosen one before building the
    model you train.

    Args:
        build_model: Callable returning a fresh compiled `keras.Model`, built
            under the global policy at the time of the call.
        x, y: A batch source: arrays (or a dict of arrays) with at least
            `batch_size` rows; `y` may be `None` for models without targets.
        batch_size: Positive int. Rows per timed step. Defaults to `256`.
        steps: Positive int. Timed steps per policy in each round. Defaults to `3`.
        min_speedup: Float >= 1. How much faster than float32 a policy must
            be to be chosen. Defaults to `1.15`.
        policies: List of policy names to try, or `None` for
            `supported_policies()`. Defaults to `None`.
        rounds: Positive int. Rounds of `steps` steps per policy. Defaults to `5`.
        cache_key: JSON-able description of the model and its batch (its
            name, input shape, ...), or `None` to measure every time.
            Defaults to `None`.

    Returns:
        A `PrecisionChoice`.

    Example:

    ```python
    def build():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    choice = kadapt.choose_precision(build, x_train, y_train, batch_size=256)
    keras.mixed_precision.set_global_policy(choice.policy)
    model = build()
    ```
    """
    if not callable(build_model):
        raise TypeError("Argument `build_model` must be a callable that returns a compiled keras.Model. "
                        f"Received: build_model={build_model!r}")
    check_range("batch_size", batch_size, low=1, integer=True)
    check_range("steps", steps, low=1, integer=True)
    check_range("rounds", rounds, low=1, integer=True)
    check_range("min_speedup", min_speedup, low=1.0)
    policies = None if policies is None else [policy_name(p) for p in policies]
    pinned = pinned_precision()
    if pinned is not None:
        return pinned
    policies = supported_policies() if policies is None else policies
    if "float32" not in policies:
        policies = ["float32"] + list(policies)
    if policies == ["float32"]:
        return PrecisionChoice("float32", {}, NO_UNITS)  # nothing to compare: no time spent
    key = None if cache_key is None else digest({"model": cache_key, "batch_size": batch_size, "policies": policies,
                                                 "min_speedup": min_speedup, "machine": machine_signature()})
    cached = read_cache(CACHE).get(key) if key else None
    if cached is not None:
        choice = PrecisionChoice(**cached)
        return dataclasses.replace(choice, reason=f"{choice.reason}; measured by an earlier run on this machine")
    models = {}
    for policy in policies:
        with global_policy(policy):
            models[policy] = _compiled(build_model())
    rounds_of = alternated_rounds(models, _first_rows((x, y), batch_size), rounds, steps)
    choice = decide({policy: statistics.median(seconds) for policy, seconds in rounds_of.items()}, min_speedup)
    if key:
        write_cache(CACHE, key, choice.to_dict())
    return choice


def alternated_rounds(models: dict, batch: tuple, rounds: int = ROUNDS, steps: int = STEPS_PER_ROUND,
                      warmup_steps: int = WARMUP_STEPS,
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """`{name: [seconds per step of each round]}` of compiled `models`
    (`{name: model}`) on `batch` (`(x, y)`): `warmup_steps` untimed steps of
    each (the trace, the first run), then `rounds` rounds of `steps` steps of
    each, the models taking turns, in reverse order every other round: a
    drift in the machine's speed falls on every model alike."""
    x, y = batch
    for model in models.values():
        for _ in range(warmup_steps):
            model.train_on_batch(x, y)
    order, rounds_of = list(models), {name: [] for name in models}
    for number in range(rounds):
        for name in order if number % 2 == 0 else order[::-1]:
            began = clock()
            for _ in range(steps):
                models[name].train_on_batch(x, y)  # returns the loss as a number: the step has finished
            rounds_of[name].append((clock() - began) / steps)
    return rounds_of


def machine_signature() -> dict[str, Any]:
    """What a measured step time depends on besides the model: the devices,
    the cores this process may use, the backend and the library versions."""
    backend = keras.backend.backend()
    return {"cpu": cpu_model_name(), "cpu_units": sorted(cpu_flags() & set(_CPU_BF16_FLAGS)),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "gpus": _gpu_names(), "backend": backend, "versions": [keras.__version__, _version(backend)]}


def _gpu_names():
    if keras.backend.backend() == "jax":
        import jax

        return [device.device_kind for device in jax.devices() if device.platform == "gpu"]
    import tensorflow as tf

    return [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
            for gpu in tf.config.list_physical_devices("GPU")]


def _version(backend):
    try:
        return importlib.metadata.version(backend)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_rows(structure, rows):
    return keras.tree.map_structure(lambda array: None if array is None else array[:rows], structure)


def _compiled(model):
    if not getattr(model, "compiled", False):
        raise ValueError("`build_model` must return a compiled keras.Model. "
                         f"Received: {type(model).__name__} (not compiled)")
    return model
