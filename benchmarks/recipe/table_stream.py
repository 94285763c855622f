"""A CSV larger than the memory a run takes: `kadapt train` and `kadapt predict` stream it (issue 63, item 5).

A seeded CSV of ROWS rows, table_scale.py's columns (10 numeric x0..x9, a 5-value `city`, a 0/1
`label` drawn from a logistic of them; ~91 bytes a row), written a million rows at a time, then,
each in a fresh process on the checkout this script lives in:
  train    `python -m kadapt train --data big.csv --target label --epochs 1 --batch-size 4096 --out RUN`
           with its default `--stream auto` (the file must be streamed because it is large, not because
           a flag says so): its wall time, phases, test accuracy and peak RSS (`os.wait4`);
  predict  `python -m kadapt predict RUN --data big.csv --output predictions.csv`: the same.
Target (issue 63): the file at least 3x the peak RSS of the run that trains on it to completion.
The Bayes accuracy (the label's own logistic, known here) is the ceiling the test accuracy is read against.

    python benchmarks/recipe/table_stream.py --folder /tmp/stream      # ~15 minutes on 2 cores at 50M rows
    python benchmarks/recipe/table_stream.py --rows 2000000 --folder /tmp/stream --out stream.json
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose kadapt is measured
ROWS, CHUNK_ROWS, SEED = 50_000_000, 1_000_000, 0
CITIES = ("Lyon", "Oslo", "Porto", "Quito", "Turku")
TRAIN_FLAGS = ("--epochs", "1", "--batch-size", "4096", "--fit-verbose", "2")
FILE_TO_PEAK = 3.0


def write_table(path, rows, seed):
    """The CSV, a chunk at a time; returns the Bayes accuracy of its labels (the logistic's own)."""
    right = 0
    with open(path, "w") as file:
        file.write(",".join([f"x{i}" for i in range(10)] + ["city", "label"]) + "\n")
        for start in range(0, rows, CHUNK_ROWS):
            count = min(CHUNK_ROWS, rows - start)
            rng = np.random.default_rng([seed, start])
            x = (rng.normal(size=(count, 10)) * 10.0 ** np.linspace(-2, 4, 10)).round(4)
            city = rng.integers(0, len(CITIES), count)
            probability = 1 / (1 + np.exp(-(x[:, 0] * 50 - x[:, 5] / 30 + (city - 2) * 0.5)))
            label = (rng.random(count) < probability).astype(int)
            right += int(np.sum((probability > 0.5) == label))
            columns = [np.char.mod("%.4f", x[:, i]) for i in range(10)] + [np.asarray(CITIES)[city],
                                                                            label.astype(str)]
            file.write("\n".join(",".join(row) for row in zip(*columns)) + "\n")
    return right / rows


def child(command, folder, name):
    """`{"completed", "wall", "peak_mb", "tail"}` of a kadapt command in a fresh process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TF_CPP_MIN_LOG_LEVEL="2")
    started = time.perf_counter()
    with open(folder / f"{name}.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "kadapt", *command], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=folder)
        _, status, usage = os.wait4(process.pid, 0)
    lines = [line for line in (folder / f"{name}.log").read_text().splitlines() if line.strip()]
    return {"completed": status == 0, "wall": round(time.perf_counter() - started, 1),
            "peak_mb": round(usage.ru_maxrss / 1024), "tail": lines[-6:]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--folder", required=True, help="where the CSV and the run go (kept: delete it after)")
    parser.add_argument("--out", help="write the figures to this JSON file")
    args = parser.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    big = folder / "big.csv"
    started = time.perf_counter()
    bayes = write_table(big, args.rows, SEED)
    megabytes = big.stat().st_size / 2**20
    print(f"wrote {args.rows} rows, {megabytes:.0f} MiB, in {time.perf_counter() - started:.0f} s", flush=True)
    figures = {"rows": args.rows, "file_mib": round(megabytes), "bayes_accuracy": round(bayes, 4),
               "cpu": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    run = folder / "run"
    figures["train"] = child(["train", "--data", "big.csv", "--target", "label", *TRAIN_FLAGS, "--out", "run",
                              "--overwrite"], folder, "train")
    record = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    figures["train"].update(test_accuracy=record.get("test_accuracy"), phases=record.get("seconds"))
    print("train", json.dumps(figures["train"]), flush=True)
    figures["predict"] = child(["predict", "run", "--data", "big.csv", "--output", "predictions.csv"], folder,
                               "predict")
    print("predict", json.dumps(figures["predict"]), flush=True)
    train, predict = figures["train"], figures["predict"]
    lines = ["| command | completed | wall, s | peak RSS, MiB | file / peak RSS | test accuracy (Bayes "
             f"{bayes:.4f}) |", "|---|---|---|---|---|---|"]
    for name, result in (("kadapt train", train), ("kadapt predict", predict)):
        accuracy = f"{result['test_accuracy']:.4f}" if result.get("test_accuracy") is not None else "-"
        lines.append(f"| {name} | {result['completed']} | {result['wall']:.0f} | {result['peak_mb']} | "
                     f"{megabytes / result['peak_mb']:.2f}x | {accuracy} |")
    met = train["completed"] and megabytes / train["peak_mb"] >= FILE_TO_PEAK
    lines.append(f"\n{args.rows} rows, {megabytes:.0f} MiB; target: the file >= {FILE_TO_PEAK:g}x the training "
                 f"run's peak RSS: {'met' if met else 'NOT met'}; train phases {train.get('phases')}")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
