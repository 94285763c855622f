"""Anchors at their defaults on the held-out task-seeds, beside the grid-best of the per-run table (issue 65).

Each anchor named (by default Keras' own `ScheduleFreeAdamW` and `Muon`, the arms the
per-run table of 2026-12-04 lacks) replaces the task's optimizer, one run per task-seed,
as `kadapt.cli.meta_evaluation.anchor_runs` trains them (the same data, initialization,
batches and epochs as every arm); its final validation loss against the grid-best of
`benchmarks/meta/per_run_table.md` (`table_results.py`): the shares within 1.2x and 1.5x,
and below the best of the table's own anchors.

    .venv/bin/python benchmarks/meta/keras_anchors.py --out runs/anchors.json     # ~15 min on 2 cores
    .venv/bin/python benchmarks/meta/keras_anchors.py --anchors keras_muon --families iris --seeds 3
"""

import argparse
import json
import sys
from pathlib import Path

from kadapt import environment

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

from kadapt.cli import meta_evaluation as evaluation  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import table_results  # noqa: E402

TABLE = Path(__file__).parent / "per_run_table.md"
NEW = ("keras_schedule_free_adamw", "keras_muon")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchors", nargs="+", default=list(NEW), choices=list(evaluation.ANCHORS))
    parser.add_argument("--families", nargs="+", default=None, help="default: every family of the per-run table")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: every seed of the table")
    parser.add_argument("--out", type=Path, default=None, help="write the runs and the figures as JSON")
    args = parser.parse_args(argv)
    rows = [row for row in table_results.read_table(TABLE)
            if (args.families is None or row["family"] in args.families)
            and (args.seeds is None or row["seed"] in args.seeds)]
    results = []
    for row in rows:
        task = evaluation.evaluation_task(row["family"], row["seed"], evaluation.GRID[0])
        runs = {name: evaluation.train_run(task, evaluation.EPOCHS, optimizer=evaluation.ANCHORS[name])
                for name in args.anchors}
        results.append({**{k: row[k] for k in ("family", "seed", "best_val_loss")},
                        "table_anchors": {k: v["val_loss"] for k, v in row["anchors"].items()},
                        "anchors": {k: v["val_loss"] for k, v in runs.items()}})
        print(f"{row['family']}/{row['seed']} grid-best {row['best_val_loss']:.4g}: "
              + ", ".join(f"{k} {v['val_loss']:.4g}" for k, v in runs.items()), flush=True)
    figures = summary(results, args.anchors)
    print(f"\n| anchor | runs | within 1.2x of the grid-best | within 1.5x | below the table's best anchor |\n"
          "|---|---|---|---|---|")
    for name, f in figures.items():
        print(f"| {name} | {f['runs']} | {f['within_1.2x']} | {f['within_1.5x']} | {f['below_table_anchors']} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": results, "figures": figures}, indent=1))


def summary(results, names):
    """Per anchor: how many of the runs end within 1.2x / 1.5x of the grid-best and below the table's
    anchors' best (a NaN, a diverged run, is none of these)."""
    def count(test):
        return sum(bool(test(r)) for r in results)

    return {name: {"runs": len(results),
                   "within_1.2x": count(lambda r: r["anchors"][name] <= 1.2 * r["best_val_loss"]),
                   "within_1.5x": count(lambda r: r["anchors"][name] <= 1.5 * r["best_val_loss"]),
                   "below_table_anchors": count(lambda r: r["anchors"][name] < min(r["table_anchors"].values()))}
            for name in names}


if __name__ == "__main__":
    main()
