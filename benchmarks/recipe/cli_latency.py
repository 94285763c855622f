"""How fast the `kadapt` command answers when it has nothing to train.

Times `kadapt --help`, `kadapt train --help`, `kadapt --version` and
`kadapt report RUN` (on a run directory this script fabricates: the JSON files
of an interrupted two-epoch run), each a fresh process, ROUNDS times in
alternation, and prints the median wall seconds. None of them should import
TensorFlow (the tests check that); the target is under 1 s each.

Run: `make install && .venv/bin/python benchmarks/recipe/cli_latency.py`
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = 5
TARGET_SECONDS = 1.0


def fabricated_run(path):
    """The files `kadapt train` leaves after two epochs of eight steps, interrupted."""
    path.mkdir()
    options = {"data": "digits", "model": "mlp", "batch_size": 64, "epochs": 3, "meta": "off"}
    history = {"epoch": [0, 1], "loss": [0.9, 0.5], "accuracy": [0.7, 0.85], "val_loss": [0.8, 0.6],
               "val_accuracy": [0.72, 0.8]}
    steps = [{"step": s, "epoch": s // 8, "loss": 1.0 / (s + 1), "learning_rate": 0.1, "momentum": 0.9}
             for s in range(16)]
    (path / "config.json").write_text(json.dumps({"options": options, "resolved": {"total_steps": 24}}))
    (path / "run.json").write_text(json.dumps({"status": "interrupted"}))
    (path / "history.json").write_text(json.dumps(history))
    (path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    return path


def seconds(argv):
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kadapt.cli", *argv], check=True, capture_output=True)
    return time.perf_counter() - started


def main():
    with tempfile.TemporaryDirectory() as folder:
        run = fabricated_run(Path(folder) / "run")
        commands = {"kadapt --help": ["--help"], "kadapt train --help": ["train", "--help"],
                    "kadapt --version": ["--version"], "kadapt report RUN": ["report", str(run)]}
        times = {name: [] for name in commands}
        for _ in range(ROUNDS):
            for name, argv in commands.items():
                times[name].append(seconds(argv))
    print(f"{'command':22s} {'median s':>9s} {'min s':>7s} {'max s':>7s}  (of {ROUNDS} runs)")
    for name, values in times.items():
        verdict = "" if statistics.median(values) < TARGET_SECONDS else f"  over {TARGET_SECONDS} s"
        print(f"{name:22s} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}{verdict}")


if __name__ == "__main__":
    main()
