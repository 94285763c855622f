#!/usr/bin/env bash
# Builds the wheels benchmarks/gpu/gpu_check_jax.py needs on a GPU machine with JAX
# (CUDA) and no network: keras, keras-tuner, kadapt and their small pure-Python
# dependencies (`pip wheel --no-deps`, from this environment's pip cache or
# index), checks they total under 64 MiB, and prints the command to run there.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${1:-build/gpu_check_jax_wheels}
LIMIT_BYTES=$((64 * 1024 * 1024))
mkdir -p "$OUT"
# keras' and keras-tuner's dependencies (h5py has binaries; numpy, ml-dtypes and jax come with the GPU
# machine's JAX). kadapt's wheel is installed --no-deps: TensorFlow is left out.
"$PY" -m pip wheel --no-deps -q -w "$OUT" . keras keras-tuner absl-py rich namex optree \
    markdown-it-py mdurl pygments kt-legacy packaging requests urllib3 idna certifi \
    charset-normalizer h5py
TOTAL=$(du -cb "$OUT"/*.whl | tail -1 | cut -f1)
echo "wheels: $(ls "$OUT" | wc -l) files, $((TOTAL / 1024 / 1024)) MiB in $OUT"
if [ "$TOTAL" -ge "$LIMIT_BYTES" ]; then
    echo "over 64 MiB: $TOTAL bytes" >&2
    exit 1
fi
echo "on the GPU machine (JAX with CUDA installed):"
echo "  pip install --no-index --no-deps $OUT/*.whl && KERAS_BACKEND=jax python benchmarks/gpu/gpu_check_jax.py gpu_check_jax.json"
