"""Samples per second of 1 worker x 1 thread against 2 workers x 1 thread each, at the same
per-worker batch, under `tf.distribute.MultiWorkerMirroredStrategy` on this machine.

Both arms train `kadapt.accumulate(small_cnn)` (Fashion-MNIST-shaped rows, 2 micro-batches per
worker per step) with SGD for --steps timed steps after --warmup steps; each worker process is
pinned to one intra-op and one inter-op thread. Each worker reads only its own rows
(`strategy.distribute_datasets_from_function`, batched by its share): a dataset handed to `fit`
whole is read and batched in full on every worker and then sharded, which on this 2-core machine
cost the 2-worker arm much of its scaling (benchmarks/README.md#multi_worker). The 1-worker arm is a one-worker cluster (the same
code path); the 2-worker arm is two processes on 127.0.0.1 with a global batch of 2 x the
per-worker batch; both are started by `kadapt train --workers`' launcher
(`kadapt.run.workers.launch_local_workers`, which sets each worker's TF_CONFIG).
Scaling = samples/s(2 workers) / samples/s(1 worker) (ideal 2.0, target >= 1.7).

Where the rest goes: each worker also times, after training, --steps all-reduces of tensors the
size of the model's gradients (the collective a step runs) and reports the mean per step.

    python benchmarks/scale/multi_worker.py                   # per-worker batch 256, 30 timed steps
    python benchmarks/scale/multi_worker.py --steps 5 --warmup 2   # a quick look
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
    parser.add_argument("--batch", type=int, default=256, help="rows per worker per step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--output", default=None)
    parser.add_argument("--worker", metavar="RESULTS", help=argparse.SUPPRESS)  # a worker: its results' folder
    args = parser.parse_args()
    if args.worker:
        return _worker(args.worker, args)
    figures = {"per_worker_batch": args.batch, "timed_steps": args.steps}
    for workers in (1, 2):
        results = _cluster(workers, args)
        figures[f"workers_{workers}"] = {
            "samples_per_second": round(workers * args.batch * args.steps / max(r["seconds"] for r in results), 1),
            "step_ms": round(1e3 * max(r["seconds"] for r in results) / args.steps, 1),
            "all_reduce_ms": round(max(r["all_reduce_seconds"] for r in results) * 1e3 / args.steps, 2),
        }
        print(f"{workers} worker(s): {figures[f'workers_{workers}']}", flush=True)
    figures["scaling"] = round(figures["workers_2"]["samples_per_second"] / figures["workers_1"]["samples_per_second"], 3)
    print(json.dumps(figures, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=1) + "\n")


def _cluster(workers, args):
    from kadapt.run.workers import TensorFlowWorkers  # here: a worker configures TensorFlow before it loads
    from kadapt.run.workers import launch_local_workers

    os.environ.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")  # the workers' (CPU) environment
    with tempfile.TemporaryDirectory() as folder:
        common = ["--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        code = launch_local_workers(workers, [*common, "--worker", folder], setup=TensorFlowWorkers,
                                    command=[sys.executable, __file__])
        if code != 0:
            raise SystemExit(f"a worker failed (exit code {code})")
        return [json.loads((Path(folder) / f"worker-{index}.json").read_text()) for index in range(workers)]


def _worker(results, args):
    cluster = json.loads(os.environ["TF_CONFIG"])  # set by the launcher
    index, workers = cluster["task"]["index"], len(cluster["cluster"]["worker"])
    from kadapt import environment

    environment.configure_tensorflow()
    import keras
    import numpy as np
    import tensorflow as tf

    import kadapt

    environment.set_cpu_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rows = workers * args.batch * (args.steps + args.warmup)
    rng = np.random.default_rng(0)
    x = rng.random((rows, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, rows).astype("int32")
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = kadapt.accumulate(kadapt.models.small_cnn(), micro_batch_size=args.batch // 2)
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    def worker_batches(context):
        # Each worker reads only its own rows, batched by its share (the input pipeline of a
        # dataset distributed by Keras would read and batch all rows on every worker).
        rows = tf.data.Dataset.from_tensor_slices((x, y)).shard(context.num_input_pipelines,
                                                                context.input_pipeline_id)
        return rows.batch(context.get_per_replica_batch_size(workers * args.batch)).prefetch(2)

    dataset = strategy.distribute_datasets_from_function(worker_batches)

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == args.warmup:
                self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            self.seconds = time.perf_counter() - self.start

    clock = Clock()
    model.fit(dataset, epochs=1, steps_per_epoch=args.steps + args.warmup, verbose=0, callbacks=[clock])
    gradients = [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables]

    @tf.function
    def all_reduce():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", gradients))

    all_reduce()
    start = time.perf_counter()
    for _ in range(args.steps):
        tf.nest.map_structure(lambda t: t.numpy(), strategy.experimental_local_results(all_reduce()))
    result = {"seconds": clock.seconds, "all_reduce_seconds": time.perf_counter() - start}
    (Path(results) / f"worker-{index}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
