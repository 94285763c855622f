"""Five minutes on a GPU: what kadapt assumes about it, checked, in one JSON.

    .venv/bin/python benchmarks/gpu/gpu_check.py [OUT.json]   (default benchmarks/gpu_check.json)

Each part runs in a fresh process (a logical `memory_limit` must be set
before TensorFlow creates its devices; an out-of-memory may leave the
allocator fragmented), prints one JSON object, and is collected under its
name; a part that fails or times out is recorded as such and the rest go on.

- devices: TensorFlow/Keras versions, the GPUs, kadapt's fact sheet for each
  (pool from TensorFlow's memory_limit, NVML total, budget, allocator mode),
  the default budget and its source;
- memory_info: whether `get_memory_info` moves by 1 GiB for a 1 GiB tensor;
- oom_*: the exception class, message and seconds of each out-of-memory form
  on a GPU limited to 4 GiB: too much in eager, in a tf.function, under
  jit_compile, and a host-to-device copy larger than the pool;
- probe_4gib / probe_4gib_fresh: the probe under a logical memory_limit of
  4 GiB, then the chosen size trained in a fresh process (peaks of the first
  and second step against the budget);
- recovery_xla / recovery_plain: training started at 1.5x the size that
  fits, with and without XLA, and its weights against a run at the final size;
- step_mixed_float16 / step_mixed_bfloat16: one accumulated step.

Without a GPU it says so in one line and exits 2.
"""

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LIMIT_MIB = 4096  # the logical memory_limit of the limited parts
GiB = 2**30
INPUT_SHAPE = (64, 64, 3)
LOGICAL_BATCH = 4096
PART_TIMEOUT_SECONDS = {"recovery_xla": 150, "recovery_plain": 150}  # seconds; others 90
PARTS = ("devices", "memory_info", "oom_eager", "oom_function", "oom_xla", "oom_copy",
         "probe_4gib", "probe_4gib_fresh", "recovery_xla", "recovery_plain",
         "step_mixed_float16", "step_mixed_bfloat16")


def load_tensorflow(limit_mib=None):
    from kadapt import environment

    tf = environment.load_tensorflow()
    gpus = tf.config.list_physical_devices("GPU")
    if limit_mib and gpus:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)])
    return tf


def part_devices():
    tf = load_tensorflow()
    import keras
    from kadapt.batching.memory_budget import device_budget
    from kadapt.cli.probe import gpu_facts

    gpus = tf.config.list_physical_devices("GPU")
    budget = device_budget()
    return {
        "tensorflow": tf.__version__, "keras": keras.__version__,
        "environment": {name: os.environ.get(name) for name in (
            "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_GPU_ALLOCATOR", "TF_FORCE_GPU_ALLOW_GROWTH")},
        "gpus": [{**tf.config.experimental.get_device_details(gpu), **gpu_facts(f"GPU:{i}")}
                 for i, gpu in enumerate(gpus)],
        "budget": {"bytes": budget.bytes, "device": budget.device, "source": budget.source},
    }


def part_memory_info():
    tf = load_tensorflow()
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    with tf.device("GPU:0"):
        tensor = tf.zeros([GiB // 4], tf.float32)
    after = tf.config.experimental.get_memory_info("GPU:0")["current"]
    del tensor
    freed = tf.config.experimental.get_memory_info("GPU:0")["current"]
    moved = after - before
    return {"before": before, "after": after, "after_del": freed, "moved_bytes": moved,
            "moves_by_1_gib": abs(moved - GiB) <= 2**20}


def oom(attempt):
    """Runs `attempt` on a GPU limited to `LIMIT_MIB`; the exception it raised, and when."""
    tf = load_tensorflow(LIMIT_MIB)
    elements = 3 * LIMIT_MIB * 2**20 // 8  # float32: 1.5x the pool, and under int32's 2**31 elements
    start = time.perf_counter()
    try:
        with tf.device("GPU:0"):
            attempt(tf, elements)
    except Exception as error:  # recording what each form raises is the point
        return {"raised": True, "class": f"{type(error).__module__}.{type(error).__name__}",
                "message": str(error).strip().splitlines()[0][:400] if str(error).strip() else "",
                "seconds": round(time.perf_counter() - start, 2), "is_kadapt_oom": kadapt_judges_oom(error)}
    return {"raised": False, "seconds": round(time.perf_counter() - start, 2)}


def kadapt_judges_oom(error):
    try:
        from kadapt.batching.out_of_memory import is_out_of_memory
    except ImportError:
        return None
    return bool(is_out_of_memory(error))


def part_oom_eager():
    return oom(lambda tf, n: tf.random.uniform([n]))


# The big tensor is the function's output: XLA would fuse a reduction of it
# into one kernel and never allocate it.
def part_oom_function():
    return oom(lambda tf, n: tf.function(lambda: tf.random.uniform([n]) + 1.0)())


def part_oom_xla():
    return oom(lambda tf, n: tf.function(lambda: tf.random.uniform([n]) + 1.0, jit_compile=True)())


def part_oom_copy():
    import numpy as np

    def copy(tf, n):
        with tf.device("CPU:0"):
            host = tf.constant(np.ones(n, np.float32))
        tf.identity(host)  # placed on GPU:0: a host-to-device copy of 1.5x the pool

    return oom(copy)


def build(jit_compile=True, micro_batch_size=None, max_oom_retries=8):
    """small_cnn on 64x64x3, compiled as Keras would run it (XLA unless told)."""
    import keras

    import kadapt
    from kadapt.run.networks import build_model

    keras.utils.set_random_seed(0)
    model = build_model("small_cnn", INPUT_SHAPE, 10)
    if micro_batch_size is not None:
        model = kadapt.accumulate(model, micro_batch_size, max_oom_retries=max_oom_retries)
    model.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(rows):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((rows, *INPUT_SHAPE), dtype=np.float32), rng.integers(0, 10, rows)


def probe_size():
    import kadapt

    result = kadapt.probe_micro_batch(build(), data(LOGICAL_BATCH), max_micro_batch_size=LOGICAL_BATCH)
    return result


def part_probe_4gib():
    load_tensorflow(LIMIT_MIB)
    start = time.perf_counter()
    result = probe_size()
    return {**result.to_dict(), "seconds": round(time.perf_counter() - start, 2)}


def part_probe_4gib_fresh(size):
    tf = load_tensorflow(LIMIT_MIB)
    from kadapt.batching.memory_budget import device_budget

    x, y = data(size)
    model = build(micro_batch_size=size)
    peaks = []
    for _ in range(2):  # the first step compiles (XLA autotuning included)
        tf.config.experimental.reset_memory_stats("GPU:0")
        model.fit(x, y, batch_size=size, epochs=1, verbose=0, shuffle=False)
        peaks.append(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    budget = device_budget()
    return {"micro_batch_size": size, "peaks": peaks, "budget": budget.bytes, "budget_source": budget.source,
            "within_budget": [peak <= budget.bytes for peak in peaks], "oom_events": len(model.oom_events)}


def part_recovery(jit_compile):
    import numpy as np

    load_tensorflow(LIMIT_MIB)
    fits = probe_size().micro_batch_size
    start = int(1.5 * fits)
    x, y = data(2 * start)
    recovering = build(jit_compile, start)
    began = time.perf_counter()
    recovering.fit(x, y, batch_size=start, epochs=1, verbose=0, shuffle=False)
    seconds = time.perf_counter() - began
    final = recovering.micro_batch_size
    reference = build(jit_compile, final, max_oom_retries=0)
    reference.fit(x, y, batch_size=start, epochs=1, verbose=0, shuffle=False)
    worst = max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-12))
                for a, b in zip(reference.get_weights(), recovering.get_weights()))
    return {"jit_compile": jit_compile, "fits": fits, "started_at": start, "final_micro_batch_size": final,
            "oom_events": [list(event) for event in recovering.oom_events], "seconds": round(seconds, 2),
            "max_relative_weight_difference": worst}


def part_step(policy):
    load_tensorflow()
    import keras
    import numpy as np

    keras.mixed_precision.set_global_policy(policy)
    x, y = data(256)
    model = build(micro_batch_size=64)
    began = time.perf_counter()
    history = model.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False)
    loss = float(history.history["loss"][-1])
    return {"policy": policy, "loss": loss, "finite": bool(np.isfinite(loss)),
            "seconds_with_compile": round(time.perf_counter() - began, 2)}


def run_part(name, argument=None):
    """Runs part `name` in a fresh process; its JSON, or what went wrong."""
    command = [sys.executable, __file__, "--part", name] + ([] if argument is None else [str(argument)])
    began, timeout = time.perf_counter(), PART_TIMEOUT_SECONDS.get(name, 90)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit code {done.returncode}", "stderr_tail": done.stderr[-2000:]}
    return {**json.loads(lines[-1]), "part_seconds": round(time.perf_counter() - began, 1)}


def run_one(name, argument):
    parts = {
        "devices": part_devices, "memory_info": part_memory_info, "oom_eager": part_oom_eager,
        "oom_function": part_oom_function, "oom_xla": part_oom_xla, "oom_copy": part_oom_copy,
        "probe_4gib": part_probe_4gib, "probe_4gib_fresh": lambda: part_probe_4gib_fresh(int(argument)),
        "recovery_xla": lambda: part_recovery(True), "recovery_plain": lambda: part_recovery(False),
        "step_mixed_float16": lambda: part_step("mixed_float16"),
        "step_mixed_bfloat16": lambda: part_step("mixed_bfloat16"),
    }
    try:
        result = parts[name]()
    except Exception as error:  # one part's failure is a finding, not the end of the check
        result = {"error": f"{type(error).__name__}: {error}"[:2000], "traceback": traceback.format_exc()[-3000:]}
    print(json.dumps(result, default=str))


def has_gpu():
    tf = load_tensorflow()
    return bool(tf.config.list_physical_devices("GPU"))


def main(argv):
    if argv[:1] == ["--part"]:
        run_one(argv[1], argv[2] if len(argv) > 2 else None)
        return 0
    if not has_gpu():
        print("gpu_check: TensorFlow sees no GPU here (tf.config.list_physical_devices('GPU') is empty): "
              "run it on a machine with a GPU.", file=sys.stderr)
        return 2
    out = Path(argv[0] if argv else Path(__file__).with_name("gpu_check.json"))
    report = {}
    for name in PARTS:
        if name == "probe_4gib_fresh":
            size = report["probe_4gib"].get("micro_batch_size")
            report[name] = run_part(name, size) if size else {"error": "no size from probe_4gib"}
        else:
            report[name] = run_part(name)
        print(f"gpu_check: {name}: {'error' if 'error' in report[name] else 'done'}", file=sys.stderr, flush=True)
        out.write_text(json.dumps(report, indent=1, default=str))  # a partial report survives a kill
    print(f"gpu_check: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
