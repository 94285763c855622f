"""A step's peak memory and speed on the CPU with TensorFlow's default inter-op threads and with one
(issue 68, item 1): does one inter-op thread make the peak hold still, and what does it cost?

Per model and arm, PROCESSES fresh processes (the arms alternated) each train STEPS steps of ROWS rows
with `fit` (kadapt.accumulate at one micro-batch, as a probe's trial and training run it), reading
every step's peak on CPU:0 (`get_memory_info`, reset before each step) and its wall time; the first
WARMUP steps (the trace) are left out. Printed per arm: the peaks' min / median / max over every
process, the spread (max / min), and the median step time; then the cost (default's steps per second
over one thread's).

    .venv/bin/python benchmarks/probe/interop_peak.py        # ~3 minutes on 2 cores
"""

import multiprocessing
import os
import statistics
import time

PROCESSES, STEPS, WARMUP = 3, 24, 4
MIB = 2**20


def conv_pool_dropout():
    from benchmark_models import conv_pool_dropout  # Keras loads after the threads are set

    return conv_pool_dropout()


def small_cnn():
    import kadapt

    return kadapt.models.small_cnn()


MODELS = {"small_cnn": (small_cnn, 147), "conv_pool_dropout": (conv_pool_dropout, 128)}


def measure(name, one_thread):
    """In a fresh process: `{"peaks": [bytes per step], "seconds": [per step]}`."""
    from kadapt import environment

    tf = environment.load_tensorflow()
    if one_thread:
        tf.config.threading.set_inter_op_parallelism_threads(1)  # before the first op
    import keras
    import numpy as np

    import kadapt

    build, rows = MODELS[name]
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = kadapt.accumulate(model, rows)
    rng = np.random.default_rng(0)
    x = rng.random((rows * (STEPS + WARMUP), *model.inputs[0].shape[1:]), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    peaks, seconds = [], []

    class Steps(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            tf.config.experimental.reset_memory_stats("CPU:0")
            self.began = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds.append(time.perf_counter() - self.began)
            peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])

    trainer.fit(x, y, batch_size=rows, epochs=1, verbose=0, shuffle=False, callbacks=[Steps()])
    return {"peaks": peaks[WARMUP:], "seconds": seconds[WARMUP:]}


def in_fresh_process(function, *args):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def main():
    print(f"cpu: {os.cpu_count()} cores; {PROCESSES} processes an arm, {STEPS} steps each after {WARMUP}")
    for name, (_, rows) in MODELS.items():
        results = {False: [], True: []}
        for _ in range(PROCESSES):
            for one_thread in (False, True):
                results[one_thread].append(in_fresh_process(measure, name, one_thread))
        print(f"\n{name} at {rows} rows a step")
        print(f"{'inter-op threads':18s} {'peak min':>9s} {'median':>8s} {'max':>8s} {'max/min':>8s} "
              f"{'per-process medians, MiB':>26s} {'ms a step':>10s}")
        speed = {}
        for one_thread, runs in results.items():
            peaks = [p / MIB for run in runs for p in run["peaks"]]
            medians = ", ".join(f"{statistics.median(run['peaks']) / MIB:.1f}" for run in runs)
            speed[one_thread] = statistics.median([s for run in runs for s in run["seconds"]])
            print(f"{'1' if one_thread else 'default':18s} {min(peaks):9.1f} {statistics.median(peaks):8.1f} "
                  f"{max(peaks):8.1f} {max(peaks) / min(peaks):7.2f}x {medians:>26s} {1000 * speed[one_thread]:10.1f}")
        print(f"one inter-op thread: {speed[False] / speed[True]:.2f}x the default's steps per second")


if __name__ == "__main__":
    main()
