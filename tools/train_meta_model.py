"""Collects records on the training task families and trains the default meta-model.

Reproducible (seeded) and resumable: records already in the store are not
recomputed. The store is not committed; the model and its report are written
to kadapt/meta/model/pretrained/default.keras and default.json.

Records: `kadapt.meta.tasks.TRAINING_FAMILIES` (MLPs on tables, a conv net on
digits, a GRU on noisy waves, an autoencoder on digits; constant, cosine and
triangular rates; SGD and Adam), each branch scored at the end of its budget.

Run: `.venv/bin/python tools/train_meta_model.py [--store runs/meta/records.sqlite] [--workers 2]`
(timings: benchmarks/README.md#train_meta_model).
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

from kadapt.meta import RecordStore  # noqa: E402
from kadapt.meta import train_meta_model  # noqa: E402
from kadapt.meta import collect  # noqa: E402
from kadapt.meta.model.meta_model import DEFAULT_PATH  # noqa: E402
from kadapt.meta.records import tasks  # noqa: E402

TASKS_PER_FAMILY = 48
MAX_TRIALS = 10
SEED = 0
ENSEMBLE = 5
CONSTANT_SHARE = 0.5  # of the tasks run at a constant rate whatever their own draw (see _task_list)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="runs/meta/records.sqlite")
    parser.add_argument("--tasks-per-family", type=int, default=TASKS_PER_FAMILY)
    parser.add_argument("--max-trials", type=int, default=MAX_TRIALS)
    parser.add_argument("--output", default=str(DEFAULT_PATH))
    parser.add_argument("--workers", type=int, default=2, help="collector processes (default 2)")
    parser.add_argument("--ensemble", type=int, default=ENSEMBLE,
                        help="fits of the best hyperparameters averaged into the model (default %(default)s)")
    parser.add_argument("--constant-share", type=float, default=CONSTANT_SHARE,
                        help="share of the tasks set to a constant rate (default 0.5; the rest keep their draw)")
    args = parser.parse_args()
    if args.ensemble < 1:
        parser.error(f"argument --ensemble must be a count of fits >= 1, e.g. 5. Received: {args.ensemble}")
    if not 0.0 <= args.constant_share <= 1.0:
        parser.error(f"argument --constant-share must be a share in [0, 1], e.g. 0.5. Received: {args.constant_share}")
    Path(args.store).parent.mkdir(parents=True, exist_ok=True)
    store = RecordStore(args.store)
    started = time.time()
    task_list = _task_list(args.tasks_per_family, args.constant_share)
    collect(store, task_list, seed=SEED, workers=args.workers)
    collected = time.time()
    _, report = train_meta_model(store, Path(args.store).parent / "tuner", args.output,
                                 max_trials=args.max_trials, seed=SEED, ensemble=args.ensemble)
    print(json.dumps(report, indent=1))
    print(f"collection {collected - started:.0f} s, search and training {time.time() - collected:.0f} s; "
          f"model: {args.output}")


def _task_list(per_family, constant_share):
    """`per_family` tasks of each training family; `constant_share` of them at a constant rate.

    The adjuster consults its meta-model on a stall only where the schedule does not anneal
    (a cosine or triangular run's slowdown is left to the schedule), so most of its decisions
    are on constant-rate runs; drawn uniformly, only a third of the records' tasks are. The
    schedule is set apart from `make_task`'s own draw (which still happens), so every other
    choice of a task stays what its seed gives."""
    rng = np.random.default_rng(SEED)
    return [tasks.make_task(family, seed, schedule="constant" if rng.random() < constant_share else None)
            for seed in range(per_family) for family in tasks.TRAINING_FAMILIES]


if __name__ == "__main__":
    main()
