"""Multi-worker training on TensorFlow's own engine, `tf.distribute.MultiWorkerMirroredStrategy`.

kadapt's models (`kadapt.accumulate`, `kadapt.AccumulatingModel`, the mixin)
train, validate, evaluate and predict under it with `model.fit` (Keras 3 alone
cannot: keras-team/keras#20585; see `kadapt.batching.tensorflow.multi_worker`).
`multi_worker_strategy` checks `TF_CONFIG` before TensorFlow reads it, so a
malformed one, or one that names this process wrongly, is refused before any
training, and bounds every collective in time, so a worker that hangs cannot
hang the others for ever. It runs on Keras' TensorFlow backend only: under
another backend, or without TensorFlow, `multi_worker_strategy` raises
`kadapt.extras.UnsupportedBackendError` / `MissingExtraError`.

Example, the same script on each of two hosts (`"index": 1` on the second):

```python
import json, os
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": ["host-a:2222", "host-b:2222"]},
    "task": {"type": "worker", "index": 0}})
from kadapt import environment
environment.configure_tensorflow()
import keras, kadapt
strategy = kadapt.distribute.multi_worker_strategy()
with strategy.scope():
    model = kadapt.accumulate(build_model(), micro_batch_size=64)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
model.fit(dataset, epochs=10)   # `dataset` batched by the global batch: 2 x the per-worker share
```
"""

from __future__ import annotations

import errno
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from kadapt.extras import require_tensorflow

if TYPE_CHECKING:
    import tensorflow as tf

COLLECTIVE_TIMEOUT_SECONDS = 600.0  # a collective that waits this long for a peer fails the step
_EXAMPLE = ('{"cluster": {"worker": ["host-a:2222", "host-b:2222"]}, '
            '"task": {"type": "worker", "index": 0}}')
_JOBS = ("chief", "worker")


def multi_worker_strategy(
        collective_timeout_seconds: float = COLLECTIVE_TIMEOUT_SECONDS) -> tf.distribute.MultiWorkerMirroredStrategy:
    """A `MultiWorkerMirroredStrategy` for the cluster in `TF_CONFIG`, checked first.

    Args:
        collective_timeout_seconds: Positive float. A collective (the
            gradients' all-reduce) that waits this long for a peer fails the
            step with `WorkerLostError` in `fit`. Defaults to
            `COLLECTIVE_TIMEOUT_SECONDS`.

    Raises:
        kadapt.extras.UnsupportedBackendError: Keras runs on another backend.
        kadapt.extras.MissingExtraError: TensorFlow is not installed.
        ValueError: `TF_CONFIG` is missing, not JSON, or names a cluster or
            task that cannot be this process (the message names the value and
            the fix).
    """
    if isinstance(collective_timeout_seconds, bool) or not isinstance(collective_timeout_seconds, (int, float)) or not (
            0 < collective_timeout_seconds < float("inf")):
        raise ValueError("Argument `collective_timeout_seconds` must be a positive number. "
                         f"Received: collective_timeout_seconds={collective_timeout_seconds!r}")
    tf = require_tensorflow("Multi-worker training (kadapt.distribute)")
    check_tf_config()

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=float(collective_timeout_seconds))
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def __getattr__(name):
    # `WorkerLostError` (what `fit` raises when a peer is lost) lives with the TensorFlow
    # train function; loaded on use, so this module imports without TensorFlow.
    if name == "WorkerLostError":
        from kadapt.batching.tensorflow.multi_worker import WorkerLostError

        return WorkerLostError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_tf_config(text: str | None = None, bind: bool = True) -> dict[str, Any]:
    """Returns the parsed `TF_CONFIG` (or `text`), or raises `ValueError` naming what is wrong.

    Checks: JSON; a `cluster` of "chief" (at most one) and "worker" lists of
    `host:port` addresses, none repeated; a `task` whose type is one of them
    and whose index is in range; and, with `bind`, that this process can
    listen on its own address (the host is this machine's and the port is
    free).
    """
    text = os.environ.get("TF_CONFIG") if text is None else text
    if not text:
        raise ValueError(f"TF_CONFIG is not set. Set it on every worker before TensorFlow starts, e.g. "
                         f"TF_CONFIG='{_EXAMPLE}' (this process's own \"index\" on each).")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not JSON ({error}). Received: TF_CONFIG={text!r}. "
                         f"Expected e.g. {_EXAMPLE}") from None
    cluster, task = (config.get("cluster"), config.get("task")) if isinstance(config, dict) else (None, None)
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(f"TF_CONFIG has no \"cluster\" object. Received: TF_CONFIG={text!r}. Expected e.g. {_EXAMPLE}")
    addresses = []
    for job, members in cluster.items():
        if job not in _JOBS:
            raise ValueError(f"TF_CONFIG's cluster has a job {job!r}; MultiWorkerMirroredStrategy knows "
                             f"{' and '.join(_JOBS)}. Received: TF_CONFIG={text!r}")
        if not isinstance(members, list) or not members or (job == "chief" and len(members) > 1):
            raise ValueError(f"TF_CONFIG's cluster job {job!r} must be a non-empty list of \"host:port\" "
                             f"addresses{' (one)' if job == 'chief' else ''}. Received: {job}={members!r}")
        addresses += [_address(job, member) for member in members]
    repeated = sorted({f"{h}:{p}" for h, p in addresses if addresses.count((h, p)) > 1})
    if repeated:
        raise ValueError(f"TF_CONFIG's cluster lists {repeated} more than once; give each task its own "
                         f"address. Received: TF_CONFIG={text!r}")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ValueError(f"TF_CONFIG's task must name this process: {{\"type\": one of {sorted(cluster)}, "
                         f"\"index\": its place in that list}}. Received: task={task!r}")
    index, members = task.get("index"), cluster[task["type"]]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(members):
        raise ValueError(f"TF_CONFIG's task index must be an int in [0, {len(members)}) for the "
                         f"{len(members)} {task['type']} address(es). Received: task={task!r}")
    if bind:
        _check_listenable(*_address(task["type"], members[index]), task)
    return config


def _address(job, member):
    host, _, port = member.rpartition(":") if isinstance(member, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"TF_CONFIG's cluster job {job!r} has the address {member!r}; expected "
                         "\"host:port\" with a port in 1-65535, e.g. \"10.0.0.5:2222\".")
    return host, int(port)


def _check_listenable(host, port, task):
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            reason = "the port is in use" if error.errno == errno.EADDRINUSE else (
                f"this host cannot listen there ({error.strerror})")
            raise ValueError(f"TF_CONFIG names this process {task['type']} {task['index']} at {host}:{port}, "
                             f"but {reason}. Give each process its own task index and a free port on its "
                             "own host.") from None
