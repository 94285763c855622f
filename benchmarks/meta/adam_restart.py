"""Adam after a restart of its slots: the bias correction counted from the restart or from the step count.

The `MetaAdjuster` with `DeadRunRescue` after it (the pair `kadapt train` runs) on
the held-out task families with kadapt's `Adam` (beta_1 0.9) at constant rates
too high for it, 20 epochs, each task-seed's data, initialization and batches
the same in both arms. A restart from the initial state, a restart after a
repeated divergence and the rescue zero the optimizer's slots while the step
count goes on. Arm "from the restart" is kadapt as it ships
(`RestartableMoments.slots_restarted` sets `moments_from`); arm "from the step
count" leaves `moments_from` at 0, as kadapt did before (and Keras' own Adam
does), so the first steps after a restart are up to several times a corrected
step. Runs without a restart of the slots train the same in both arms (checked).

    .venv/bin/python benchmarks/meta/adam_restart.py --seeds 3 4 5 --rates 0.03 0.3   # ~7 min on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from kadapt import environment

environment.load_tensorflow()

from kadapt.cli import meta_evaluation as evaluation  # noqa: E402
from kadapt.meta.records import tasks as task_lib  # noqa: E402
from kadapt.optimizers.live_variables import RestartableMoments  # noqa: E402

FAMILIES = ("iris", "circles", "friedman", "fashion_conv", "adding", "fashion_autoencoder")
SHIPPED = RestartableMoments.slots_restarted


def run(family: str, seed: int, rate: float, from_restart: bool) -> dict:
    """One pair run on Adam; the final validation loss and how often the slots restarted."""
    restarts = []

    def slots_restarted(optimizer):
        restarts.append(int(optimizer.iterations.numpy()))
        if from_restart:
            SHIPPED(optimizer)

    RestartableMoments.slots_restarted = slots_restarted
    try:
        task = task_lib.make_task(family, seed, rate, "adam", "constant")
        task = dataclasses.replace(task, momentum=0.9)
        result = evaluation.meta_run(task, evaluation.EPOCHS, "default", rescue=True)
    finally:
        RestartableMoments.slots_restarted = SHIPPED
    return {"val_loss": result["val_loss"], "restarts_at_step": restarts,
            "decisions": [d["action"] for d in result["decisions"]],
            "rescues": [d["trigger"] for d in result.get("rescues", [])]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[3])
    parser.add_argument("--rates", nargs="+", type=float, default=[0.03, 0.3])
    parser.add_argument("--out", type=Path, help="results (JSON)")
    args = parser.parse_args()
    results = []
    for family in args.families:
        for seed in args.seeds:
            for rate in args.rates:
                arms = {name: run(family, seed, rate, name == "from_restart")
                        for name in ("from_restart", "from_step_count")}
                results.append({"family": family, "seed": seed, "learning_rate": rate, **arms})
                print(_line(results[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"results": results}, indent=1))
    _summary(results)


def _line(r):
    a, b = r["from_restart"], r["from_step_count"]
    return (f"{r['family']}/{r['seed']} Adam {r['learning_rate']:g}: from the restart {a['val_loss']:.4g} "
            f"(slots restarted at steps {a['restarts_at_step']}), from the step count {b['val_loss']:.4g} "
            f"({b['restarts_at_step']}); decisions {a['decisions']} / {b['decisions']}")


def _summary(results):
    restarted = [r for r in results if r["from_restart"]["restarts_at_step"]]
    same = [r for r in results if not r["from_restart"]["restarts_at_step"]]
    lower = sum(_loss(r["from_restart"]) < _loss(r["from_step_count"]) for r in restarted)
    higher = sum(_loss(r["from_restart"]) > _loss(r["from_step_count"]) for r in restarted)
    identical = sum(_loss(r["from_restart"]) == _loss(r["from_step_count"]) for r in same)
    print(f"{len(results)} runs; {len(restarted)} restarted their slots: from the restart lower on {lower}, "
          f"higher on {higher}; the {len(same)} others identical in both arms: {identical} of {len(same)}")


def _loss(arm):
    value = arm["val_loss"]
    return value if value is not None and math.isfinite(value) else math.inf


if __name__ == "__main__":
    main()
