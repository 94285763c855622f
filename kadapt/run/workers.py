"""`kadapt train` on several workers: one launcher, each backend's own engine.

`--workers N` starts N local worker processes of the same command, each
with its place in the cluster on 127.0.0.1 and an equal share of the CPU
threads (`KADAPT_WORKER_THREADS`), and waits for them. The cluster's
variables are the backend's (`worker_setup`): `TF_CONFIG` for TensorFlow's
`tf.distribute.MultiWorkerMirroredStrategy` (a free port per worker), Keras'
`KERAS_DISTRIBUTION_*` for JAX's `jax.distributed` (process 0's coordinator
port; `kadapt.run.jax_workers`). On a GPU host each worker gets one GPU of
its own (`CUDA_VISIBLE_DEVICES`): TensorFlow and JAX take most of a GPU's
memory when they start, so a second worker on the same GPU would get almost
nothing. A `kadapt train` that finds those variables set (a worker started
so, or one of a real multi-host job) is a cluster member (`ClusterMember`,
`kadapt.run.jax_workers.JaxProcess`):

- the chief (task "chief", else worker 0) writes the run directory; every
  other worker writes only into a scratch directory of its own, a copy of
  the chief's run directory on `--resume` (so every worker's
  BackupAndRestore resumes at the same epoch);
- the logical batch (`--batch-size`) is the global one, split over the
  workers; each worker probes its own share and all train with the
  smallest micro-batch found (one collective);
- the logs that callbacks see are the same on every worker (synchronized
  on TensorFlow; global on JAX), so the MetaAdjuster and the best-weights
  choice decide the same on every worker.

The launcher itself loads no backend: it only starts the workers, each of
which loads its own, and asks a short-lived child process how many GPUs the
backend sees (a backend loaded here could hold memory the workers need; JAX
is asked only where a JAX plugin, which a GPU needs, is installed).
"""

import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from kadapt import environment
from kadapt import jax_processes
from kadapt.environment import VISIBLE_DEVICES
from kadapt.environment import visible_device_entry
from kadapt.extras import MissingExtraError
from kadapt.extras import UnsupportedBackendError
from kadapt.run.errors import UsageError

THREADS_VARIABLE = "KADAPT_WORKER_THREADS"
FEATURE = "Multi-worker training (`kadapt train --workers`)"
# Run in a child process by `visible_gpu_count`: the GPUs TensorFlow sees, or the error that says why
# this host cannot run the workers (Keras on another backend, TensorFlow not installed).
TENSORFLOW_GPU_COUNT = f"""
import json
from kadapt.extras import MissingExtraError, UnsupportedBackendError, require_tensorflow
try:
    tf = require_tensorflow({FEATURE!r})
    print(json.dumps({{"gpus": len(tf.config.list_physical_devices("GPU"))}}))
except (MissingExtraError, UnsupportedBackendError) as error:
    print(json.dumps({{"error": type(error).__name__, "message": str(error)}}))
"""
# The GPUs JAX sees (its CPU alone where it has no GPU backend).
JAX_GPU_COUNT = """
import json
import jax
try:
    print(json.dumps({"gpus": len(jax.devices("gpu"))}))
except RuntimeError:
    print(json.dumps({"gpus": 0}))
"""
CHILD_ERRORS = {error.__name__: error for error in (MissingExtraError, UnsupportedBackendError)}
POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 30  # after one worker failed, the others get this long to end on their own


@dataclasses.dataclass
class ClusterMember:
    """This process's part in a TensorFlow multi-worker run."""

    strategy: object
    index: int
    workers: int
    is_chief: bool
    process_share = None  # TensorFlow splits every global batch itself: each worker is fed all of it

    @classmethod
    def from_environment(cls):
        """The member TF_CONFIG describes, or `None` when TF_CONFIG is not set."""
        if not os.environ.get("TF_CONFIG"):
            return None
        from kadapt import distribute

        threads = os.environ.get(THREADS_VARIABLE)
        try:
            if threads:
                environment.set_cpu_threads(int(threads))
            strategy = distribute.multi_worker_strategy()  # checks TF_CONFIG first
            config = distribute.check_tf_config(bind=False)  # this process listens there now
        except ValueError as error:
            raise UsageError(str(error)) from None
        cluster, task = config["cluster"], config["task"]
        workers = sum(len(members) for members in cluster.values())
        is_chief = task["type"] == "chief" or ("chief" not in cluster and task["index"] == 0)
        return cls(strategy, task["index"] + (1 if task["type"] == "worker" and "chief" in cluster else 0),
                   workers, is_chief)

    def scope(self):
        """Where the network that trains is built: the strategy's scope."""
        return self.strategy.scope()

    def local(self):
        """Where this worker alone computes (the probe's twin network): outside the strategy, as by default."""
        return contextlib.nullcontext()

    def local_copy(self, model):
        """The network to score alone: `model` itself (it evaluates under the strategy)."""
        return model

    def scratch_directory(self, out, resume):
        """Where a worker that is not the chief writes: its own temporary directory."""
        return scratch_directory(self.index, out, resume)

    def smallest(self, value):
        """The minimum of `value` (an int) over all workers: one collective."""
        from kadapt.batching.tensorflow.multi_worker import gather_values

        return int(gather_values(self.strategy, [float(value)]).min())

    def trainer_micro_batch(self, micro):
        """The trainer's `micro_batch_size` for micro-batches of `micro` of this worker's rows: the same."""
        return micro

    def exit_on_error(self, out):
        """An error ends a TensorFlow worker as it ends any command: a lost peer fails
        the others' collectives within seconds (`WorkerLostError`)."""
        return contextlib.nullcontext()


def scratch_directory(index, out, resume):
    """Where worker `index`, not the chief, writes: its own temporary directory,
    a copy of the chief's run directory `out` on a resume."""
    scratch = Path(tempfile.mkdtemp(prefix=f"kadapt-worker-{index}-"))
    if resume and Path(out).is_dir():
        shutil.copytree(out, scratch, dirs_exist_ok=True)
    return scratch


class TensorFlowWorkers:
    """TensorFlow's cluster: a `TF_CONFIG` for each worker, each listening on a free port of its own.

    Args:
        count: Int. The workers.
    """

    @staticmethod
    def gpu_count():
        """The GPUs TensorFlow sees, listed by a child process (`visible_gpu_count`)."""
        return visible_gpu_count(TENSORFLOW_GPU_COUNT)

    backend = "TensorFlow"
    variables_text = "TF_CONFIG"

    def __init__(self, count):
        self.count = count
        self.ports = [free_port() for _ in range(count)]

    def __str__(self):
        return f"ports {', '.join(map(str, self.ports))}"

    def variables(self, index):
        """Worker `index`'s `TF_CONFIG`."""
        cluster = {"worker": [f"127.0.0.1:{port}" for port in self.ports]}
        return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}


class JaxWorkers:
    """JAX's processes (`kadapt.jax_processes`): Keras' `KERAS_DISTRIBUTION_*`
    variables, process 0 serving JAX's coordinator on a free port.

    Args:
        count: Int. The processes.
    """

    @staticmethod
    def gpu_count():
        """The GPUs JAX sees, listed by a child process; none without a JAX plugin
        installed (jaxlib itself brings the CPU only: a GPU comes as a `jax_plugins` package)."""
        if importlib.util.find_spec("jax_plugins") is None and not metadata.entry_points(group="jax_plugins"):
            return 0
        return visible_gpu_count(JAX_GPU_COUNT)

    backend = "JAX"
    variables_text = "KERAS_DISTRIBUTION_* variables (kadapt.jax_processes)"

    def __init__(self, count):
        self.count = count
        self.port = free_port()

    def __str__(self):
        return f"port {self.port} (JAX's coordinator, in worker 0)"

    def variables(self, index):
        """Process `index`'s place: the coordinator, the count and its index."""
        return {jax_processes.ADDRESSES: f"127.0.0.1:{self.port}", jax_processes.NUM_PROCESSES: str(self.count),
                jax_processes.PROCESS_ID: str(index)}


WORKER_SETUPS = {"tensorflow": TensorFlowWorkers, "jax": JaxWorkers}


def worker_setup(backend):
    """The `WORKER_SETUPS` entry of Keras' `backend` (a name); raises `UsageError` for a backend without one."""
    if backend not in WORKER_SETUPS:
        raise UsageError(f"--workers runs on Keras' TensorFlow and JAX backends; its {backend!r} backend has no "
                         f"multi-process path in kadapt: set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax. "
                         f"Received: --workers on KERAS_BACKEND={backend}")
    return WORKER_SETUPS[backend]


def launch_local_workers(count, argv, echo=print, setup=TensorFlowWorkers, command=None, lock=None):
    """Runs `kadapt` with `argv` in `count` worker processes of one local cluster; returns the exit code.

    The chief's output is this command's; the others' go to their scratch
    logs (named on failure). When a worker fails, the others end within
    `STOP_GRACE_SECONDS` (they notice the lost peer) or are stopped.

    Args:
        count: Int. The workers.
        argv: List of str. Each worker's arguments.
        echo: Callable `str -> None`. Where the launcher's lines go. Defaults to `print`.
        setup: `TensorFlowWorkers` or `JaxWorkers` (`worker_setup`). Defaults to `TensorFlowWorkers`.
        command: List of str or `None`. What each worker runs before `argv`. Defaults to
            `python -m kadapt.cli`.
        lock: `kadapt.run.run_lock.RunLock` or `None`. The run directory's lock, which
            the workers inherit and share (the chief takes it as its own). Defaults to `None`.

    Example:

    ```python
    code = launch_local_workers(2, ["train", "--data", "digits", "--out", "runs/two"], setup=JaxWorkers)
    ```
    """
    gpus = worker_gpus(count, setup.gpu_count(), os.environ.get(VISIBLE_DEVICES), setup)
    cluster = setup(count)
    threads = environment.thread_share(count)
    logs = Path(tempfile.mkdtemp(prefix="kadapt-workers-"))
    each_gpu = f", GPU {', '.join(gpus)} ({VISIBLE_DEVICES})" if gpus else ""
    echo(f"starting {count} worker{'s' if count != 1 else ''} on 127.0.0.1 {cluster} "
         f"({threads} CPU thread(s) each{each_gpu}); worker logs in {logs}")
    processes = []
    inherited, descriptors = lock.inheritance() if lock is not None else ({}, ())
    for index in range(count):
        variables = {**os.environ, **worker_environment(index, cluster, threads, gpus), **inherited}
        output = None if index == 0 else open(logs / f"worker-{index}.log", "w")
        processes.append(subprocess.Popen([*(command or [sys.executable, "-m", "kadapt.cli"]), *argv], env=variables,
                                          stdout=output, stderr=subprocess.STDOUT if output else None,
                                          pass_fds=descriptors))
        if output is not None:
            output.close()
    try:
        return _wait(processes, logs, echo)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def worker_environment(index: int, cluster, threads: int, gpus: list[str] | None) -> dict[str, str]:
    """The variables worker `index` gets on top of this process's: its place in
    `cluster` (a `TensorFlowWorkers` or `JaxWorkers`), its CPU threads and, on
    a GPU host, its one GPU (`gpus` from `worker_gpus`)."""
    variables = {THREADS_VARIABLE: str(threads), **cluster.variables(index)}
    if gpus:
        variables[VISIBLE_DEVICES] = gpus[index]
    return variables


def worker_gpus(count: int, gpu_count: int, visible: str | None, setup=TensorFlowWorkers) -> list[str] | None:
    """The `CUDA_VISIBLE_DEVICES` entry of each of `count` local workers: the
    i-th GPU this process sees (an entry of `visible`, this process's
    `CUDA_VISIBLE_DEVICES`, kept as written: an index or a UUID); `None` on a
    host without GPUs; `setup` (`TensorFlowWorkers`, `JaxWorkers`) names the backend.
    Raises `UsageError` when there are fewer GPUs than workers."""
    if gpu_count == 0:
        return None
    if count > gpu_count:
        shown = f" ({VISIBLE_DEVICES}={visible})" if visible else ""
        raise UsageError(
            f"--workers starts one worker per GPU, and {setup.backend} sees {gpu_count} GPU(s) here{shown}: "
            f"pass --workers {gpu_count} or fewer (a larger logical batch is split into micro-batches "
            f"on each), or start the other workers on another host with {setup.variables_text}. "
            f"Received: --workers={count}"
        )
    return [visible_device_entry(index, visible) for index in range(count)]


def visible_gpu_count(listing: str = TENSORFLOW_GPU_COUNT) -> int:
    """The GPUs the backend sees (after `CUDA_VISIBLE_DEVICES`), as a child
    process lists them with `listing` (`TENSORFLOW_GPU_COUNT`, `JAX_GPU_COUNT`),
    so that this one loads no backend. Raises what
    `kadapt.extras.require_tensorflow` raises there: `UnsupportedBackendError`
    (Keras on another backend) or `MissingExtraError` (no TensorFlow)."""
    done = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"Listing the GPUs in a child process failed: {done.stderr.strip()[-2000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if "error" in answer:
        raise CHILD_ERRORS[answer["error"]](answer["message"])
    return answer["gpus"]


def _wait(processes, logs, echo):
    failed_at = None
    while any(process.poll() is None for process in processes):
        failed = [p for p in processes if p.poll() not in (None, 0)]
        if failed and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > STOP_GRACE_SECONDS:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            break
        time.sleep(POLL_SECONDS)
    for process in processes:
        process.wait()
    codes = [process.returncode for process in processes]
    bad = [(index, code) for index, code in enumerate(codes) if code != 0]
    for index, code in bad:
        where = "above" if index == 0 else str(logs / f"worker-{index}.log")
        echo(f"kadapt: worker {index} exited with code {code} (its output: {where})")
    return bad[0][1] if bad else 0


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
