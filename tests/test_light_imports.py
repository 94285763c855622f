"""With TensorFlow installed and Keras on JAX, importing kadapt loads no TensorFlow.

(tests/test_without_tensorflow.py blocks TensorFlow's import instead: this also catches an
import that a `try: import tensorflow` would have hidden there.)"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backends("tensorflow", "jax")

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("tensorflow", "jax", "keras")


def loaded_after(code, backend):
    """The frameworks in `sys.modules` of a fresh process after `code` runs, on Keras `backend`."""
    environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    report = f"import json, sys\n{code}\nprint(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", report], env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tensorflow_is_installed_so_the_light_imports_mean_something():
    # Found on the path, not imported: a fresh process importing it cost 10 s of the suite.
    assert importlib.util.find_spec("tensorflow") is not None


@pytest.mark.backends("jax")  # its process is on JAX whatever this one's backend: the JAX half runs it
def test_kadapt_and_kadapt_meta_load_no_tensorflow_on_jax():
    loaded = loaded_after("import kadapt, kadapt.meta, kadapt.batching", "jax")
    assert "tensorflow" not in loaded, loaded


def test_importing_kadapt_loads_no_framework():
    # So a program, and the `kadapt` command, can set TensorFlow's process settings first.
    assert loaded_after("import kadapt", "tensorflow") == []


LAUNCHER = """
import json, subprocess, sys

started, real = [], subprocess.Popen


class Finished:
    returncode = 0

    def poll(self):
        return 0

    def wait(self):
        return 0


def popen(command, *args, **kwargs):
    if command[1:3] == ["-m", "kadapt.cli"]:  # a worker: recorded, not run
        place = {k: v for k, v in kwargs["env"].items() if k == "TF_CONFIG" or k.startswith("KERAS_DISTRIBUTION_")}
        started.append([command[3:], sorted(place)])
        return Finished()
    return real(command, *args, **kwargs)


subprocess.Popen = popen
from kadapt.cli import main

code = main(["train", "--workers", "2", "--data", "digits", "--out", sys.argv[1]])
print(json.dumps({"code": code, "started": started,
                  "loaded": [m for m in ("tensorflow", "jax", "keras") if m in sys.modules]}))
"""


PLACES = {"tensorflow": ["TF_CONFIG"], "jax": ["KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                                             "KERAS_DISTRIBUTION_PROCESS_ID"]}


def test_the_workers_launcher_loads_no_backend(tmp_path):
    # The workers are recorded instead of started; TensorFlow's launcher still asks a child process for the GPUs.
    # Each half of the suite tries its own backend's workers (KERAS_BACKEND: unset is TensorFlow).
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    out = str(tmp_path / "run")
    environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", LAUNCHER, out], env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert report["started"] == [[["train", "--data", "digits", "--out", out], PLACES[backend]]] * 2
    assert report["loaded"] == []
