"""MetaAdjuster against constant LR, ReduceLROnPlateau and cosine on held-out task families.

Tasks come from `kadapt.meta.tasks.HELD_OUT_FAMILIES` (never in the default
meta-model's records), one per family and seed (the seed also draws the MLP's
widths), with SGD momentum 0.9 and the learning rate mis-set three ways. The
rates are calibrated per family by a quick constant-LR scan on its first seed
over `SCAN_GRID` (`--scan-epochs` epochs, upwards until the weights turn
non-finite):

  too_low    1e-4
  too_high   the smallest scanned rate above the best one whose scan loss is
             >= LABEL_MARGIN x the best (trains badly, stays finite)
  diverging  the smallest scanned rate whose weights turn NaN/Inf; re-checked
             on every seed, stepping up the grid where a seed stays finite

The scan, and whether each label held in it, are printed and stored; whether a
diverging run really diverges over the whole budget is what `diverged_runs`
counts (the rescue rate is taken over those).

Every policy then trains the same task (same data, initialization and batch
order) for a fixed budget of `--epochs` epochs of batch 32:

  constant       the set LR throughout
  plateau        keras.callbacks.ReduceLROnPlateau() (factor 0.1, patience 10)
  plateau_tuned  ReduceLROnPlateau(factor=0.3, patience=2)
  cosine         kadapt.CosineAnnealing from the set LR to 0 over the run
  meta           kadapt.meta.MetaAdjuster(meta_model, monitor="val_loss",
                 check_every="epoch"); more variants with `--check-every`

Final validation loss (and accuracy for classification) come from one
`evaluate` after `fit`. Non-finite weights are absorbing, so baseline runs stop
at the first epoch that ends with them (the outcome, NaN, is the same).
Aggregates (issue 7 targets):

  win rate     meta's final val loss strictly below plateau_tuned's; NaN loses   (>= 75%)
  harm rate    meta ends worse than constant, NaN worst                          (<= 10%)
  rescue rate  of runs whose constant run ends non-finite: meta ends finite and
               below the initial val loss                                        (>= 90%)
  overhead     time per step with a MetaAdjuster whose trigger never fires over
               without one (1 + time inside its hooks / the rest of the run; the
               interleaved A/B wall and CPU-time ratios, with an A/A arm for
               their noise, are printed beside it)                             (<= 1.02)

The CPU may be shared: the load average is printed and stored with the results,
and the hook-time ratio is the overhead figure that contention does not swamp.
The baselines do not depend on the meta-model; `--policies` and `--reuse` run
them once and add the MetaAdjuster runs later (all runs are seeded).

    .venv/bin/python benchmarks/meta_adjust.py                  # ~15 min on 2 idle cores
    .venv/bin/python benchmarks/meta_adjust.py --quick --meta-model /tmp/meta/m.keras
    .venv/bin/python benchmarks/meta_adjust.py --policies constant plateau plateau_tuned cosine \\
        --out benchmarks/results/meta_adjust_baselines.json
    .venv/bin/python benchmarks/meta_adjust.py --reuse benchmarks/results/meta_adjust_baselines.json
"""

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
from collections import Counter
from pathlib import Path

from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.meta import MetaAdjuster  # noqa: E402
from kadapt.meta import Trigger  # noqa: E402
from kadapt.meta import load_meta_model  # noqa: E402
from kadapt.meta.tasks import HELD_OUT_FAMILIES  # noqa: E402
from kadapt.meta.tasks import make_task  # noqa: E402

MOMENTUM = 0.9
TOO_LOW = 1e-4  # with momentum 0.9 an effective step of 1e-3: far below every family's best
SCAN_GRID = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
LABEL_MARGIN = 1.2  # "trains badly": a scan loss at least 20% above the best scanned rate's
SETTINGS = ("too_low", "too_high", "diverging")
BASELINES = ("constant", "plateau", "plateau_tuned", "cosine")
TARGETS = {"win_rate": (">=", 0.75), "harm_rate": ("<=", 0.10), "rescue_rate": (">=", 0.90),
           "overhead": ("<=", 1.02)}
EPOCHS, SCAN_EPOCHS, OVERHEAD_ROUNDS, OVERHEAD_EPOCHS = 20, 3, 9, 2
QUICK = {"families": ["iris"], "seeds": [0, 1], "epochs": 5, "scan_epochs": 2, "overhead_rounds": 2}
DEFAULT_OUT = Path(__file__).parent / "results" / "meta_adjust.json"


class StopWhenNonFinite(keras.callbacks.Callback):
    """Ends a baseline run once its weights are NaN/Inf: from there every step keeps them so."""

    def on_epoch_end(self, epoch, logs=None):
        if not all(np.all(np.isfinite(v.numpy())) for v in self.model.trainable_variables):
            self.model.stop_training = True


class TimedMetaAdjuster(MetaAdjuster):
    """`MetaAdjuster` that adds up the wall time spent in its own hooks: its cost, read
    directly, which stays measurable when other jobs share the CPU."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = 0.0

    def _timed(self, hook, *args):
        start = time.perf_counter()
        hook(*args)
        self.seconds += time.perf_counter() - start

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


def task_for(family, seed, learning_rate):
    return dataclasses.replace(make_task(family, seed, learning_rate, "sgd"), momentum=MOMENTUM)


def steps_per_epoch(task):
    return math.ceil(len(task.data[0]) / task.batch_size)


def build(task, policy, epochs):
    if policy == "cosine":
        schedule = kadapt.CosineAnnealing(task.learning_rate, 0.0, epochs * steps_per_epoch(task))
        task = dataclasses.replace(task, learning_rate=schedule)
    return task.build()


def callbacks_for(policy, meta_model, check_every):
    if policy == "plateau":
        return [keras.callbacks.ReduceLROnPlateau(monitor="val_loss", verbose=0), StopWhenNonFinite()]
    if policy == "plateau_tuned":
        return [keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.3, patience=2, verbose=0),
                StopWhenNonFinite()]
    if policy.startswith("meta"):
        return [TimedMetaAdjuster(meta_model, monitor="val_loss", check_every=check_every, verbose=0)]
    return [StopWhenNonFinite()]


def final_metrics(model, task):
    x_val, y_val = task.data[2], task.data[3]
    loss = float(model.evaluate(x_val, y_val, batch_size=256, verbose=0))
    if task.regression or not math.isfinite(loss):
        return loss, None
    logits = model.predict(x_val, batch_size=256, verbose=0)
    return loss, float(np.mean(logits.argmax(-1) == y_val))


def train(task, policy, epochs, meta_model=None, check_every="epoch"):
    """One policy on one task: final val loss/accuracy, wall time, steps, decisions."""
    model = build(task, policy, epochs)
    callbacks = callbacks_for(policy, meta_model, check_every)
    x, y, x_val, y_val = task.data
    keras.utils.set_random_seed(task.seed)  # the same batch order for every policy
    start = time.perf_counter()
    try:
        history = model.fit(x, y, validation_data=(x_val, y_val), batch_size=task.batch_size,
                            epochs=epochs, verbose=0, callbacks=callbacks)
    except ValueError as error:  # a policy that stops fit with an error has failed the run: it scores NaN
        return {"val_loss": math.nan, "accuracy": None, "seconds": time.perf_counter() - start, "steps": 0,
                "error": str(error), "decisions": [_decision(d) for d in getattr(callbacks[0], "decisions", [])],
                "hook_seconds": getattr(callbacks[0], "seconds", 0.0)}
    seconds = time.perf_counter() - start
    loss, accuracy = final_metrics(model, task)
    result = {"val_loss": loss, "accuracy": accuracy, "seconds": seconds,
              "steps": len(history.epoch) * steps_per_epoch(task)}
    if policy.startswith("meta"):
        result["decisions"] = [_decision(d) for d in callbacks[0].decisions]
        result["hook_seconds"] = callbacks[0].seconds
    return result


def _decision(decision):
    keys = ("epoch", "step", "trigger", "action", "rollback", "confidence", "learning_rate")
    return {key: decision.get(key) for key in keys}


def initial_val_loss(task):
    return float(task.build().evaluate(task.data[2], task.data[3], batch_size=256, verbose=0))


# Calibration -----------------------------------------------------------------------------


def scan(family, seed, scan_epochs, grid):
    """Constant-LR final val loss per rate, upwards until the weights turn non-finite."""
    losses = {}
    for learning_rate in grid:
        losses[learning_rate] = train(task_for(family, seed, learning_rate), "constant", scan_epochs)["val_loss"]
        if not math.isfinite(losses[learning_rate]):
            break
    return losses


def calibrate(family, seeds, scan_epochs):
    """Rates of the three settings for a family, from a scan on its first seed.

    The architecture varies with the seed, so the diverging rate is re-checked
    on every seed (stepping up the grid until that seed's run turns non-finite)."""
    losses = scan(family, seeds[0], scan_epochs, SCAN_GRID)
    finite = {lr: loss for lr, loss in losses.items() if math.isfinite(loss)}
    best = min(finite, key=finite.get)
    bad = [lr for lr in finite if lr > best and finite[lr] >= LABEL_MARGIN * finite[best]]
    too_high = min(bad) if bad else max(finite)
    diverging = {}
    for seed in seeds:
        grid = [lr for lr in SCAN_GRID if lr >= max(losses)]
        checked = losses if seed == seeds[0] else scan(family, seed, scan_epochs, grid)
        last = max(checked)
        diverging[seed] = None if math.isfinite(checked[last]) else last
    return {"scan_seed": seeds[0], "scan": {f"{lr:g}": _number(loss) for lr, loss in losses.items()},
            "best": best, "too_low": TOO_LOW, "too_high": too_high, "diverging": diverging,
            "labels_hold_in_scan": {"too_low": finite.get(TOO_LOW, math.inf) >= LABEL_MARGIN * finite[best],
                                    "too_high": too_high > best and finite[too_high] >= LABEL_MARGIN * finite[best]}}


def rate(calibration, setting, seed):
    return calibration["diverging"][seed] if setting == "diverging" else calibration[setting]


# Overhead --------------------------------------------------------------------------------


def measure_overhead(meta_model, rounds, epochs):
    """A silent MetaAdjuster against none, on the same model, in interleaved rounds.

    Per arm: median wall and process-CPU time per step, the median paired ratio
    to "without" (an A/A arm shows the noise of that ratio), and the share of
    the run spent inside the adjuster's hooks."""
    task = task_for("fashion_mnist", 0, 0.01)
    x, y, x_val, y_val = task.data
    arms = {"without": [], "without (A/A)": [],
            "epoch": [TimedMetaAdjuster(meta_model, trigger=never_fires(), verbose=0)],
            "every 10 steps": [TimedMetaAdjuster(meta_model, check_every=10, trigger=never_fires(), verbose=0)]}
    models = {name: task.build() for name in arms}
    wall, cpu, hooks = ({name: [] for name in arms} for _ in range(3))
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
    steps = epochs * steps_per_epoch(task)
    return {"task": task.name, "rounds": rounds, "steps_per_round": steps,
            "ms_per_step": {name: 1000 * statistics.median(t) / steps for name, t in wall.items()},
            "wall_ratio": _paired_ratios(wall), "cpu_ratio": _paired_ratios(cpu),
            "hook_ratio": {name: 1 + sum(hooks[name]) / (sum(wall[name]) - sum(hooks[name]))
                           for name in arms if name not in ("without", "without (A/A)")}}


def _paired_ratios(seconds):
    base = seconds["without"]
    return {name: statistics.median(a / b for a, b in zip(values, base, strict=True))
            for name, values in seconds.items() if name != "without"}


# Aggregates ------------------------------------------------------------------------------


def _key(loss):
    return loss if math.isfinite(loss) else math.inf


def _number(value):
    return value if value is None or math.isfinite(value) else None


def aggregate(runs, meta):
    """Win, harm and rescue rates of policy `meta`, overall and per setting."""
    def rates(subset):
        wins = [_key(r[meta]["val_loss"]) < _key(r["plateau_tuned"]["val_loss"]) for r in subset]
        harms = [_key(r[meta]["val_loss"]) > _key(r["constant"]["val_loss"]) for r in subset]
        diverged = [r for r in subset if not math.isfinite(r["constant"]["val_loss"])]
        rescued = [math.isfinite(r[meta]["val_loss"]) and r[meta]["val_loss"] < r["initial_val_loss"]
                   for r in diverged]
        return {"runs": len(subset), "win_rate": _mean(wins), "harm_rate": _mean(harms),
                "rescue_rate": _mean(rescued), "diverged_runs": len(diverged)}

    report = {"all": rates(runs)}
    for setting in SETTINGS:
        report[setting] = rates([r for r in runs if r["setting"] == setting])
    for family in sorted({r["family"] for r in runs}):
        report[family] = rates([r for r in runs if r["family"] == family])
    return report


def _mean(flags):
    return float(np.mean(flags)) if flags else None


def step_time_ratio(runs, meta):
    """Median time-per-step ratio meta/constant on runs where both ran every epoch."""
    ratios = [(r[meta]["seconds"] / r[meta]["steps"]) / (r["constant"]["seconds"] / r["constant"]["steps"])
              for r in runs if r["setting"] != "diverging" and r[meta]["steps"] == r["constant"]["steps"]
              and math.isfinite(r["constant"]["val_loss"])]
    return statistics.median(ratios) if ratios else None


def decision_summary(runs, meta):
    summary = {}
    for setting in SETTINGS:
        decisions = [d for r in runs if r["setting"] == setting for d in r[meta]["decisions"]]
        count = len([r for r in runs if r["setting"] == setting]) or 1
        summary[setting] = {"per_run": len(decisions) / count,
                            "triggers": dict(Counter(d["trigger"] for d in decisions)),
                            "actions": dict(Counter(d["action"] for d in decisions)),
                            "rollbacks": sum(bool(d["rollback"]) for d in decisions)}
    return summary


# Printing --------------------------------------------------------------------------------


def _cell(result):
    loss = result["val_loss"]
    text = f"{loss:.4g}" if math.isfinite(loss) else "NaN"
    return text if result["accuracy"] is None else f"{text} ({result['accuracy']:.3f})"


def print_runs(runs, policies):
    print("\nFinal validation loss (accuracy) per policy; lr is the set rate, init the initial val loss.\n")
    print("| task | seed | setting | lr | init | " + " | ".join(policies) + " | meta decisions |")
    print("|" + "---|" * (len(policies) + 6))
    for r in runs:
        decisions = ", ".join(f"e{d['epoch']} {d['trigger']}:{d['action']}" for d in r.get("meta", {}).get(
            "decisions", []))
        cells = " | ".join(_cell(r[p]) + (" error" if "error" in r[p] else "") for p in policies)
        print(f"| {r['family']} | {r['seed']} | {r['setting']} | {r['learning_rate']:g} | "
              f"{r['initial_val_loss']:.4g} | {cells} | {decisions or '-'} |")


def print_aggregates(aggregates, overhead, step_ratio, hook_ratio, meta, check_every):
    a = aggregates["all"]
    arm = "epoch" if check_every == "epoch" else f"every {check_every} steps"
    measured = {"win_rate": a["win_rate"], "harm_rate": a["harm_rate"], "rescue_rate": a["rescue_rate"],
                "overhead": None if overhead is None else overhead["hook_ratio"].get(arm)}
    print(f"\n| {meta} | measured | target | met |\n|---|---|---|---|")
    for name, (sense, target) in TARGETS.items():
        value = measured[name]
        met = value is not None and (value >= target if sense == ">=" else value <= target)
        shown = "n/a" if value is None else f"{value:.3f}"
        print(f"| {name} | {shown} | {sense} {target} | {'yes' if met else 'NO'} |")
    print(f"\nrescue over {a['diverged_runs']} runs whose constant LR ended non-finite. In the benchmark runs, "
          f"time per step {meta}/constant (finite runs, decisions included, CPU shared): {_fmt(step_ratio)}; "
          f"time inside the adjuster's hooks as a ratio: {_fmt(hook_ratio)}")
    print("\n| subset | runs | win | harm | rescue |\n|---|---|---|---|---|")
    for subset, rates in aggregates.items():
        cells = " | ".join("-" if rates[k] is None else f"{rates[k]:.2f}"
                           for k in ("win_rate", "harm_rate", "rescue_rate"))
        print(f"| {subset} | {rates['runs']} | {cells} |")


def print_overhead(overhead):
    print(f"\noverhead, MetaAdjuster whose trigger never fires on {overhead['task']} "
          f"({overhead['rounds']} interleaved rounds of {overhead['steps_per_round']} steps):")
    print("\n| arm | ms/step (wall, median) | wall ratio | CPU-time ratio | hook-time ratio |\n|---|---|---|---|---|")
    for name, ms in overhead["ms_per_step"].items():
        cells = [_fmt(overhead[key].get(name)) for key in ("wall_ratio", "cpu_ratio", "hook_ratio")]
        print(f"| {name} | {ms:.2f} | " + " | ".join(cells) + " |")


def _fmt(value):
    return "-" if value is None else f"{value:.3f}"


def print_load(when):
    print(f"load average (1, 5, 15 min) {when}: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()), flush=True)


# Main ------------------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta-model", default="default", help='"default" or a .keras path')
    parser.add_argument("--families", nargs="+", default=list(HELD_OUT_FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--scan-epochs", type=int, default=SCAN_EPOCHS)
    parser.add_argument("--overhead-rounds", type=int, default=OVERHEAD_ROUNDS)
    parser.add_argument("--check-every", nargs="+", default=["epoch"],
                        help='MetaAdjuster check_every values ("epoch" or steps); the first is "meta"')
    parser.add_argument("--policies", nargs="+", default=None,
                        help="run only these (default: the baselines and every meta variant)")
    parser.add_argument("--reuse", type=Path, default=None,
                        help="a results JSON of the same families/seeds/epochs: its calibration and "
                             "runs are kept, only the missing policies run (the runs are seeded)")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    args.check_every = [value if value == "epoch" else int(value) for value in args.check_every]
    return args


def meta_policies(check_every):
    return {("meta" if i == 0 else f"meta@{value}"): value for i, value in enumerate(check_every)}


def load_reused(path, args):
    if path is None:
        return {}, {}
    previous = json.loads(path.read_text())
    for key in ("families", "seeds", "epochs", "scan_epochs"):
        if previous["config"][key] != getattr(args, key):
            raise SystemExit(f"--reuse {path}: its {key} is {previous['config'][key]}, not {getattr(args, key)}")
    runs = {(r["family"], r["seed"], r["setting"]): _restore_nan(r) for r in previous["runs"]}
    calibrations = {family: _calibration_from_json(c) for family, c in previous["calibration"].items()}
    return calibrations, runs


def _restore_nan(run):
    for value in run.values():
        if isinstance(value, dict) and "val_loss" in value and value["val_loss"] is None:
            value["val_loss"] = math.nan
    return run


def _calibration_from_json(calibration):
    calibration["diverging"] = {int(seed): lr for seed, lr in calibration["diverging"].items()}
    return calibration


def run_task(family, seed, setting, calibration, args, context):
    """Every policy (or the missing ones of a reused run) on one task and setting."""
    run = context["reused"].get((family, seed, setting))
    task = task_for(family, seed, rate(calibration, setting, seed))
    if run is None:
        run = {"family": family, "seed": seed, "setting": setting, "learning_rate": task.learning_rate,
               "task": task.name, "initial_val_loss": initial_val_loss(task)}
    metas = meta_policies(args.check_every)
    for policy in context["policies"]:
        if policy not in run:
            run[policy] = train(task, policy, args.epochs, context["meta_model"], metas.get(policy, "epoch"))
    return run


def results_of(args, calibrations, runs, started):
    return {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "load_average": os.getloadavg(), "seconds": time.perf_counter() - started,
            "targets": TARGETS, "calibration": calibrations, "runs": runs}


def write(path, results):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(results), indent=1))


def summarize(results, runs, overhead, args):
    policies = [p for p in (*BASELINES, *meta_policies(args.check_every)) if all(p in r for r in runs)]
    results["overhead"], results["policies"] = overhead, {}
    print_runs(runs, policies)
    for meta in (p for p in policies if p.startswith("meta")):
        hooks = [r[meta]["hook_seconds"] / (r[meta]["seconds"] - r[meta]["hook_seconds"]) for r in runs
                 if "error" not in r[meta]]
        summary = {"aggregates": aggregate(runs, meta), "step_time_ratio": step_time_ratio(runs, meta),
                   "hook_ratio": 1 + statistics.median(hooks) if hooks else None,
                   "decisions": decision_summary(runs, meta)}
        results["policies"][meta] = summary
        print_aggregates(summary["aggregates"], overhead, summary["step_time_ratio"], summary["hook_ratio"], meta,
                         meta_policies(args.check_every)[meta])
        print(f"\n{meta} decisions by setting: {json.dumps(summary['decisions'])}")
    if overhead is not None:
        print_overhead(overhead)


def main():
    args = parse_args()
    started = time.perf_counter()
    print_load("at start")
    calibrations, reused = load_reused(args.reuse, args)
    policies = args.policies or [*BASELINES, *meta_policies(args.check_every)]
    needs_meta = any(p.startswith("meta") for p in policies)
    context = {"policies": policies, "reused": reused,
               "meta_model": load_meta_model(args.meta_model) if needs_meta else None}
    runs = []
    for family in args.families:
        if family not in calibrations:
            calibrations[family] = calibrate(family, args.seeds, args.scan_epochs)
        print(f"calibration {family}: {calibrations[family]}", flush=True)
        for seed in args.seeds:
            for setting in SETTINGS:
                if rate(calibrations[family], setting, seed) is None:
                    print(f"  {family}/{seed} {setting}: no such rate on the grid, skipped")
                    continue
                runs.append(run_task(family, seed, setting, calibrations[family], args, context))
                print(f"  {family}/{seed} {setting} lr={runs[-1]['learning_rate']:g}: " + ", ".join(
                    f"{p} {_cell(runs[-1][p])}" for p in policies), flush=True)
                write(args.out, results_of(args, calibrations, runs, started))
    print_load("after the runs")
    overhead = measure_overhead(context["meta_model"], args.overhead_rounds, OVERHEAD_EPOCHS) if needs_meta else None
    results = results_of(args, calibrations, runs, started)
    summarize(results, runs, overhead, args)
    print_load("at the end")
    write(args.out, results)
    print(f"{time.perf_counter() - started:.0f} s; results: {args.out}")


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return _number(value)
    return value


if __name__ == "__main__":
    main()
