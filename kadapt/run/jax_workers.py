"""One process of a `kadapt train` run over several JAX processes (`kadapt.jax_processes`).

A `kadapt train` started with Keras' `KERAS_DISTRIBUTION_*` variables (by
`--workers N` on JAX, or by hand on several hosts) joins the others before
anything runs on JAX and trains the same pipeline as one process, under
`keras.distribution.DataParallel` over every process's devices:

- each process feeds its own part of every global batch (`process_share`),
  cut after the augmentation, so mixed rows are those of the one-process run;
  under the mesh a micro-batch counts global rows, so the trainer's is
  `workers` times the micro-batch probed for one process's share;
- what a process computes alone runs outside the distribution (`local`):
  the probe's plan of its share, the MetaAdjuster's meta-model, checkpoints
  and `model.keras` (Keras' saving makes an optimizer, whose variables are
  collectives under the distribution), and the test scores, on a copy of the
  trained network (`local_copy`: Keras' `predict` cannot fetch outputs that
  span other processes' devices);
- an error ends the process at once (`exit_on_error`), without JAX's shutdown
  barrier, which would wait minutes for peers blocked in a collective; its
  peers' next collective then fails ("Connection closed by peer") and they
  end too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import traceback

import keras
import numpy as np

from kadapt import environment
from kadapt import jax_processes
from kadapt.jax_processes import ProcessGroup
from kadapt.run import workers
from kadapt.run.errors import UsageError

# A collective's words for a peer that is gone (gloo's socket, JAX's coordination service).
PEER_LOST = ("closed by peer", "connection reset", "heartbeat", "unavailable", "deadline_exceeded",
             "distributed service detected fatal errors")
EXIT_STATUS = 1


@dataclasses.dataclass
class JaxProcess:
    """This process's part in a multi-process JAX run.

    Args:
        group: `kadapt.jax_processes.ProcessGroup`. Its index, count and coordinator.

    Example:

    ```python
    member = JaxProcess.from_environment()   # with KERAS_DISTRIBUTION_* set; joins the others
    run = kadapt.run.pipeline.start_run(options, "runs/two", member=member)
    ```
    """

    group: ProcessGroup

    @classmethod
    def from_environment(cls) -> JaxProcess | None:
        """The process Keras' variables describe, joined to the others (`None` where
        they are not set). Raises `UsageError` for malformed variables, before JAX starts."""
        try:
            group = jax_processes.cluster_from_environment()
        except ValueError as error:
            raise UsageError(str(error)) from None
        if group is None:
            return None
        threads = os.environ.get(workers.THREADS_VARIABLE)
        if threads:
            environment.set_cpu_threads(int(threads))  # the input pipeline's (tf.data)
        jax_processes.initialize_processes(group)
        return cls(group)

    @property
    def index(self) -> int:
        return self.group.index

    @property
    def workers(self) -> int:
        return self.group.count

    @property
    def is_chief(self) -> bool:
        return self.group.is_chief

    @property
    def process_share(self) -> tuple[int, int]:
        """`(index, count)`: this process feeds the index-th of count equal parts of every batch."""
        return self.group.index, self.group.count

    def scope(self):
        """Where the network that trains is built: the distribution is global here."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def local(self):
        """Runs its body outside the distribution: on this process's own devices alone."""
        distribution = keras.distribution.distribution()
        keras.distribution.set_distribution(None)
        try:
            yield
        finally:
            keras.distribution.set_distribution(distribution)

    def local_copy(self, model: keras.Model) -> keras.Model:
        """`model`'s network and weights outside the distribution (call within `local`)."""
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())  # replicated over the processes: each holds them all
        return copy

    def scratch_directory(self, out, resume):
        """Where a process that is not the chief writes: its own temporary directory."""
        return workers.scratch_directory(self.index, out, resume)

    def smallest(self, value: int) -> int:
        """The minimum of `value` over all processes: one collective."""
        from jax.experimental import multihost_utils

        return int(np.min(multihost_utils.process_allgather(np.array([value], "int64"))))

    def trainer_micro_batch(self, micro: int) -> int:
        """The trainer's `micro_batch_size` for micro-batches of `micro` of each
        process's rows: under the mesh a micro-batch counts global rows."""
        return micro * self.group.count

    @contextlib.contextmanager
    def exit_on_error(self, out: str):
        """Ends this process at once on an error in its body: its message on
        stderr, then `os._exit` (see the module docstring)."""
        try:
            yield
        except Exception as error:  # noqa: BLE001 -- every error ends the process the same way
            print(self.error_text(error, out), file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_STATUS)

    def error_text(self, error: Exception, out: str) -> str:
        """What this process says before it ends on `error`."""
        if isinstance(error, UsageError):
            return f"kadapt: error: {error}"
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        if any(words in str(error).lower() for words in PEER_LOST):
            return (f"kadapt: error: worker {self.index} of {self.workers}: a peer process stopped answering mid-run "
                    f"({type(error).__name__}: {first[:300]}). Every worker stops; continue from the last "
                    f"checkpoint with `kadapt train --resume --workers {self.workers} --out {out}`.")
        return (f"kadapt: error: worker {self.index} of {self.workers} failed:\n"
                + "".join(traceback.format_exception(error)).rstrip())
