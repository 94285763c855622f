"""The MetaAdjuster from the range test, with and without a mid-run range test at stalls.

Reruns only the arm `meta_range` of `kadapt.meta.evaluation` with
`RangeTestStart(mid_run=True)` (a 30-step sweep from 1/30 to 30 times the
live rate where the trigger calls progress stalled, its steps charged),
on the task-seeds of a `meta_adjust.py` results file, and sets its figures
(`RANGE_TARGETS`) beside those of the arm without it from that file.

    .venv/bin/python benchmarks/range_start_mid_run.py benchmarks/results/meta_adjust.json --families iris circles
"""

import argparse
import json
import math
import time
from pathlib import Path

from kadapt import environment  # noqa: E402

environment.load_tensorflow()

from kadapt.meta import evaluation  # noqa: E402
from kadapt.meta import load_meta_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a meta_adjust.py results file (with the meta_range arm)")
    parser.add_argument("--families", nargs="+", default=list(evaluation.EVALUATION_FAMILIES))
    parser.add_argument("--meta-model", default="default")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = [_with_nan(r) for r in json.loads(args.results.read_text())["runs"] if r["family"] in args.families]
    meta_model, started = load_meta_model(args.meta_model), time.perf_counter()
    variant = [_with_mid_run(run, meta_model) for run in runs]
    before, after = evaluation.summarize(runs)["meta_range"], evaluation.summarize(variant)["meta_range"]
    print("\n| figure | start only | start + mid-run tests | target |\n|---|---|---|---|")
    for name, (sense, target, _) in evaluation.RANGE_TARGETS.items():
        print(f"| {name} | {_share(before['all'][name])} | {_share(after['all'][name])} | {sense} {target:g} |")
    print(f"\n{time.perf_counter() - started:.0f} s, {before['all']['runs']} mis-set runs")
    if args.out:
        args.out.write_text(json.dumps(variant, indent=1, default=lambda v: None))


def _with_mid_run(run, meta_model):
    """`run` with its `meta_range` arms rerun with mid-run tests."""
    run = _with_nan(json.loads(json.dumps(run)))
    epochs = evaluation.EPOCHS
    for setting, case in run["settings"].items():
        task = evaluation.evaluation_task(run["family"], run["seed"], case["learning_rate"])
        case["meta_range"] = evaluation.meta_run(task, epochs, meta_model,
                                                 range_test=evaluation.range_start(task, mid_run=True))
        print(f"{run['family']}/{run['seed']} {setting}: mid-run {case['meta_range']['val_loss']:.4g} "
              f"{evaluation._decisions(case['meta_range'])}", flush=True)
    task = evaluation.evaluation_task(run["family"], run["seed"], run["best_rate"], "cosine")
    run["cosine"]["with_range"] = evaluation.meta_run(task, epochs, meta_model,
                                                      range_test=evaluation.range_start(task, mid_run=True))
    return run


def _with_nan(tree):
    """A results tree with the NaN losses that JSON holds as null put back."""
    if isinstance(tree, dict):
        return {k: math.nan if v is None and k in ("val_loss", "learning_rate") else _with_nan(v)
                for k, v in tree.items()}
    return [_with_nan(v) for v in tree] if isinstance(tree, list) else tree


def _share(value):
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
