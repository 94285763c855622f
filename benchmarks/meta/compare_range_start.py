"""Two meta_adjust results sets side by side: the range-test-start figures and its runs, task-seed by task-seed.

Each set is a list of results files (`meta_adjust.py --out`, or its
`--rerun-range-start` of the same task-seeds); only the task-seeds both sets
hold are compared. Printed: issue 46's figures of the MetaAdjuster starting
from the range test for each set, and per task-seed the final validation loss
of its start arms (mis-set, cosine and constant at the grid-best) in each set
with the start's decision.

    python benchmarks/meta/compare_range_start.py --before runs/before/*.json --after runs/after/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kadapt.cli import meta_evaluation as evaluation

def load(paths):
    runs = [evaluation.restored(run) for path in paths for run in json.loads(Path(path).read_text())["runs"]]
    return {(run["family"], run["seed"]): run for run in runs}


def _arms(run):
    """(name, the arm's result, the loss it is judged against, and the factor of harm or None) of the start's arms."""
    arms = [(f"{name} {case['learning_rate']:g}", case["meta_range"]) for name, case in run["settings"].items()]
    arms.append(("cosine", run["cosine"]["with_range"]))
    arms.append(("well-set", run["well_set"]["with_range"]))
    return arms


def _start(result):
    """The start's decision, briefly: its action, the steps it cost, what it continued from."""
    start = next((d for d in result["decisions"] if d.get("trigger") == "range_test"), None)
    if start is None:
        return "-"
    detail = start.get("range_test", {})
    if "suggestion" not in detail:
        return f"{start['action']} (no rate read)"
    steps = detail.get("steps_run", 0) + detail.get("branch_steps", 0) * len(detail.get("branches", []))
    kept = " cont." if "continued_from" in detail else ""
    return f"{start['action']} ({steps} steps{kept})"


def _counts(summary):
    figures = summary["meta_range"]["all"]
    misset = figures["runs"]

    def share(name):
        return f"{figures[name]:.2f} ({round(figures[name] * misset)}/{misset})"

    return {"within 1.2x of the grid-best": share("near_grid_best"),
            "below range test then constant": share("beats_range_constant"),
            "below the best anchor": share("beats_anchors"),
            "mis-set harm (> 1.1x constant)": f"{round(figures['harm'] * misset)}/{misset}",
            "diverging rescued": f"{round(figures['rescue'] * figures['diverged_runs'])}/{figures['diverged_runs']}",
            "well-set harmed (> 1.05x)": f"{round(figures['well_set_harm'] * figures['well_set_runs'])}"
                                         f"/{figures['well_set_runs']}",
            "cosine unharmed": f"{round(figures['cosine_no_harm'] * figures['cosine_runs'])}/{figures['cosine_runs']}"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", type=Path, required=True)
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    parser.add_argument("--compact", action="store_true",
                        help="one row per task-seed: each start arm's final val loss, before -> after")
    args = parser.parse_args()
    before, after = load(args.before), load(args.after)
    keys = [k for k in after if k in before]
    sets = {"before": [before[k] for k in keys], "after": [after[k] for k in keys]}
    counts = {name: _counts(evaluation.summarize(runs)) for name, runs in sets.items()}
    print(f"{len(keys)} task-seeds\n\n| figure | before | after |\n|---|---|---|")
    for figure in counts["before"]:
        print(f"| {figure} | {counts['before'][figure]} | {counts['after'][figure]} |")
    if args.compact:
        return print_compact(keys, before, after)
    print("\n| task | seed | arm | grid-best / without | before | after | before's start | after's start |")
    print("|---|---|---|---|---|---|---|---|")
    for key in keys:
        b, a = before[key], after[key]
        for (name, result_b), (_, result_a) in zip(_arms(b), _arms(a), strict=True):
            reference = {"cosine": b["cosine"]["without"]["val_loss"],
                         "well-set": b["well_set"]["without"]["val_loss"]}.get(name, b["best_val_loss"])
            print(f"| {key[0]} | {key[1]} | {name} | {reference:.4g} | {result_b['val_loss']:.4g} | "
                  f"{result_a['val_loss']:.4g} | {_start(result_b)} | {_start(result_a)} |")


def print_compact(keys, before, after):
    print("\n| task | seed | grid-best loss | too_low | too_high | diverging | cosine (without) | constant (without) |")
    print("|---|---|---|---|---|---|---|---|")
    for key in keys:
        b, a = before[key], after[key]
        cells = {name.split(" ")[0]: f"{rb['val_loss']:.4g} -> {ra['val_loss']:.4g}"
                 for (name, rb), (_, ra) in zip(_arms(b), _arms(a), strict=True)}
        cells["cosine"] += f" ({b['cosine']['without']['val_loss']:.4g})"
        cells["well-set"] += f" ({b['well_set']['without']['val_loss']:.4g})"
        row = " | ".join(cells.get(name, "-") for name in ("too_low", "too_high", "diverging", "cosine", "well-set"))
        print(f"| {key[0]} | {key[1]} | {b['best_val_loss']:.4g} | {row} |")


if __name__ == "__main__":
    main()
