"""Reading a large CSV: kadapt's data phase against pandas and pyarrow on the same file (issue 63, item 5).

A seeded CSV of ROWS rows (10 numeric columns x0..x9, a 5-value string column `city`, a 0/1 `label`;
~170 MB at 2,000,000 rows) and one of SMALL_ROWS rows are written in a temporary folder; each
measurement runs in a fresh process:
  pandas    `pandas.read_csv(big.csv)`: seconds, and the process's peak RSS after the read less
            its resident memory before it (after `import pandas`; Linux' /proc/self/statm)
  pyarrow   `pyarrow.csv.read_csv(big.csv)`, the same
  kadapt    `python -m kadapt train --data big.csv --target label --epochs 1 --max-steps 20 --out RUN`
            on the checkout this script lives in: the "data" phase's seconds from RUN/run.json, the
            child's peak RSS (`os.wait4`); the extra memory is that peak less the peak of the same
            command on the SMALL_ROWS file (TensorFlow, the network and the rest weigh the same).
            `--max-steps 20` cuts the training (the data phase reads, splits and encodes every row
            whatever the steps); the rest (evaluation on the 20% test rows, saving) still runs.
The three run in turn `--repeat` times (3), each figure the median of its runs: on a 2-core virtual
machine one process's read of the same file varied by a quarter from run to run.
Targets (issue 63): kadapt's data phase <= 3x pandas' read time, its extra peak memory <= 2x pandas'.

    python benchmarks/recipe/table_scale.py                     # ~4 minutes on 2 cores at 2M rows
    python benchmarks/recipe/table_scale.py --rows 200000 --out scale.json
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

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose kadapt is measured
ROWS, SMALL_ROWS, SEED = 2_000_000, 20_000, 0
CITIES = ("Lyon", "Oslo", "Porto", "Quito", "Turku")
KADAPT_FLAGS = ("--epochs", "1", "--max-steps", "20")
KADAPT_TIMEOUT_S = 1200
TIME_RATIO, MEMORY_RATIO = 3.0, 2.0
READER = '''import json, os, resource, sys, time
import {module}
with open("/proc/self/statm") as statm:  # resident pages now (the peak so far may be an import's)
    before = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024
started = time.perf_counter()
table = {call}(sys.argv[1])
seconds = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"seconds": seconds, "extra_mb": (after - before) / 1024, "rows": table.num_rows
                  if hasattr(table, "num_rows") else len(table)}}))
'''
READERS = {"pandas": ("pandas", "pandas.read_csv"), "pyarrow": ("pyarrow.csv", "pyarrow.csv.read_csv")}


def write_table(path, rows, seed):
    """A CSV of `rows` rows: x0..x9 (4 decimals, scales 1e-2 .. 1e4), city, label (a logistic of them)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 10)) * 10.0 ** np.linspace(-2, 4, 10)
    city = rng.integers(0, len(CITIES), rows)
    logit = x[:, 0] * 50 - x[:, 5] / 30 + (city - 2) * 0.5
    table = pd.DataFrame({f"x{i}": x[:, i].round(4) for i in range(10)})
    table["city"] = np.asarray(CITIES)[city]
    table["label"] = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    table.to_csv(path, index=False)


def median_run(runs, keys):
    """The run of `runs` (dicts) with the median `keys[0]`, each of `keys` the median of the runs'."""
    middle = dict(sorted(runs, key=lambda run: run[keys[0]] if run.get(keys[0]) is not None else float("inf"))
                  [len(runs) // 2])
    for key in keys:
        values = [run[key] for run in runs if run.get(key) is not None]
        middle[key] = float(np.median(values)) if values else None
    return {**middle, "runs": runs}


def ratio(mine, base):
    return mine / base if base > 0 else float("inf")


def reader(name, path):
    module, call = READERS[name]
    done = subprocess.run([sys.executable, "-c", READER.format(module=module, call=call), str(path)],
                          check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def kadapt(path, out):
    """`{"seconds": data phase, "peak_mb": child's peak RSS, "wall": s, "completed": bool, ...}`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, "-m", "kadapt", "train", "--data", str(path), "--target", "label", *KADAPT_FLAGS,
               "--out", str(out)]
    started = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out.parent)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    record = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    phases = record.get("seconds", {})
    result = {"completed": status == 0, "wall": round(wall, 1), "peak_mb": round(usage.ru_maxrss / 1024),
              "seconds": phases.get("data"), "phases": phases}
    if status != 0:
        lines = [line for line in (out.parent / f"{out.name}.log").read_text().splitlines() if line.strip()]
        result["outcome"] = lines[-1] if lines else f"exit status {status}"
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--out", help="write the figures to this JSON file")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement, in turn (the median counts)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        big, small = folder / "big.csv", folder / "small.csv"
        started = time.perf_counter()
        write_table(big, args.rows, SEED)
        write_table(small, SMALL_ROWS, SEED)
        print(f"wrote {args.rows} rows, {big.stat().st_size / 1e6:.0f} MB, in {time.perf_counter() - started:.0f} s",
              flush=True)
        figures = {"rows": args.rows, "megabytes": round(big.stat().st_size / 1e6),
                   "cpu": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "load_before": os.getloadavg()}
        runs = {name: [] for name in (*READERS, "kadapt_small", "kadapt")}
        for round_ in range(args.repeat):
            for name in READERS:
                runs[name].append(reader(name, big))
                print(name, json.dumps(runs[name][-1]), flush=True)
            runs["kadapt_small"].append(kadapt(small, folder / f"run_small{round_}"))
            print("kadapt", SMALL_ROWS, "rows", json.dumps(runs["kadapt_small"][-1]), flush=True)
            runs["kadapt"].append(kadapt(big, folder / f"run_big{round_}"))
            print("kadapt", args.rows, "rows", json.dumps(runs["kadapt"][-1]), flush=True)
        for name in READERS:
            figures[name] = median_run(runs[name], ("seconds", "extra_mb"))
        for name in ("kadapt_small", "kadapt"):
            figures[name] = median_run(runs[name], ("seconds", "peak_mb", "wall"))
    figures["load_after"] = os.getloadavg()
    pandas, mine, base = figures["pandas"], figures["kadapt"], figures["kadapt_small"]
    lines = ["| reader | seconds | extra peak memory, MB | vs pandas: time | vs pandas: memory |",
             "|---|---|---|---|---|"]
    for name in READERS:
        lines.append(f"| {name} read_csv | {figures[name]['seconds']:.1f} | {figures[name]['extra_mb']:.0f} | "
                     f"{ratio(figures[name]['seconds'], pandas['seconds']):.2f}x | "
                     f"{ratio(figures[name]['extra_mb'], pandas['extra_mb']):.2f}x |")
    if mine["completed"] and mine["seconds"] is not None:
        extra = mine["peak_mb"] - base["peak_mb"]
        time_ratio, memory_ratio = ratio(mine["seconds"], pandas["seconds"]), ratio(extra, pandas["extra_mb"])
        lines.append(f"| kadapt train, data phase | {mine['seconds']:.1f} | {extra:.0f} (peak {mine['peak_mb']} less "
                     f"{base['peak_mb']} at {SMALL_ROWS} rows) | {time_ratio:.2f}x | {memory_ratio:.2f}x |")
        lines.append(f"\ntargets: data phase <= {TIME_RATIO:g}x pandas' time: "
                     f"{'met' if time_ratio <= TIME_RATIO else 'NOT met'}; "
                     f"extra peak memory <= {MEMORY_RATIO:g}x pandas': "
                     f"{'met' if memory_ratio <= MEMORY_RATIO else 'NOT met'}; kadapt's whole command "
                     f"{mine['wall']:.0f} s, phases {mine['phases']}")
    else:
        lines.append(f"| kadapt train | stops: {mine.get('outcome')} | peak {mine['peak_mb']} | - | - |")
    lines.append(f"load average (1/5/15 min) {'/'.join(f'{v:.1f}' for v in figures['load_before'])} before, "
                 f"{'/'.join(f'{v:.1f}' for v in figures['load_after'])} after")
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(json.dumps({**figures, "command": sys.argv, "report": text}, indent=1))


if __name__ == "__main__":
    main()
