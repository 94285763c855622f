"""Numerics chosen by measurement: float32, bfloat16 or float16 for this device.

`choose_precision` times a few training steps of the actual model under each
Keras dtype policy the device has units for (`supported_policies`) and keeps
the fastest one that beats float32 by at least `min_speedup` (1.15x), else
float32: the gain depends on the CPU (benchmarks/README.md#precision_step),
and a CPU without BF16 units emulates bfloat16 and loses time. The variables stay float32 under every policy (Keras' mixed
precision); `"mixed_float16"` scales the loss (Keras wraps the optimizer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras

from kadapt.validation import check_range

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
MIN_SPEEDUP = 1.15
NO_UNITS = "this device has no bfloat16 or float16 units"
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


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
    try:
        with open(path) as file:
            for line in file:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


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


def choose_precision(build_model: Callable[[], keras.Model], x: Any, y: Any = None, batch_size: int = 256,
                     steps: int = 5, min_speedup: float = MIN_SPEEDUP,
                     policies: Sequence[str] | None = None) -> PrecisionChoice:
    """Times the model under each supported dtype policy and chooses one.

    With float32 the only candidate nothing is timed. Otherwise, for each
    policy, `build_model()` is called with it as Keras' global
    policy, and `steps` training steps of one batch are timed (after two
    untimed: the trace and the first run); the median step decides. The
    global policy is restored afterwards: set the chosen one before building
    the model you train.

    Args:
        build_model: Callable returning a fresh compiled `keras.Model`, built
            under the global policy at the time of the call.
        x, y: A batch source: arrays (or a dict of arrays) with at least
            `batch_size` rows; `y` may be `None` for models without targets.
        batch_size: Positive int. Rows per timed step. Defaults to `256`.
        steps: Positive int. Timed steps per policy. Defaults to `5`.
        min_speedup: Float >= 1. How much faster than float32 a policy must
            be to be chosen. Defaults to `1.15`.
        policies: List of policy names to try, or `None` for
            `supported_policies()`. Defaults to `None`.

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
    check_range("min_speedup", min_speedup, low=1.0)
    policies = supported_policies() if policies is None else [policy_name(p) for p in policies]
    if "float32" not in policies:
        policies = ["float32"] + list(policies)
    if policies == ["float32"]:
        return PrecisionChoice("float32", {}, NO_UNITS)  # nothing to compare: no time spent
    batch = _first_rows((x, y), batch_size)
    timings = {}
    for policy in policies:
        with global_policy(policy):
            timings[policy] = _seconds_per_step(build_model(), batch, steps)
    return decide(timings, min_speedup)


def _first_rows(structure, rows):
    return keras.tree.map_structure(lambda array: None if array is None else array[:rows], structure)


def _seconds_per_step(model, batch, steps):
    if not getattr(model, "compiled", False):
        raise ValueError("`build_model` must return a compiled keras.Model. "
                         f"Received: {type(model).__name__} (not compiled)")
    x, y = batch
    for _ in range(2):
        model.train_on_batch(x, y)
    seconds = []
    for _ in range(steps):
        began = time.perf_counter()
        model.train_on_batch(x, y)  # returns the loss as a number: the step has finished
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)
