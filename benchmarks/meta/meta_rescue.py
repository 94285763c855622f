"""The MetaAdjuster alone against the MetaAdjuster with `DeadRunRescue` after it, as `kadapt train` runs them.

On meta_adjust's held-out task-seeds, from the same mis-set rates (too low, too
high, diverging) and the well-set runs: `kadapt.cli.meta_evaluation.meta_run`
without and with `rescue=True` (`task_rescue`: `DeadRunRule` at the constant
predictor's loss on the training targets, a range test on the training rows
for the new rate). The other arms (grid-best, constant, plateau, cosine without
the adjuster) are read from results files of `meta_adjust.py`, or rebuilt from
its per-run table by `table_results.py`. Figures: within 1.2x / 1.5x of the
grid-best final validation loss, below tuned ReduceLROnPlateau, harm (> 1.1x
the constant rate), diverging runs rescued (finite, below the untrained
validation loss), well-set cosine runs within 1.05x of the run without, and
below range test then constant and below the best anchor (issue 46's figures
for the start from the range test), and well-set runs harmed (> 1.05x the run
without; the cosine and the constant run at the grid-best rate). With
`--range-start` both arms start from the range test; `--meta-model M.keras`
runs both with another meta-model than the shipped one; `--consult-every N`
gives both a trigger that also consults the meta-model every N observations
(0: the trigger's rules only; the adjuster's default is 3); `--order K` trains
every run with its training rows in another batch order (the figure's own
spread over orders: benchmarks/README.md#meta_rescue).

    .venv/bin/python benchmarks/meta/table_results.py --table benchmarks/meta/per_run_table.md --out runs/base
    .venv/bin/python benchmarks/meta/meta_rescue.py runs/base/base_{iris,circles,friedman}_*.json --out runs/rescue_a.json &
    .venv/bin/python benchmarks/meta/meta_rescue.py runs/base/base_{fashion_conv,adding,fashion_autoencoder}_*.json \
        --out runs/rescue_b.json; wait   # ~13 min on 2 shared cores
    .venv/bin/python benchmarks/meta/meta_rescue.py --merge runs/rescue_a.json runs/rescue_b.json \
        [--noise runs/noise/a.json runs/noise/b.json]   # well_set_noise.py --schedules constant --cuts --out
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from kadapt.cli import meta_evaluation as evaluation
from kadapt.meta.live.high_rate import CHECK_EPOCHS
from kadapt.meta.live.high_rate import HighRateCheck
from kadapt.meta.live.triggers import Trigger

ARMS = ("meta", "meta_rescue")


def _arm(task, arm, range_start, meta_model, consult_every=None, restart=True, high_rate=None):
    """`arm` on `task`: the adjuster with `meta_model` (starting from the range test with
    `range_start`; its trigger consulting every `consult_every` observations too, the rules only
    at 0, the adjuster's default at `None`; its `restart`), with the rescue after it for `"meta_rescue"`."""
    options = {"range_test": evaluation.range_start(task)} if range_start else {}
    options["restart"] = restart
    if high_rate:  # the too-high-rate check on the training rows (at these epochs), as "auto" derives it
        x, y = task.data[:2]
        options["high_rate"] = HighRateCheck(x, y, batch_size=task.batch_size, seed=task.seed, epochs=high_rate)
    if consult_every is not None:  # 0: the trigger's rules only
        options["trigger"] = Trigger(consult_every=consult_every or None)
    return evaluation.meta_run(task, evaluation.EPOCHS, meta_model, rescue=arm == "meta_rescue", **options)


def run_task(base: dict, range_start: bool = False, meta_model: str = "default",
             consult_every: int | None = None, restart: bool = True, high_rate: tuple | None = None,
             settings: tuple = evaluation.SETTINGS, arms: tuple = ARMS, order: int = 0) -> dict:
    """Both arms on one task-seed of a results file (`base`: one of its `runs`); with
    `range_start`, the adjuster starts from the range test in both. The well-set runs at the
    grid-best rate, cosine and constant, run in both modes. `order` > 0: every run's training
    rows in that other order (`meta_evaluation.reordered`, as well_set_noise.py's), the other
    mis-set arms (read from `base`) as they ran, the well-set runs without the adjuster trained
    again in that order."""
    family, seed = base["family"], base["seed"]

    def task_at(rate, schedule="constant"):
        task = evaluation.evaluation_task(family, seed, rate, schedule)
        return evaluation.reordered(task, order) if order else task

    result = {key: base.get(key) for key in ("family", "seed", "best_rate", "best_val_loss", "initial_val_loss",
                                             "range_test", "anchors")}
    result["settings"], result["order"] = {}, order
    options = (range_start, meta_model, consult_every, restart, high_rate)
    for setting, case in base["settings"].items():
        if setting not in settings:
            continue
        task = task_at(case["learning_rate"])
        ran = {arm: _arm(task, arm, *options) for arm in arms}
        result["settings"][setting] = {"learning_rate": case["learning_rate"], "constant": case["constant"],
                                       "plateau": case["plateau"], **ran}
        print(f"{family}/{seed} {setting} lr={case['learning_rate']:g}: "
              + ", ".join(f"{arm} {ran[arm]['val_loss']:.4g}" for arm in arms), flush=True)
    for name, schedule in (("cosine", "cosine"), ("well_set", "constant")):
        task = task_at(base["best_rate"], schedule)
        without = evaluation.train_run(task, evaluation.EPOCHS) if order else base[name]["without"]
        result[name] = {"without": without,
                        **{arm: _arm(task, arm, *options) for arm in arms}}
        print(f"{family}/{seed} {name}: " + ", ".join(f"{arm} {result[name][arm]['val_loss']:.4g}"
                                                      for arm in ("without", *arms)), flush=True)
    return result


def _loss(run):
    value = run["val_loss"]
    return value if value is not None and math.isfinite(value) else math.inf


def summarize(results: list[dict]) -> dict:
    """Per arm: the figures over every mis-set run and the well-set cosine runs."""
    figures = {}
    for arm in ARMS:
        if not all(arm in c for r in results for c in [*r["settings"].values(), r["cosine"]]):
            continue  # an arm not run (`--arms`)
        cases = [(r, c) for r in results for c in r["settings"].values()]
        diverging = [(r, c) for r, c in cases if _loss(c["constant"]) == math.inf]
        figures[arm] = {
            "runs": len(cases),
            "within_1.2x": sum(_loss(c[arm]) <= 1.2 * r["best_val_loss"] for r, c in cases),
            "within_1.5x": sum(_loss(c[arm]) <= 1.5 * r["best_val_loss"] for r, c in cases),
            "below_plateau": sum(_loss(c[arm]) < _loss(c["plateau"]) for r, c in cases),
            "harm": sum(_loss(c[arm]) > 1.1 * _loss(c["constant"]) for r, c in cases),
            "rescued": sum(_loss(c[arm]) < r["initial_val_loss"] for r, c in diverging),
            "diverging": len(diverging),
            # As `evaluation`'s figure: a task-seed without room for the test counts as beaten.
            "below_range_constant": sum(_loss(c[arm]) < (_loss(r["range_test"]["constant"]) if r.get("range_test")
                                                         else math.inf) for r, c in cases),
            "below_anchors": sum(_loss(c[arm]) < min(map(_loss, r["anchors"].values()))
                                 for r, c in cases if r.get("anchors")),
            "cosine_unharmed": sum(_loss(r["cosine"][arm]) <= 1.05 * _loss(r["cosine"]["without"]) for r in results),
            "cosine_runs": len(results),
            "well_set_harmed": sum(_loss(r[name][arm]) > 1.05 * _loss(r[name]["without"])
                                   for r in results for name in ("cosine", "well_set") if name in r),
            "well_set_runs": sum(name in r for r in results for name in ("cosine", "well_set")),
        }
    return figures


def anchor_ceiling(results: list[dict]) -> dict:
    """Below the best anchor, counted as for the arms, for runs that knew the grid's best rate.

    An arm that tunes the task's optimizer's rate cannot end below what the rate itself gives: the
    grid-best constant rate from the first step, and the cosine run from it, are its ceiling.
    """
    cases = [r for r in results for _ in r["settings"] if r.get("anchors")]
    best_anchor = {id(r): min(map(_loss, r["anchors"].values())) for r in cases}
    grid = [r["best_val_loss"] < best_anchor[id(r)] for r in cases]
    cosine = [_loss(r["cosine"]["without"]) < best_anchor[id(r)] for r in cases]
    return {"runs": len(cases), "grid_best": sum(grid), "cosine": sum(cosine),
            "either": sum(g or c for g, c in zip(grid, cosine))}


def noise_ceiling(results: list[dict], noise: list[dict], arm: str = "meta_rescue") -> dict:
    """"Within 1.2x of the grid-best" against the grid's best rate itself, trained in other orders.

    `noise`: `well_set_noise.py --out`'s runs (the constant run at the grid-best rate, its rows
    reordered). `expected`: over the mis-set runs, the share of a task-seed's reordered runs within
    1.2x of the grid-best: what landing on the best rate from the first step would score, the
    batch order drawn anew. `steady`: the task-seeds whose every reordered run is within 1.2x;
    `arm` within 1.2x there and elsewhere.
    """
    near = {}
    for run in noise:
        orders = [loss for name, loss in run["schedules"]["constant"]["runs"].items() if name.startswith("order")]
        near[run["family"], run["seed"]] = [loss <= evaluation.RANGE_NEAR * run["grid_best"] for loss in orders]
    figures = {"runs": 0, "expected": 0.0, "steady": [0, 0], "unsteady": [0, 0]}
    for r in results:
        orders = near.get((r["family"], r["seed"]))
        if not orders:
            continue
        for c in r["settings"].values():
            figures["runs"] += 1
            figures["expected"] += sum(orders) / len(orders)
            where = figures["steady" if all(orders) else "unsteady"]
            where[0] += _loss(c[arm]) <= evaluation.RANGE_NEAR * r["best_val_loss"]
            where[1] += 1
    return figures


def print_summary(results: list[dict], noise: list[dict] | None = None) -> None:
    figures = summarize(results)
    print("\n| arm | within 1.2x of the grid-best | within 1.5x | below plateau | harm | diverging rescued "
          "| cosine within 1.05x | well-set runs harmed (> 1.05x) |\n|---|---|---|---|---|---|---|---|")
    for arm, f in figures.items():
        n = f["runs"]
        print(f"| {arm} | {f['within_1.2x']}/{n} ({f['within_1.2x'] / n:.2f}) | {f['within_1.5x']}/{n} "
              f"({f['within_1.5x'] / n:.2f}) | {f['below_plateau']}/{n} ({f['below_plateau'] / n:.2f}) "
              f"| {f['harm']}/{n} | {f['rescued']}/{f['diverging']} | {f['cosine_unharmed']}/{f['cosine_runs']} "
              f"| {f['well_set_harmed']}/{f['well_set_runs']} |")
    print("\n| arm | below range test then constant | below the best anchor |\n|---|---|---|")
    for arm, f in figures.items():
        print(f"| {arm} | {f['below_range_constant']}/{f['runs']} | {f['below_anchors']}/{f['runs']} |")
    ceiling = anchor_ceiling(results)
    print(f"\nbelow the best anchor at the grid-best rate itself, from the first step (no adjuster): constant "
          f"{ceiling['grid_best']}/{ceiling['runs']}, cosine {ceiling['cosine']}/{ceiling['runs']}, "
          f"the better of the two {ceiling['either']}/{ceiling['runs']}")
    if noise:
        f = noise_ceiling(results, noise)
        print(f"within {evaluation.RANGE_NEAR}x of the grid-best at the grid-best rate itself, its rows in other "
              f"orders (expected over the {f['runs']} mis-set runs with noise runs): {f['expected']:.1f} "
              f"({f['expected'] / max(f['runs'], 1):.2f}); meta_rescue within {evaluation.RANGE_NEAR}x on the "
              f"task-seeds where every reordered run is: {f['steady'][0]}/{f['steady'][1]}, elsewhere "
              f"{f['unsteady'][0]}/{f['unsteady'][1]}")
    print("\nruns the rescue changed (grid-best; alone -> with the rescue; its actions):")
    for r in results:
        for setting, c in [*r["settings"].items(), *((name, r[name]) for name in ("cosine", "well_set") if name in r)]:
            if not all(arm in c for arm in ARMS):
                continue
            alone, rescued = _loss(c["meta"]), _loss(c["meta_rescue"])
            if alone != rescued:
                actions = "; ".join(f"epoch {a.get('epoch')}: {a.get('trigger')}" for a in c["meta_rescue"]["rescues"])
                print(f"  {r['family']}/{r['seed']} {setting}: best {r['best_val_loss']:.4g}; "
                      f"{alone:.4g} -> {rescued:.4g} ({actions})")


def compare(before: list[dict], after: list[dict], arm: str = "meta_rescue") -> dict:
    """`arm` in `after` against `before` (the same task-seeds; e.g. with and without
    `--high-rate`): per run, the final loss over the grid-best (mis-set) or over the run without
    the adjuster (well-set), and the high-rate check's actions; the counts over all of them."""
    earlier = {(r["family"], r["seed"]): r for r in before}
    counts = {"misset": 0, "within_1.2x": [0, 0], "within_1.5x": [0, 0], "well_set": 0, "harmed": [0, 0],
              "moved_misset": 0, "moved_well_set": 0}
    for r in after:
        b = earlier.get((r["family"], r["seed"]))
        if b is None:
            continue
        for setting, c in r["settings"].items():
            was, now, best = _loss(b["settings"][setting][arm]), _loss(c[arm]), r["best_val_loss"]
            counts["misset"] += 1
            for key, bound in (("within_1.2x", 1.2), ("within_1.5x", 1.5)):
                counts[key][0] += was <= bound * best
                counts[key][1] += now <= bound * best
            counts["moved_misset"] += _print_row(r, setting, was / best, now / best, c[arm])
        for name in ("cosine", "well_set"):
            without = _loss(r[name]["without"])
            was, now = _loss(b[name][arm]), _loss(r[name][arm])
            counts["well_set"] += 1
            counts["harmed"][0] += was > 1.05 * without
            counts["harmed"][1] += now > 1.05 * without
            counts["moved_well_set"] += _print_row(r, name, was / without, now / without, r[name][arm])
    print(json.dumps(counts))
    return counts


def _print_row(result, setting, was, now, run):
    actions = [d["action"] for d in run["decisions"] if d.get("trigger") == "high_rate"]
    print(f"  {result['family']}/{result['seed']} {setting}: {was:.2f}x -> {now:.2f}x; checks: {actions}")
    return any(action != "keep" for action in actions)


def _check_epochs(given):
    """`--high-rate`'s epochs: `None` without the flag, the check's own with it alone."""
    if given is None:
        return None
    return tuple(given) or CHECK_EPOCHS


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path, help="meta_adjust.py or table_results.py results files")
    parser.add_argument("--merge", nargs="+", type=Path, help="no runs: the summary of these files' results")
    parser.add_argument("--out", type=Path, help="where this script's results go (JSON)")
    parser.add_argument("--range-start", action="store_true",
                        help="both arms start from the range test (RangeTestStart)")
    parser.add_argument("--meta-model", default="default",
                        help="the meta-model of both arms: a .keras file, or the shipped default")
    parser.add_argument("--consult-every", type=int, default=None,
                        help="the adjuster's trigger also consults the meta-model after this many observations "
                             "without an adjustment (kadapt.meta.Trigger(consult_every=N)); 0: the rules "
                             "only; default: the adjuster's default trigger")
    parser.add_argument("--noise", nargs="+", type=Path,
                        help="well_set_noise.py --out files: print the noise ceiling of the within-1.2x figure")
    parser.add_argument("--no-restart", action="store_true",
                        help="both arms with MetaAdjuster(restart=False): no restart from the initial state")
    parser.add_argument("--high-rate", nargs="*", type=int, metavar="EPOCH",
                        help="both arms with the too-high-rate check (kadapt.meta.HighRateCheck on the training "
                             "rows), at these epoch ends (default: its own, 2 and 4)")
    parser.add_argument("--settings", nargs="+", default=list(evaluation.SETTINGS), choices=evaluation.SETTINGS,
                        help="the mis-set settings to run (the well-set runs always run)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS, help="the arms to run")
    parser.add_argument("--order", type=int, default=0,
                        help="train both arms with the training rows in this other order (the permutation "
                             "well_set_noise.py's --orders draws); 0: as given")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="comma-separated results files of this script: AFTER's runs against BEFORE's")
    args = parser.parse_args()
    if args.compare:
        before, after = ([r for path in files.split(",") for r in json.loads(Path(path).read_text())["results"]]
                         for files in args.compare)
        compare(before, after)
        return
    if args.merge:
        results = [r for path in args.merge for r in json.loads(path.read_text())["results"]]
    else:
        if not args.results:
            parser.error("give results files to run on, or --merge this script's outputs")
        results = [run_task(base, args.range_start, args.meta_model, args.consult_every, not args.no_restart,
                            _check_epochs(args.high_rate), tuple(args.settings), tuple(args.arms), args.order)
                   for path in args.results
                   for base in json.loads(path.read_text())["runs"]]
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"results": results}, indent=1, default=float).replace("NaN", "null"))
    noise = [run for path in args.noise or () for run in json.loads(path.read_text())["runs"]]
    print_summary(results, noise)


if __name__ == "__main__":
    main()
