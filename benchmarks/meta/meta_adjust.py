"""The MetaAdjuster (default meta-model) on held-out tasks: `kadapt.cli.meta_evaluation`'s arms, targets, overhead.

The task-seeds, arms and targets are those of `kadapt.cli.meta_evaluation` (the
same code as `kadapt meta eval MODEL.keras`): six held-out families x 3 seeds,
an 8-point constant-rate grid (8x the compute) whose best rate is the
reference, tuned ReduceLROnPlateau and the MetaAdjuster on the rates the grid
shows too low, too high and diverging, a cosine run at the grid-best rate
with and without the MetaAdjuster, and the range test's arms: its rate
constant, and under cosine, the test's steps charged to the run's budget
(`evaluation.range_test_runs`; the share within 1.2x of the grid-best beside
the MetaAdjuster's); and the MetaAdjuster starting from the range test on
every mis-set rate, the cosine run and the constant grid-best run
(`RangeTestStart`, judged by short branches, its steps charged); the anchors
at their defaults, the task's optimizer replaced (`evaluation.ANCHORS`: Schedule-Free AdamW, Prodigy,
Keras `Adam()`, Keras' `ScheduleFreeAdamW` and `Muon`), one run each per task-seed; against `evaluation.RANGE_TARGETS`
(issue 46's targets).

Overhead: a MetaAdjuster whose trigger never fires against none, on the same
model, in interleaved rounds; the share of the run spent inside its hooks is
the figure (targets: <= 1.02 observing every epoch, <= 1.03 in step mode).
The wall and CPU-time ratios, with an A/A arm for their noise, are printed
beside it.

    .venv/bin/python benchmarks/meta/meta_adjust.py                 # ~25 min on 2 idle cores (old arms)
    .venv/bin/python benchmarks/meta/meta_adjust.py --seeds 3 4 5 --overhead-rounds 0   # 52 min, 2 shared cores
    .venv/bin/python benchmarks/meta/meta_adjust.py --quick --meta-model /tmp/meta/m.keras
    .venv/bin/python benchmarks/meta/meta_adjust.py --merge a.json b.json   # one table of two processes' families
    nice -n 10 .venv/bin/python benchmarks/meta/meta_adjust.py --overhead-only --overhead-rounds 7   # ~2 min
    # the same on a wide MLP (784-2048-2048-10, 5.8M weights): what an observation costs as the model grows
    nice -n 10 .venv/bin/python benchmarks/meta/meta_adjust.py --overhead-only --overhead-rounds 3 --overhead-width 2048
"""

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402

from kadapt.cli import meta_evaluation as evaluation  # noqa: E402
from kadapt.meta import MetaAdjuster  # noqa: E402
from kadapt.meta import Trigger  # noqa: E402
from kadapt.meta import load_meta_model  # noqa: E402
from kadapt.recipes.training import steps_per_epoch  # noqa: E402

OVERHEAD_ROUNDS, OVERHEAD_EPOCHS = 7, 2
OVERHEAD_TARGETS = {"epoch": 1.02, "step": 1.03}
DEFAULT_OUT = Path(__file__).parent / "results" / "meta_adjust.json"
OVERHEAD_OUT = Path(__file__).parent / "results" / "meta_adjust_overhead.json"


class TimedMetaAdjuster(MetaAdjuster):
    """`MetaAdjuster` that adds up the wall time spent in its own hooks: its cost, read
    directly, which stays measurable when other jobs share the CPU. `observations` holds
    the wall time of each hook call that made an observation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = 0.0
        self.observations = []

    def _timed(self, hook, *args):
        observed = len(getattr(self, "history", ()))
        start = time.perf_counter()
        hook(*args)
        seconds = time.perf_counter() - start
        self.seconds += seconds
        if hook.__name__ != "on_train_begin" and len(self.history) > observed:
            self.observations.append(seconds)

    def on_train_begin(self, logs=None):
        self._timed(super().on_train_begin, logs)

    def on_epoch_begin(self, epoch, logs=None):
        self._timed(super().on_epoch_begin, epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._timed(super().on_train_batch_end, batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._timed(super().on_epoch_end, epoch, logs)

    def on_train_end(self, logs=None):
        self._timed(super().on_train_end, logs)


def never_fires():
    """A trigger that never calls for an adjustment: what is left is the cost of watching."""
    return Trigger(patience=10**9, cooldown=0, explode_factor=1e300)


def wide_mlp(width, task):
    """`task`'s model with its two hidden layers `width` wide (the same loss, optimizer and rate)."""
    model = task.build()
    wide = keras.Sequential([keras.Input(model.input_shape[1:]), keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(model.output_shape[-1])])
    wide.compile(optimizer=model.optimizer.__class__.from_config(model.optimizer.get_config()), loss=model.loss)
    return wide


def measure_overhead(meta_model, rounds, epochs, step_modes, width=None):
    """A silent MetaAdjuster against none, on the same model, in interleaved rounds.

    Per arm: median wall and process-CPU time per step, the median paired ratio
    to "without" (an A/A arm shows the noise of that ratio), the share of the
    run spent inside the adjuster's hooks (1 + hook time / the rest, the median
    over rounds: a round whose hooks other jobs preempted does not decide it)
    and the median wall time of one observation."""
    task = evaluation.evaluation_task("fashion_mnist", 0, 0.01, "constant")
    build = task.build if width is None else lambda: wide_mlp(width, task)
    x, y, x_val, y_val = task.data
    arms = {"without": [], "without (A/A)": [],
            "epoch": [TimedMetaAdjuster(meta_model, trigger=never_fires(), verbose=0, rescue=False,
                                         restart_trial=None)],
            **{f"every {n} steps": [TimedMetaAdjuster(meta_model, check_every=n, trigger=never_fires(), verbose=0,
                                                     rescue=False, restart_trial=None)]
               for n in step_modes}}
    models = {name: build() for name in arms}
    wall, cpu, hooks = ({name: [] for name in arms} for _ in range(3))
    observations = {name: [] for name in arms}
    for round_index in range(rounds + 1):
        for name, callbacks in arms.items():
            for callback in callbacks:
                callback.seconds = 0.0
            start, start_cpu = time.perf_counter(), time.process_time()
            models[name].fit(x, y, validation_data=(x_val, y_val), batch_size=task.batch_size,
                             epochs=epochs, verbose=0, callbacks=callbacks)
            if round_index:  # round 0 traces the train function
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
                hooks[name].append(sum(c.seconds for c in callbacks))
                observations[name] += [seconds for c in callbacks for seconds in c.observations]
            for callback in callbacks:
                callback.observations = []
    steps = epochs * steps_per_epoch(len(x), task.batch_size)
    weights = models["without"].count_params()
    return {"task": task.name if width is None else f"{task.name}, hidden layers {width} wide",
            "weights": weights, "rounds": rounds, "steps_per_round": steps,
            "ms_per_step": {name: 1000 * statistics.median(t) / steps for name, t in wall.items()},
            "wall_ratio": _paired_ratios(wall), "cpu_ratio": _paired_ratios(cpu),
            "hook_ratio": {name: statistics.median(1 + h / (w - h)
                                                   for h, w in zip(hooks[name], wall[name], strict=True))
                           for name in arms if name not in ("without", "without (A/A)")},
            "observation_ms": {name: 1000 * statistics.median(values) for name, values in observations.items()
                               if values}}


def _paired_ratios(seconds):
    base = seconds["without"]
    return {name: statistics.median(a / b for a, b in zip(values, base, strict=True))
            for name, values in seconds.items() if name != "without"}


def print_overhead(overhead):
    print(f"\noverhead, MetaAdjuster whose trigger never fires on {overhead['task']} "
          f"({overhead.get('weights', '?')} weights) "
          f"({overhead['rounds']} interleaved rounds of {overhead['steps_per_round']} steps):")
    print("\n| arm | ms/step (wall, median) | wall ratio | CPU-time ratio | hook-time ratio | ms/observation | target |"
          "\n|---|---|---|---|---|---|---|")
    for name, ms in overhead["ms_per_step"].items():
        cells = [_fmt(overhead[key].get(name)) for key in ("wall_ratio", "cpu_ratio", "hook_ratio", "observation_ms")]
        target = "" if name.startswith("without") else f"<= {OVERHEAD_TARGETS['epoch' if name == 'epoch' else 'step']}"
        print(f"| {name} | {ms:.2f} | " + " | ".join(cells) + f" | {target} |")


def _fmt(value):
    return "-" if value is None else f"{value:.3f}"


def load_text():
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta-model", default="default", help='"default" or a .keras path')
    parser.add_argument("--families", nargs="+", default=list(evaluation.EVALUATION_FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(evaluation.SEEDS))
    parser.add_argument("--epochs", type=int, default=evaluation.EPOCHS)
    parser.add_argument("--overhead-rounds", type=int, default=OVERHEAD_ROUNDS, help="0 skips the overhead")
    parser.add_argument("--step-modes", nargs="+", type=int, default=[10, 50],
                        help="check_every values of the step-mode overhead arms")
    parser.add_argument("--overhead-width", type=int, default=None,
                        help="the overhead on the task's MLP with hidden layers this wide (2048: 5.8M weights)")
    parser.add_argument("--overhead-only", action="store_true",
                        help=f"only the overhead arm (no held-out runs); results to {OVERHEAD_OUT.name} by default")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {evaluation.QUICK}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--merge", type=Path, nargs="+", metavar="RESULTS",
                        help="no runs: the table of these results files' runs together (e.g. two processes' "
                             "halves of the families), written to --out")
    parser.add_argument("--rerun-range-start", type=Path, nargs="+", metavar="RESULTS",
                        help="run only the range-test-start arms again with --meta-model, the other arms taken "
                             "from these results files (they do not depend on the start)")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    if args.overhead_only:
        return overhead_only(args)
    if args.quick:
        args.families, args.seeds, args.epochs = (list(v) if isinstance(v, tuple) else v for v in evaluation.QUICK.values())
    started = time.perf_counter()
    print(f"load average at start: {load_text()}", flush=True)
    meta_model = load_meta_model(args.meta_model)
    say = lambda text: print(text, flush=True)  # noqa: E731
    if args.rerun_range_start:
        runs = [evaluation.rerun_range_start(evaluation.restored(run), meta_model, args.epochs, say)
                for path in args.rerun_range_start for run in json.loads(path.read_text())["runs"]]
    else:
        runs = evaluation.evaluate_meta_model(meta_model, args.families, args.seeds, args.epochs, progress=say)
    print(f"load average after the runs: {load_text()}")
    print(evaluation.table(runs))
    overhead = None
    if args.overhead_rounds:
        overhead = measure_overhead(meta_model, args.overhead_rounds, OVERHEAD_EPOCHS, args.step_modes)
        print_overhead(overhead)
    seconds = time.perf_counter() - started
    print(f"load average at the end: {load_text()}; {seconds:.0f} s; results: {args.out}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = {"config": {k: _jsonable(v) for k, v in vars(args).items()},
               "summary": evaluation.summarize(runs), "runs": runs, "overhead": overhead, "seconds": seconds}
    args.out.write_text(json.dumps(_jsonable(results), indent=1))


def overhead_only(args):
    """The overhead arm alone, its load before and after."""
    started = time.perf_counter()
    print(f"load average at start: {load_text()}", flush=True)
    meta_model = load_meta_model(args.meta_model)
    overhead = measure_overhead(meta_model, args.overhead_rounds, OVERHEAD_EPOCHS, args.step_modes,
                                args.overhead_width)
    print_overhead(overhead)
    seconds = time.perf_counter() - started
    out = OVERHEAD_OUT if args.out == DEFAULT_OUT else args.out
    print(f"load average at the end: {load_text()}; {seconds:.0f} s; results: {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: _jsonable(v) for k, v in vars(args).items()}
    out.write_text(json.dumps(_jsonable({"config": config, "overhead": overhead, "seconds": seconds}), indent=1))


def merge(paths, out):
    """One table and results file from several runs' results (the same arms, other task-seeds)."""
    parts = [json.loads(Path(path).read_text()) for path in paths]
    runs = [evaluation.restored(run) for part in parts for run in part["runs"]]
    print(evaluation.table(runs))
    results = {"config": {"merged": [str(p) for p in paths]}, "summary": evaluation.summarize(runs), "runs": runs,
               "overhead": next((p["overhead"] for p in parts if p["overhead"]), None),
               "seconds": sum(p["seconds"] for p in parts)}
    out.write_text(json.dumps(_jsonable(results), indent=1))


def _jsonable(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


if __name__ == "__main__":
    main()
