"""Five minutes on a GPU with JAX only: kadapt's JAX memory plan against the device, in one JSON.

    python benchmarks/gpu/gpu_check_jax.py [OUT.json]   (default gpu_check_jax.json)

Needs JAX (with CUDA on a GPU) and the wheels of keras, keras-tuner and kadapt
(benchmarks/gpu/gpu_check_jax.sh builds them); no TensorFlow, no network. Each part
runs in a fresh process and prints one JSON object; a part that fails or times
out is recorded as such and the rest go on. Without a GPU it runs what the
CPU allows and says so (`"device": "cpu", "gpu": false`).

- plan_vs_measured: `step_plan` at SIZES rows against the measured step.
  JAX cannot reset `peak_bytes_in_use`, so sizes run in ascending order in one
  process and each step's own peak is read as the rise of the peak over what
  was in use before the step, plus the step's arguments (in use already);
  `censored` where an earlier, higher peak hid it (kadapt's `measure_step`).
  The CPU reports no statistics: plans only.
- probe_4gib / probe_4gib_fresh: the plan-based probe under a 4 GiB budget, then
  a FRESH process training at the chosen size (plain `fit`, TRAIN_STEPS steps)
  and its `peak_bytes_in_use` against 4 GiB.
- recovery: NEEDS kadapt's accumulating JAX step (`kadapt.accumulate(...,
  max_oom_retries=...)` on JAX). An accumulating model starting above the size
  that fits gets RESOURCE_EXHAUSTED (real on a GPU, from a process whose XLA
  pool is RECOVERY_POOL_FRACTION of the device; injected on the CPU by a layer
  that raises above INJECTED_OOM_ROWS rows), retries smaller; its weights
  against a run at the final size.
- exactness: NEEDS the accumulating JAX step. 4 micro-batches against one batch
  of plain Keras: the largest relative weight difference after EXACT_STEPS steps.
- meta_observation: the MetaAdjuster's observation reduced on the device
  (`kadapt.meta.observe.device_observer`, which an accelerator takes by default) against
  the host read, on an MLP of META_WIDTH-wide hidden layers: the median of
  META_CALLS calls of each, and fits of META_STEPS steps observed every 10 steps
  (no adjuster / host read / device), interleaved, META_ROUNDS rounds after one
  to compile. On the CPU the device path is forced (there the host read is
  kept), on a narrower MLP.
"""

import json
import os
import subprocess
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "jax")

GiB = 2**30
BUDGET = "4GiB"
GPU_SIZES = (512, 2048, 4096, 8192)
CPU_SIZES = (16, 32, 64, 128)
LOGICAL_BATCH = 8192  # the probe's largest size worth having
TRAIN_STEPS = 3
RECOVERY_POOL_FRACTION = "0.02"  # of an H200's ~139 GiB: ~2.8 GiB, under the first micro-batch's plan
RECOVERY_BATCH, RECOVERY_FIRST_MICRO = 4096, 4096
INJECTED_OOM_ROWS = 24  # the CPU's injected limit
CPU_RECOVERY_BATCH, CPU_RECOVERY_FIRST_MICRO = 64, 64
EXACT_BATCH, EXACT_MICRO, EXACT_STEPS = 64, 16, 3
META_WIDTH, CPU_META_WIDTH = 2048, 256  # 2048: 5.8M weights, where the host read cost 25 ms on a CPU
META_CALLS, META_STEPS, META_BATCH, META_ROUNDS = 30, 200, 128, 3
PART_TIMEOUT_SECONDS = 150  # a 2-core CPU host takes ~30 s to import alone
PARTS = ("devices", "plan_vs_measured", "probe_4gib", "probe_4gib_fresh", "recovery", "exactness",
         "meta_observation")


def on_gpu():
    import jax

    return jax.devices()[0].platform == "gpu"


def compiled(build=None, seed=0):
    import keras

    import kadapt

    keras.utils.set_random_seed(seed)
    model = (build or kadapt.models.small_cnn)()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def images(rows, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.random((rows, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, rows).astype("int32")


def part_devices():
    import jax
    import keras

    return {"jax": jax.__version__, "keras": keras.__version__, "backend": keras.backend.backend(),
            "devices": [str(d) for d in jax.devices()], "device_kind": jax.devices()[0].device_kind,
            "memory_stats": jax.devices()[0].memory_stats()}


def part_plan_vs_measured():
    from kadapt.batching.jax.memory_plan import step_plan
    from kadapt.batching.jax.probe import measure_step

    rows = []
    for size in (GPU_SIZES if on_gpu() else CPU_SIZES):
        model = compiled()
        sample = images(size)
        plan = step_plan(model, sample)
        row = {"rows": size, "plan_peak_bytes": plan.peak_bytes, "plan": plan.__dict__}
        if on_gpu():
            measured, process_peak = measure_step(model, sample + (None,), plan, size, None)
            row.update(measured_peak_bytes=measured, process_peak_bytes=process_peak,
                       censored=measured is None,
                       measured_over_plan=None if measured is None else measured / plan.peak_bytes)
        rows.append(row)
    return {"sizes": rows, "measured": on_gpu()}


def part_probe_4gib():
    from kadapt.batching.jax.probe import probe_micro_batch_jax

    began = time.perf_counter()
    result = probe_micro_batch_jax(compiled(), images(LOGICAL_BATCH), memory_budget=BUDGET)
    chosen = [t for t in result.trials if t.micro_batch_size == result.micro_batch_size][-1]
    return {"micro_batch_size": result.micro_batch_size, "seconds": time.perf_counter() - began,
            "planned": [[t.micro_batch_size, t.peak_bytes] for t in result.trials],
            "chosen_plan_peak_bytes": chosen.peak_bytes, "measured_peak_bytes": chosen.measured_peak_bytes,
            "process_peak_bytes": chosen.process_peak_bytes}


def part_probe_4gib_fresh(size):
    import jax

    model = compiled()
    x, y = images(size * TRAIN_STEPS)
    model.fit(x, y, batch_size=size, epochs=1, verbose=0)
    stats = jax.devices()[0].memory_stats()
    if stats is None:
        return {"micro_batch_size": size, "peak_bytes_in_use": None, "note": "no memory_stats on the CPU"}
    peak = int(stats["peak_bytes_in_use"])
    return {"micro_batch_size": size, "peak_bytes_in_use": peak, "budget_bytes": 4 * GiB,
            "within_budget": peak <= 4 * GiB}


class InjectedOutOfMemory:
    """A layer that raises XLA's RESOURCE_EXHAUSTED when traced above `rows` rows (the CPU's stand-in)."""

    @staticmethod
    def build(rows):
        import jax
        import keras

        class Layer(keras.layers.Layer):
            def call(self, inputs, training=None):
                # Only the train step: Keras builds the model by a call at the full batch.
                if training and isinstance(inputs.shape[0], int) and inputs.shape[0] > rows:
                    raise jax.errors.JaxRuntimeError(
                        f"RESOURCE_EXHAUSTED: Out of memory allocating {inputs.shape[0]} rows (injected)")
                return inputs

            def compute_output_shape(self, input_shape):
                return input_shape

        return Layer()


def recovery_model(seed, inject):
    import keras

    import kadapt

    def build():
        layers = [keras.Input((28, 28, 1))]
        layers += [InjectedOutOfMemory.build(INJECTED_OOM_ROWS)] if inject else []
        return keras.Sequential(layers + kadapt.models.small_cnn().layers)

    return compiled(build, seed)


def part_recovery():
    import numpy as np

    import kadapt

    gpu = on_gpu()
    batch, first = (RECOVERY_BATCH, RECOVERY_FIRST_MICRO) if gpu else (CPU_RECOVERY_BATCH, CPU_RECOVERY_FIRST_MICRO)
    x, y = images(batch * TRAIN_STEPS)
    model = kadapt.accumulate(recovery_model(0, not gpu), first, max_oom_retries=8)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    final = model.micro_batch_size
    reference = kadapt.accumulate(recovery_model(0, not gpu), final, max_oom_retries=0)
    reference.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return {"form": "real" if gpu else "injected", "first_micro_batch": first, "final_micro_batch": final,
            "oom_events": [list(e) for e in getattr(model, "oom_events", ())],
            "max_abs_weight_difference": max(float(np.max(np.abs(a - b))) for a, b in
                                             zip(model.get_weights(), reference.get_weights()))}


def part_exactness():
    import numpy as np

    import kadapt

    x, y = images(EXACT_BATCH * EXACT_STEPS)
    plain = compiled()
    plain.fit(x, y, batch_size=EXACT_BATCH, epochs=1, shuffle=False, verbose=0)
    accumulated = kadapt.accumulate(compiled(), EXACT_MICRO)
    accumulated.fit(x, y, batch_size=EXACT_BATCH, epochs=1, shuffle=False, verbose=0)
    relative = [float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-12))
                for a, b in zip(plain.get_weights(), accumulated.get_weights())]
    return {"micro_batches": EXACT_BATCH // EXACT_MICRO, "steps": EXACT_STEPS,
            "max_relative_weight_difference": max(relative)}


def meta_model(width):
    import keras

    import kadapt

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=kadapt.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def median_ms(function, calls):
    import statistics

    function()
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def part_meta_observation():
    import statistics

    import numpy as np

    import kadapt
    from kadapt.meta import Trigger
    from kadapt.meta.model.features import FeatureHistory
    from kadapt.meta.observe import device_observer
    from kadapt.meta.observe.host_reads import read_model
    from kadapt.meta.observe.observation import observe_model

    if not on_gpu():
        device_observer.CPU_BACKENDS, device_observer.DEVICE_FROM = ("jax",), 0
    width = META_WIDTH if on_gpu() else CPU_META_WIDTH
    rng = np.random.default_rng(0)
    x = rng.random((META_STEPS * META_BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, len(x)).astype("int32")
    model = meta_model(width)
    model.fit(x[:META_BATCH], y[:META_BATCH], batch_size=META_BATCH, verbose=0)
    history, observer = FeatureHistory(), device_observer.DeviceObserver(model)
    calls = {"host_ms": median_ms(lambda: history.observe(observe_model(
                 model, 1, 1.0, None, 0.5, 100, None, read_model(model))), META_CALLS),
             "device_ms": median_ms(lambda: (observer.observe(), observer.snapshot(0)), META_CALLS)}

    class Silent(Trigger):
        def update(self, loss):
            super().update(loss)
            return None

    attach = device_observer.DeviceObserver.attach
    arms = {"without": None, "host": lambda model: None, "device": attach}
    models = {name: meta_model(width) for name in arms}
    seconds = {name: [] for name in arms}
    for round_index in range(META_ROUNDS + 1):
        for name, chooser in arms.items():
            callbacks = []
            if chooser is not None:
                device_observer.DeviceObserver.attach = chooser
                callbacks = [kadapt.MetaAdjuster(check_every=10, trigger=Silent(), monitor="loss", verbose=0)]
            began = time.perf_counter()
            models[name].fit(x, y, batch_size=META_BATCH, epochs=1, verbose=0, callbacks=callbacks)
            if round_index:  # round 0 compiles
                seconds[name].append(time.perf_counter() - began)
    device_observer.DeviceObserver.attach = attach
    ratios = {name: statistics.median(a / b for a, b in zip(seconds[name], seconds["without"]))
              for name in ("host", "device")}
    return {"weights": model.count_params(), "per_call": calls, "steps_per_fit": META_STEPS,
            "ms_per_step_without": 1000 * statistics.median(seconds["without"]) / META_STEPS,
            "fit_time_ratio_every_10_steps": ratios, "device_forced": not on_gpu()}


def run_part(name, argument=None):
    """Runs part `name` in a fresh process; its JSON, or what went wrong."""
    command = [sys.executable, __file__, "--part", name] + ([] if argument is None else [str(argument)])
    environment = dict(os.environ)
    if name == "recovery":
        environment.update(XLA_PYTHON_CLIENT_MEM_FRACTION=RECOVERY_POOL_FRACTION)
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PART_TIMEOUT_SECONDS,
                              env=environment)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {PART_TIMEOUT_SECONDS} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit code {done.returncode}", "stderr_tail": done.stderr[-2000:]}
    return {**json.loads(lines[-1]), "part_seconds": round(time.perf_counter() - began, 1)}


def run_one(name, argument):
    parts = {"devices": part_devices, "plan_vs_measured": part_plan_vs_measured,
             "probe_4gib": part_probe_4gib, "probe_4gib_fresh": lambda: part_probe_4gib_fresh(int(argument)),
             "recovery": part_recovery, "exactness": part_exactness, "meta_observation": part_meta_observation}
    try:
        result = parts[name]()
    except Exception as error:  # recorded in the JSON: the other parts still run
        result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
    print(json.dumps(result, default=str))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--part":
        run_one(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
        return
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_check_jax.json"
    report = {"devices": run_part("devices")}
    kinds = report["devices"].get("devices", ["?"])
    report["gpu"] = any("cuda" in d.lower() or "gpu" in d.lower() for d in kinds)
    report["device"] = "gpu" if report["gpu"] else "cpu"
    if not report["gpu"]:
        report["note"] = "no GPU: plans only (the CPU reports no memory_stats), recovery injected"
    report["plan_vs_measured"] = run_part("plan_vs_measured")
    report["probe_4gib"] = run_part("probe_4gib")
    chosen = report["probe_4gib"].get("micro_batch_size")
    report["probe_4gib_fresh"] = run_part("probe_4gib_fresh", chosen) if chosen else {"error": "no size"}
    report["recovery"] = run_part("recovery")
    report["exactness"] = run_part("exactness")
    report["meta_observation"] = run_part("meta_observation")
    with open(out, "w") as file:
        json.dump(report, file, indent=1, default=str)
    print(json.dumps({k: v for k, v in report.items() if k != "devices"}, indent=1, default=str)[:4000])


if __name__ == "__main__":
    main()
