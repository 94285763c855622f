"""`kadapt meta collect` with 1 and 2 collector processes into one PostgreSQL store, and the
store's append latency on SQLite and on PostgreSQL.

Scaling: the same task list (--tasks-per-family tasks of each training family, the default
`CollectionConfig`) is collected twice, each time into a new empty database of one throwaway
PostgreSQL server on 127.0.0.1 (started here, as the tests do): once by `kadapt meta collect
--workers 1` (one process, all CPU threads) and once by `--workers 2` (two processes, an equal
share of the threads each). Each arm is the command itself, run as a subprocess and timed from
its start to its exit, so the start-up of TensorFlow in every process is counted. Tasks per
minute = tasks / wall minutes; the ratio is 2 collectors over 1 (ideal 2.0, target >= 1.7).
The two stores must end with the same records (run, step, action), else the script fails.

Latency: the median and 90th percentile of `RecordStore.append` (one record, one transaction)
and of `append_many` of one task's 14 records, over --appends calls each, on an SQLite file
in a temporary directory and on the server.

    python benchmarks/scale/collect_scaling.py                      # 4 tasks per family: 24 tasks
    python benchmarks/scale/collect_scaling.py --tasks-per-family 1 --appends 50   # a quick look
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import postgres  # noqa: E402  (the tests' throwaway cluster)

from kadapt.meta.model.adjustment_record import AdjustmentRecord  # noqa: E402
from kadapt.meta.records.record_store import RecordStore  # noqa: E402
from kadapt.meta.records.tasks import TRAINING_FAMILIES  # noqa: E402

TASK_RECORDS = 14  # records one small task appends at once


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks-per-family", type=int, default=4)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--output", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    with postgres.cluster() as server, tempfile.TemporaryDirectory() as folder:
        figures = {"cpus": os.cpu_count(), "tasks": args.tasks_per_family * len(TRAINING_FAMILIES)}
        stores = {}
        for workers in (1, 2):
            url = postgres.create_database(*server, f"collect_{workers}")
            seconds = _collect(url, args.tasks_per_family, workers)
            stores[workers] = url
            figures[f"workers_{workers}"] = {"seconds": round(seconds, 1),
                                             "tasks_per_minute": round(figures["tasks"] / seconds * 60, 2)}
            print(f"{workers} collector(s): {figures['tasks']} tasks in {seconds:.1f} s", flush=True)
        keys = [sorted((r.run_id, r.step, r.adjustment["action"]) for r in RecordStore(url)) for url in stores.values()]
        if keys[0] != keys[1] or not keys[0]:
            raise SystemExit("The two collections stored different records; the comparison is void.")
        figures["records"] = len(keys[0])
        figures["scaling"] = round(figures["workers_2"]["tasks_per_minute"] / figures["workers_1"]["tasks_per_minute"], 3)
        latency_url = postgres.create_database(*server, "latency")
        figures["append_ms"] = {
            "sqlite": _latency(RecordStore(Path(folder) / "latency.sqlite"), args.appends),
            "postgresql": _latency(RecordStore(latency_url), args.appends),
        }
    print(json.dumps(figures, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=1) + "\n")


def _collect(url, tasks_per_family, workers):
    command = [sys.executable, "-m", "kadapt.cli", "meta", "collect", "--store", url,
               "--families", ",".join(TRAINING_FAMILIES), "--tasks-per-family", str(tasks_per_family),
               "--workers", str(workers)]
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    start = time.perf_counter()
    subprocess.run(command, env=environment, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    return time.perf_counter() - start


def _latency(store, calls):
    rng = np.random.default_rng(0)

    def record(run, step):
        return AdjustmentRecord(run_id=f"run-{run}", task="t", family="f", step=step,
                                features=rng.normal(size=(8, 24)), hyperparameters={"learning_rate": 0.1},
                                adjustment={"action": step}, outcome={"score": 0.0})

    single, batch = [], []
    for call in range(calls):
        one = record(call, 0)
        start = time.perf_counter()
        store.append(one)
        single.append(time.perf_counter() - start)
        many = [record(calls + call, step) for step in range(TASK_RECORDS)]
        start = time.perf_counter()
        store.append_many(many)
        batch.append(time.perf_counter() - start)
    return {name: {"median": round(1e3 * float(np.median(times)), 2), "p90": round(1e3 * float(np.percentile(times, 90)), 2)}
            for name, times in (("append", single), (f"append_many_{TASK_RECORDS}", batch))}


if __name__ == "__main__":
    main()
