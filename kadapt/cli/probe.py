"""`kadapt probe` (also `tools/probe_gpu.py`): list devices, their memory and
how TensorFlow runs on them; with `--model`, probe the largest micro-batch of
that model with real trial steps and print the plan for a logical batch."""

import json
import os
import sys
from pathlib import Path

from kadapt import environment
from kadapt.run.config import MODEL_NAMES as BUILTIN_MODELS
from kadapt.run.errors import UsageError
from kadapt.run.probe_text import budget_line
from kadapt.run.probe_text import check_probe_allocator
from kadapt.run.probe_text import trial_line
from kadapt.run.probe_text import trial_table

DEFAULT_INPUT_SHAPE = "28,28,1"


def add_probe_arguments(subparsers) -> None:
    parser = subparsers.add_parser(
        "probe", description=__doc__,
        help="probe the largest micro-batch that fits in memory and print the batch plan",
    )
    parser.add_argument("--model", default=None,
                        help=f"a .keras file (loaded in safe mode) or one of {', '.join(BUILTIN_MODELS)} "
                             "(default: none, print the device fact sheet only)")
    parser.add_argument("--input-shape", default=None,
                        help="input shape of a built-in model, without the batch axis, e.g. 32,32,3 (default: 28,28,1)")
    parser.add_argument("--num-classes", type=int, default=10, help="classes of a built-in model")
    parser.add_argument("--batch-size", type=int, default=512, help="the logical batch size to plan")
    parser.add_argument("--memory-budget", default=None,
                        help="simulate a smaller device, e.g. 2GiB (default: the device's)")
    parser.add_argument("--prefer", choices=("largest", "fastest"), default="largest")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.set_defaults(run=run_probe)


def run_probe(args) -> int:
    _check_arguments(args)
    model = load_model(args) if args.model is not None else None  # a bad file ends here, before any output
    budget = _budget(args.memory_budget)
    facts = {"devices": list_devices(), "tensorflow": environment.describe()}
    if not args.json:
        print_devices(facts["devices"], facts["tensorflow"])
    if model is not None:
        facts.update(_probe(model, budget, args))
    if args.json:
        print(json.dumps(facts, indent=1))
    return 0


def _probe(model, budget, args):
    """Probes `model` and prints the trials (to stderr with `--json`); returns
    `{"probe", "plan"}` for the JSON report."""
    import numpy as np

    import kadapt

    check_probe_allocator(budget.device)
    progress = sys.stderr if args.json else sys.stdout
    data = random_batch(model, 2 * args.batch_size, np.random.default_rng(0))
    print(budget_line(model.name, budget), file=progress, flush=True)
    result = kadapt.probe_micro_batch(
        model, data, memory_budget=args.memory_budget, prefer=args.prefer, max_micro_batch_size=args.batch_size,
        on_trial=lambda trial: print(trial_line(trial), file=progress, flush=True),
    )
    plan = result.plan(args.batch_size)
    if not args.json:
        print(trial_table(result))
        print(f"plan: {plan}")
    return {"probe": result.to_dict(), "plan": plan.__dict__}


def _budget(text):
    from kadapt.batching import memory_budget

    try:
        return memory_budget.device_budget(text)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error).replace("Argument `memory_budget`", "--memory-budget")) from None


def _check_arguments(args):
    """Raises `UsageError` for input that needs no TensorFlow to judge."""
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be a positive int (the logical batch to plan). "
                         f"Received: --batch-size={args.batch_size}")
    if args.model is None and args.input_shape is not None:
        raise UsageError(f"--input-shape describes a built-in --model: give --model too, e.g. "
                         f"--model mlp. Received: --input-shape={args.input_shape}")
    if args.model in BUILTIN_MODELS:
        parse_shape(args.input_shape or DEFAULT_INPUT_SHAPE)
    elif args.model is not None and (Path(args.model).suffix != ".keras" or not Path(args.model).is_file()):
        raise UsageError(f"--model must be an existing .keras file or one of {', '.join(BUILTIN_MODELS)}. "
                         f"Received: --model={args.model}")


def list_devices() -> list[dict]:
    """Devices with their total and used bytes, where TensorFlow can tell, and where each figure came from."""
    import tensorflow as tf

    from kadapt.batching import memory_budget

    devices = [gpu_facts(f"GPU:{index}") for index, _ in enumerate(tf.config.list_physical_devices("GPU"))]
    ram_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = memory_budget.available_ram()
    devices.append({"device": "CPU:0", "total_bytes": ram_total,
                    "used_bytes": ram_total - available, "source": "RAM",
                    "allocator_statistics": environment.allocator_statistics_available("CPU:0"),
                    "allocator": environment.describe()["cpu_allocator"]})
    return devices


def gpu_facts(name: str, list_limits=None) -> dict:
    """One GPU's line of the fact sheet: its pool (TensorFlow's `memory_limit`), NVML's total,
    the budget kadapt takes from them, and what its allocator's peaks count."""
    import tensorflow as tf

    from kadapt.batching.tensorflow import allocator_mode
    from kadapt.batching import gpu_memory
    from kadapt.batching import memory_budget

    try:
        capacity = gpu_memory.gpu_capacity(name, list_limits)
        total, source, nvml = capacity.pool_bytes, capacity.source, capacity.nvml_total_bytes
        budget = memory_budget.gpu_budget(name, list_limits).bytes
    except ValueError:
        total, source, nvml, budget = None, "unknown", gpu_memory.nvml_total(gpu_memory.device_index(name)), None
    mode = allocator_mode.allocator_mode(name)
    return {"device": name, "total_bytes": total, "used_bytes": tf.config.experimental.get_memory_info(name)["current"],
            "source": source, "nvml_total_bytes": nvml, "budget_bytes": budget, "allocator_statistics": True,
            "allocator": mode, "peaks_count": allocator_mode.COUNTS[mode]}


def gpu_line(device: dict) -> str:
    """`GPU:0 capacity 80.0 GiB (TensorFlow memory_limit), NVML total 80.0 GiB, ...`"""
    def gib(value):
        return "?" if value is None else f"{value / 2**30:.1f} GiB"

    nvml = "not installed or not found" if device["nvml_total_bytes"] is None else gib(device["nvml_total_bytes"])
    return (f"{device['device']} capacity {gib(device['total_bytes'])} ({device['source']}), NVML total {nvml}, "
            f"budget {gib(device['budget_bytes'])}; allocator {device['allocator']}: peaks count {device['peaks_count']}")


def print_devices(devices: list[dict], runtime: dict) -> None:
    print(f"{'device':8s} {'total MiB':>12s} {'used MiB':>12s}  {'statistics':10s}  {'allocator':33s}  source")
    for d in devices:
        total = "?" if d["total_bytes"] is None else f"{d['total_bytes'] / 2**20:.0f}"
        statistics = "yes" if d["allocator_statistics"] else "no"
        print(f"{d['device']:8s} {total:>12s} {d['used_bytes'] / 2**20:12.0f}  {statistics:10s}  "
              f"{d['allocator']:33s}  {d['source']}")
    for d in devices:
        if d["device"].startswith("GPU"):
            print(gpu_line(d))
    setting = f" ({runtime['onednn_variable']})" if runtime["onednn_variable"] else ""
    print(f"oneDNN CPU kernels: {runtime['onednn']}{setting}")


def load_model(args):
    """A compiled model: a `.keras` file (safe mode) or a built-in."""
    import keras

    from kadapt.saving import load_model as kadapt_load_model

    if args.model in BUILTIN_MODELS:
        shape = parse_shape(args.input_shape or DEFAULT_INPUT_SHAPE)
        model = builtin_model(args.model, shape, args.num_classes)
    else:
        try:
            model = kadapt_load_model(Path(args.model))
        except (ValueError, TypeError, OSError) as error:
            raise UsageError(f"--model {args.model} cannot be loaded: {' '.join(str(error).split())}") from None
    if not model.compiled:
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) <= 0:
        raise UsageError(
            f"--input-shape must be positive ints separated by commas, e.g. 28,28,1. Received: --input-shape={text}"
        )
    return shape


def builtin_model(name: str, input_shape: tuple[int, ...], num_classes: int):
    from kadapt.run.networks import build_model

    return build_model(name, input_shape, num_classes)


def random_batch(model, rows: int, rng) -> tuple:
    """Inputs and integer labels shaped for `model` (trial data: content is irrelevant)."""
    x = [rng.random((rows, *tensor.shape[1:]), dtype="float32") for tensor in model.inputs]
    classes = int(model.outputs[0].shape[-1])
    y = rng.integers(0, max(classes, 2), rows)
    return (x[0] if len(x) == 1 else x), y
