#!/usr/bin/env bash
# GPU check, for whoever has a GPU (about five minutes): writes one JSON
# (default benchmarks/gpu/gpu_check.json; or the path given) with the devices,
# TensorFlow/Keras versions, the budget and its source, whether
# get_memory_info moves by 1 GiB for a 1 GiB tensor, each out-of-memory form
# (class and seconds; eager, tf.function, XLA, host-to-device copy), the probe
# under a logical memory_limit of 4 GiB and its size re-measured in a fresh
# process, recovery from 1.5x the size that fits (XLA and not) against a run
# at the final size, and one step under mixed_float16 and mixed_bfloat16.
# The parts are in benchmarks/gpu/gpu_check.py. Without a GPU: one line, exit 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || { python3 -m venv .venv && .venv/bin/pip install -q -e ".[gpu,test]"; }
exec "$PY" benchmarks/gpu/gpu_check.py "$@"
