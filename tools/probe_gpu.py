"""List devices and their memory, probe a model's largest micro-batch with real
trial steps, and print the plan for a logical batch. Runs on CPU too.

Same as `kadapt probe`. Examples:

    .venv/bin/python tools/probe_gpu.py --model small_cnn --batch-size 1024
    .venv/bin/python tools/probe_gpu.py --model my_model.keras --memory-budget 2GiB --json
"""

import sys

from kadapt.cli import main

if __name__ == "__main__":
    sys.exit(main(["probe", *sys.argv[1:]]))
