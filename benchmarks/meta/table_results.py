"""Results files for `meta_adjust.py --rerun-range-start`, rebuilt from a per-run table of meta_adjust.

The arms that do not depend on the range-test start (grid-best, constant,
plateau, the MetaAdjuster alone, cosine without and with it, range test then
constant / cosine, the anchors) are deterministic: a rerun reproduces them to
the digit. So the start's arms can be run again against a table's values,
without its results files. This reads the per-run rows of
`kadapt.cli.meta_evaluation.table` (values at the 4 digits shown, the decisions as
their text), computes each task-seed's untrained validation loss (the rescue
figure's reference: not in the table), and writes one results file per
task-seed (`DIR/base_FAMILY_SEED.json`). Its range-start arms hold the table's
values until `--rerun-range-start` replaces them.

    python benchmarks/meta/table_results.py --table benchmarks/meta/per_run_table.md --out runs/base
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from kadapt.cli import meta_evaluation as evaluation

_ROW = re.compile(r"^\| (" + "|".join(evaluation.EVALUATION_FAMILIES) + r") \| (\d+) \| ")
_COLUMNS = ("family", "seed", "best_rate", "best_val_loss", "settings", "cosine", "well_set", "anchors",
            "range_test", "meta_decisions", "range_decisions")


def _number(text):
    text = text.strip()
    return math.nan if text.lower() == "nan" else float(text)


def _run(value):
    return {"val_loss": _number(value), "seconds": 0.0}


def _decisions(text):
    """`"lr x10, lr x10 (+2 kept)"` as decisions whose text the table shows the same."""
    match = re.match(r"^(.*?)(?: \(\+(\d+) kept\))?$", text.strip())
    applied, kept = match.group(1), int(match.group(2) or 0)
    actions = [] if applied == "none" else applied.split(", ")
    return [{"action": action} for action in actions] + [{"action": "keep"}] * kept


def _by_setting(text):
    """`"too_low: a, b; cosine: none"` -> `{"too_low": "a, b", "cosine": "none"}`."""
    return dict(part.split(": ", 1) for part in text.split("; "))


def parse_row(line):
    """One task-seed's results dict from its row of the per-run table."""
    cells = dict(zip(_COLUMNS, (c.strip() for c in line.strip().strip("|").split(" | ")), strict=True))
    meta_decisions, range_decisions = _by_setting(cells["meta_decisions"]), _by_setting(cells["range_decisions"])
    settings = {}
    for part in cells["settings"].split("; "):
        head, values = part.split(": ")
        name, rate = head.split(" ")
        constant, plateau, meta, meta_range = (_run(v) for v in values.split(" / "))
        meta["decisions"] = _decisions(meta_decisions[name])
        meta_range["decisions"] = _decisions(range_decisions[name])
        settings[name] = {"learning_rate": float(rate), "constant": constant, "plateau": plateau, "meta": meta,
                          "meta_range": meta_range}
    without, with_, with_range = (_run(v) for v in cells["cosine"].split(" / "))
    with_["decisions"] = _decisions(meta_decisions["cosine"])
    with_range["decisions"] = _decisions(range_decisions["cosine"])
    well_without, well_range = (_run(v) for v in cells["well_set"].split(" / "))
    well_range["decisions"] = _decisions(range_decisions["well-set"])
    rate, losses = cells["range_test"].split(": ")
    constant, cosine = (_run(v) for v in losses.split(" / "))
    recorded = cells["anchors"].split(" / ")  # the first anchors of `ANCHORS`: a table of 2026-12-04 has three
    anchors = dict(zip(list(evaluation.ANCHORS)[:len(recorded)], map(_run, recorded), strict=True))
    return {"family": cells["family"], "seed": int(cells["seed"]), "best_rate": float(cells["best_rate"]),
            "best_val_loss": float(cells["best_val_loss"]), "settings": settings,
            "cosine": {"without": without, "with": with_, "with_range": with_range},
            "well_set": {"without": well_without, "with_range": well_range},
            "range_test": {"learning_rate": _number(rate), "constant": constant, "cosine": cosine},
            "anchors": anchors}


def read_table(path):
    """The runs of the per-run table in the Markdown file at `path`, as `parse_row` makes them."""
    # Other tables (well_set_noise's) start their rows with a family and a seed too: the per-run
    # table's rows are those with its columns.
    return [parse_row(line) for line in Path(path).read_text().splitlines()
            if _ROW.match(line) and len(line.strip().strip("|").split(" | ")) == len(_COLUMNS)]


def initial_val_loss(family, seed, best_rate):
    """The untrained model's validation loss, as `evaluation.evaluate_task` measures it."""
    task = evaluation.evaluation_task(family, seed, best_rate)
    return float(task.build().evaluate(task.data[2], task.data[3], batch_size=256, verbose=0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, required=True, help="a Markdown file holding the per-run table")
    parser.add_argument("--out", type=Path, required=True, help="the directory of the results files")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for run in read_table(args.table):
        run["initial_val_loss"] = initial_val_loss(run["family"], run["seed"], run["best_rate"])
        path = args.out / f"base_{run['family']}_{run['seed']}.json"
        path.write_text(json.dumps({"config": {"table": str(args.table)}, "runs": [run], "overhead": None,
                                    "seconds": 0.0}, indent=1).replace("NaN", "null"))
        print(f"{path}: initial val loss {run['initial_val_loss']:.4g}")


if __name__ == "__main__":
    main()
