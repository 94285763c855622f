"""Samples per second of 1 JAX process against 2 (`kadapt.jax_processes`, gloo CPU collectives on
127.0.0.1), at the same global batch, and how far the 2 processes' weights are from the 1's.

The JAX counterpart of benchmarks/scale/multi_worker.py (TensorFlow's MultiWorkerMirroredStrategy). Both
arms train `kadapt.accumulate(small_cnn)` (Fashion-MNIST-shaped random rows) with SGD on the same
global batches of 2 x --batch rows in micro-batches of --batch rows (under a mesh a micro-batch
counts global rows: one per process then), --steps timed steps after --warmup; each process is
pinned to one CPU core of its own (`os.sched_setaffinity`) and XLA to one thread. Both arms are
started by `kadapt train --workers`' launcher (`kadapt.run.workers.launch_local_workers` with
`JaxWorkers`: Keras' `KERAS_DISTRIBUTION_*` variables): the 1-process arm is a one-process
`jax.distributed` run (the same code path, as TensorFlow's benchmark has a one-worker cluster);
the 2-process arm feeds each process its half of every batch (`process_rows`).
Scaling = samples/s(2) / samples/s(1) (ideal 2.0).

    python benchmarks/scale/multi_worker_jax.py                     # batch 128 per process, 20 timed steps
    python benchmarks/scale/multi_worker_jax.py --steps 5 --warmup 2
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128, help="rows per process per step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--output", default=None)
    parser.add_argument("--process", metavar="RESULTS", help=argparse.SUPPRESS)  # a process: its results' folder
    args = parser.parse_args()
    if args.process:
        return _process(args.process, args)
    figures = {"global_batch": 2 * args.batch, "micro_batch": args.batch, "timed_steps": args.steps}
    weights = {}
    for processes in (1, 2):
        results = _run(processes, args)
        seconds = max(r["seconds"] for r in results)
        figures[f"processes_{processes}"] = {"samples_per_second": round(2 * args.batch * args.steps / seconds, 1),
                                             "step_ms": round(1e3 * seconds / args.steps, 1)}
        weights[processes] = results[0]["weights"]
        print(f"{processes} process(es): {figures[f'processes_{processes}']}", flush=True)
    figures["scaling"] = round(figures["processes_2"]["samples_per_second"]
                               / figures["processes_1"]["samples_per_second"], 3)
    figures["max_weight_difference"] = max(
        max(abs(a - b) for a, b in zip(_flat(one), _flat(two))) for one, two in zip(weights[1], weights[2]))
    print(json.dumps(figures, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=1) + "\n")


def _flat(values):
    return [v for row in values for v in _flat(row)] if isinstance(values, list) else [values]


def _run(processes, args):
    from kadapt.run.workers import JaxWorkers
    from kadapt.run.workers import launch_local_workers

    os.environ.update(KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",  # the processes' environment
                      XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    with tempfile.TemporaryDirectory() as folder:
        common = ["--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        code = launch_local_workers(processes, [*common, "--process", folder], setup=JaxWorkers,
                                    command=[sys.executable, __file__])
        if code != 0:
            raise SystemExit(f"a process failed (exit code {code})")
        return [json.loads((Path(folder) / f"process-{index}.json").read_text()) for index in range(processes)]


def _process(results, args):
    from kadapt import jax_processes

    group = jax_processes.cluster_from_environment()  # set by the launcher
    os.sched_setaffinity(0, {group.index % os.cpu_count()})
    jax_processes.initialize_processes(group)
    import keras
    import numpy as np

    import kadapt

    rows = 2 * args.batch * (args.steps + args.warmup)
    rng = np.random.default_rng(0)
    x = rng.random((rows, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, rows).astype("int32")
    x, y = (jax_processes.process_rows(a, 2 * args.batch, group) for a in (x, y))
    keras.utils.set_random_seed(0)
    model = kadapt.accumulate(kadapt.models.small_cnn(), micro_batch_size=args.batch)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == args.warmup:
                self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            self.seconds = time.perf_counter() - self.start

    clock = Clock()
    model.fit(x, y, batch_size=2 * args.batch // group.count, epochs=1, shuffle=False,
              verbose=0, callbacks=[clock])
    weights = [w.tolist() for w in model.get_weights()]
    result = {"seconds": clock.seconds, "weights": weights}
    (Path(results) / f"process-{group.index}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
