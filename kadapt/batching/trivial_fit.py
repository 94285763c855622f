"""`trivially_fits`: whether a training step is so small against the memory budget that probing it is waste.

The probe (`probe_micro_batch`) runs real trial steps: on a few hundred rows
of a table it cost more than the fit (benchmarks/README.md#table_recipe).
Where a generous bound of the step's memory at the whole logical batch is a
small fraction of the budget, the whole batch is one micro-batch and nothing
needs measuring. The bound, in bytes of float32 values:

    4 x (5 P + 8 B U)

P: the parameters, held 5 times (weights, gradients, two optimizer slots and
the accumulated gradient); U: the output units of every layer for one row,
B: the rows of the logical batch; each output is kept for the backward pass
with its gradient (2), times 4 for what the backend holds besides (temporary
copies, fused ops' buffers). For the user's MLP on wine (13 -> 64 -> 3,
1,091 parameters) at 16 rows that is 61 KiB, where the probe measured
~0.0 MiB; for the recipe's fast_resnet on Fashion-MNIST (583,912 parameters,
74,804 output units a row) 301 and 333 MiB at 127 and 141 rows, where the
probe measured 52.2 and 55.1 MiB (`make demo`, 2026-12-07): the bound is
5.8-6.0x the peak. The probe keeps running wherever the bound is above
`SKIP_FRACTION` of the budget (10%: ~1.1 GiB of a 2-core CPU's 11 GiB, a
measured peak under 2% of it), and always under a `--memory-budget`: at
fast_resnet's 256 rows (bound 596 MiB) a CPU with gigabytes free skips it.
"""

import math

SKIP_FRACTION = 0.10
BYTES_PER_VALUE = 4
PARAMETER_COPIES = 5
ACTIVATION_FACTOR = 8


def step_bytes_bound(num_parameters: int, output_units: int, batch_size: int) -> int:
    """The bound of the module's docstring, in bytes.

    Example:

    >>> step_bytes_bound(num_parameters=1091, output_units=13 + 64 + 3, batch_size=16)
    62780
    """
    return BYTES_PER_VALUE * (PARAMETER_COPIES * num_parameters + ACTIVATION_FACTOR * batch_size * output_units)


def trivially_fits(bound_bytes: int, budget_bytes: int) -> bool:
    """Whether `bound_bytes` is at most `SKIP_FRACTION` of `budget_bytes`."""
    return bound_bytes <= SKIP_FRACTION * budget_bytes


def model_output_units(model) -> int | None:
    """The output units of every layer of a built functional or Sequential `model` for
    one row (its input included), or `None` where a layer's output is not known (a subclassed model)."""
    inputs = getattr(model, "inputs", None)  # a subclassed model has none
    if not inputs:
        return None
    units = 0
    for tensor in [*inputs, *(_output(layer) for layer in model.layers)]:
        if tensor is None or any(d is None for d in tensor.shape[1:]):
            return None
        units += math.prod(tensor.shape[1:])
    return units


def _output(layer):
    try:
        return layer.output
    except (AttributeError, ValueError):  # a layer never called on a symbolic input
        return None
