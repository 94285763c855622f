"""`DistributedSearch`: this process's part in KerasTuner's distributed mode, read and checked."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

TUNER_ID = "KERASTUNER_TUNER_ID"
ORACLE_IP = "KERASTUNER_ORACLE_IP"
ORACLE_PORT = "KERASTUNER_ORACLE_PORT"
VARIABLES = (TUNER_ID, ORACLE_IP, ORACLE_PORT)
_FIX = (f"Set all three in every process of the search ({TUNER_ID}=chief in one, a unique id such "
        f"as tuner0, tuner1 in each worker; {ORACLE_IP} and {ORACLE_PORT} the chief's address), "
        "or none of them to search in one process.")


@dataclasses.dataclass(frozen=True)
class DistributedSearch:
    """One process of a KerasTuner search spread over processes.

    KerasTuner's distributed mode runs the same search script in several
    processes that share the tuner's `directory` (one file system). The chief
    (a tuner id containing `"chief"`, KerasTuner's own test) serves the oracle
    over gRPC inside `tuner.search` and runs no trial; `search` returns on it
    once every trial has ended. Each worker asks the chief for trials, runs
    them, and returns from `search` when none are left. A worker must build
    its tuner with `overwrite=False`: KerasTuner's `overwrite=True` deletes the
    project directory, and with it the trials of the chief and of the other
    workers. A worker whose chief never answers waits in `search` (KerasTuner
    allows an hour); a chief whose worker died waits for it.

    Args:
        tuner_id: String. `KERASTUNER_TUNER_ID`, unique per process.
        oracle_ip: String. `KERASTUNER_ORACLE_IP`, the chief's address.
        oracle_port: Int. `KERASTUNER_ORACLE_PORT`, the chief's port.

    Example:

    ```python
    search = kadapt.tuning.distributed_search()  # None in a single process
    worker = search is not None and not search.is_chief
    tuner = keras_tuner.RandomSearch(hyper_model, objective="val_loss",
                                     max_trials=6, directory="/shared/search",
                                     overwrite=not worker)
    tuner.search(x, y, epochs=2, validation_split=0.2)
    if not worker:
        best_model = tuner.get_best_models(1)[0]
    ```
    """

    tuner_id: str
    oracle_ip: str
    oracle_port: int

    @property
    def is_chief(self) -> bool:
        """Whether this process serves the oracle (its id contains `"chief"`)."""
        return "chief" in self.tuner_id


def distributed_search(environ: Mapping[str, str] | None = None) -> DistributedSearch | None:
    """This process's `DistributedSearch`, or `None` outside distributed mode.

    Reads `KERASTUNER_TUNER_ID`, `KERASTUNER_ORACLE_IP` and
    `KERASTUNER_ORACLE_PORT`, which KerasTuner reads itself when a tuner is
    built. Any of them set without the others is refused (KerasTuner would
    search alone, or fail later in gRPC), and so is a port that is not an int
    in 1-65535.

    Args:
        environ: Mapping or `None`. The environment; defaults to `os.environ`.

    Returns:
        `DistributedSearch` or `None` (none of the three is set).

    Example:

    ```python
    search = kadapt.tuning.distributed_search()
    if search is not None and not search.is_chief:
        print(f"worker {search.tuner_id}: the chief saves the result")
    ```
    """
    environ = os.environ if environ is None else environ
    values = {name: environ.get(name) for name in VARIABLES}
    if all(value is None for value in values.values()):
        return None
    unusable = [name for name, value in values.items() if not (value or "").strip()]
    if unusable:
        received = ", ".join(f"{name}={value!r}" if value is not None else f"{name} not set"
                             for name, value in values.items())
        raise ValueError(f"KerasTuner's distributed mode needs {', '.join(VARIABLES)} all set "
                         f"and non-empty. Received: {received}. {_FIX}")
    return DistributedSearch(values[TUNER_ID], values[ORACLE_IP], _port(values[ORACLE_PORT]))


def _port(value):
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise ValueError(f"Environment variable `{ORACLE_PORT}` must be an int port in 1-65535. "
                         f"Received: {ORACLE_PORT}={value!r}. Set it to a free port on the chief's "
                         "host, the same in every process of the search.")
    return port
