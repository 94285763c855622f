"""The short-horizon bias, measured on a record store: what a 3-epoch score picks against the end of the run.

Every record of `kadapt.meta.collect` carries two scores of its candidate: at
the end of the task's budget (`score`, what the meta-model learns) and after
the short horizon (`score_short`, the score the first records used). At each
decision point this compares the candidate each score ranks best: how often
each picks a cut of the learning rate (x0.1, x0.3) or the largest cut, and
what following the short horizon's pick costs at the end of the run (regret in
log validation loss against the end-of-run best). Split by whether the rate
was high for the task (the short pick is a cut) is the over-cutting the
3-epoch records taught.

    .venv/bin/python benchmarks/meta/meta_horizon.py runs/meta/records.sqlite
"""

import argparse

import numpy as np

from kadapt.meta import RecordStore
from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.meta_model import decision_data

CUTS = [i for i, a in enumerate(action_lib.ACTIONS) if a.get("learning_rate_multiplier", 1.0) < 1.0]
LARGEST_CUT = next(i for i, a in enumerate(action_lib.ACTIONS) if a.get("learning_rate_multiplier") == 0.1)


def compare(records):
    """Per decision point with both scores: the end-of-run pick, the short pick, the end-of-run
    regret of the short pick, the family."""
    end, short = decision_data(records), decision_data(records, score="score_short")
    both = np.isfinite(end.scores).sum(axis=1) > 1
    if len(end) != len(short) or not both.any():
        raise ValueError("the records lack the short score on some decision points")
    end_pick, short_pick = end.scores.argmin(axis=1), short.scores.argmin(axis=1)
    rows = np.arange(len(end))
    regret = end.scores[rows, short_pick] - end.scores[rows, end_pick]
    return [row for row, keep in zip(zip(end_pick, short_pick, regret, end.families), both, strict=True) if keep]


def summary(rows):
    end, short, regret = (np.array([r[i] for r in rows]) for i in range(3))
    return {"points": len(rows), "end: a cut": np.mean(np.isin(end, CUTS)),
            "short: a cut": np.mean(np.isin(short, CUTS)),
            "end: x0.1": np.mean(end == LARGEST_CUT), "short: x0.1": np.mean(short == LARGEST_CUT),
            "same pick": np.mean(end == short), "end regret of the short pick": np.mean(regret)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    args = parser.parse_args()
    try:
        rows = compare(list(RecordStore(args.store)))
    except ValueError as error:
        raise SystemExit(f"{args.store}: no records with both scores (collected before the end-of-run score?): {error}")
    groups = {"all": rows, "short pick is a cut": [r for r in rows if r[1] in CUTS]}
    for family in sorted({r[3] for r in rows}):
        groups[family] = [r for r in rows if r[3] == family]
    names = list(summary(rows))
    print("| subset | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for name, subset in groups.items():
        figures = summary(subset)
        print(f"| {name} | " + " | ".join(f"{figures[n]:.2f}" if n != "points" else str(figures[n]) for n in names) + " |")


if __name__ == "__main__":
    main()
