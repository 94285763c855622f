"""`get`: a kadapt optimizer from its name, for command lines and configurations."""

from __future__ import annotations

from typing import Any

import keras

from kadapt.optimizers.adam import Adam
from kadapt.optimizers.prodigy import Prodigy
from kadapt.optimizers.schedule_free_adamw import ScheduleFreeAdamW
from kadapt.optimizers.schedule_free_sgd import ScheduleFreeSGD
from kadapt.optimizers.sgd import SGD

OPTIMIZERS = {
    "adam": Adam,
    "prodigy": Prodigy,
    "schedule_free_adamw": ScheduleFreeAdamW,
    "schedule_free_sgd": ScheduleFreeSGD,
    "sgd": SGD,
}


def get(name: str, **kwargs: Any) -> keras.optimizers.Optimizer:
    """Returns the kadapt optimizer called `name`, constructed with `kwargs`.

    Args:
        name: String, one of `"adam"`, `"prodigy"`, `"schedule_free_adamw"`,
            `"schedule_free_sgd"`, `"sgd"`.
        **kwargs: The optimizer's constructor arguments.

    Returns:
        The optimizer.

    Example:

    ```python
    optimizer = kadapt.optimizers.get("prodigy", safeguard_warmup=True)
    ```
    """
    if name not in OPTIMIZERS:
        raise ValueError(
            f"Argument `name` must be one of {sorted(OPTIMIZERS)}. Received: name={name!r}"
        )
    return OPTIMIZERS[name](**kwargs)
