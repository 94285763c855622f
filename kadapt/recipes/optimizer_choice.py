"""`choose_optimizer`: which optimizer, rate and schedule a recipe trains a network with.

The recipe's SGD (Nesterov, peak 0.2, triangular) was measured on
`fast_resnet` and images (benchmarks/README.md#fashion_mnist_fast), where
batch normalization absorbs any input scale. On any other network it was
not: on scikit-learn's tables with a user's MLP it left runs at chance
(DESIGN.md, "A user's own data"). There Adam is the choice, at the rate and
schedule `benchmarks/recipe/table_recipe.py` measured (benchmarks/README.md#table_recipe).
"""

import dataclasses

from kadapt.recipes.config import AUTO
from kadapt.recipes.config import OPTIMIZERS
from kadapt.recipes.config import FastFitConfig

RECIPE_NETWORK = "fast_resnet"
# kadapt's image networks keep the recipe's SGD on images: measured on fast_resnet, and what small_cnn
# trained with before this choice existed (not measured anew).
IMAGE_NETWORKS = (RECIPE_NETWORK, "small_cnn")
# (learning rate, schedule) of each optimizer where the user gives none; one row per name of OPTIMIZERS.
# Prodigy's are its reference defaults (prodigyopt: rate 1.0, constant), at which it was the anchor closest
# to the grid's best on the held-out tasks (benchmarks/README.md#meta_adjust); Schedule-Free's are its
# reference defaults too (schedulefree 1.4.1: AdamW 0.0025, SGD 1.0), at the only schedule it takes.
# Muon's are Adam's: Keras' Muon steps AdamW on a convolution's filters and scales its own step to Adam's;
# FilterMuon's 0.03 is the best of 0.01 / 0.03 / 0.1 on fast_resnet (benchmarks/README.md#muon_recipe).
MEASURED = {"sgd": (FastFitConfig().learning_rate, FastFitConfig().schedule), "adam": (1e-2, "triangular"),
            "prodigy": (1.0, "constant"), "schedule_free_adamw": (0.0025, "constant"),
            "schedule_free_sgd": (1.0, "constant"), "muon": (1e-2, "triangular"),
            "muon_filters": (3e-2, "triangular")}


@dataclasses.dataclass(frozen=True)
class OptimizerChoice:
    """What a recipe trains with, and why.

    Args:
        optimizer: String. A name of `kadapt.recipes.config.OPTIMIZERS`.
        learning_rate: Float, or `"auto"` (a range test finds it).
        schedule: String. A `FastFitConfig` schedule.
        reason: String. One sentence for the run's output.
    """

    optimizer: str
    learning_rate: float | str
    schedule: str
    reason: str

    def to_dict(self):
        return dataclasses.asdict(self)

    def text(self):
        """One line for the run's output, e.g. "sgd, learning rate 0.2, triangular schedule (why)"."""
        return f"{self.optimizer}, learning rate {self.learning_rate}, {self.schedule} schedule ({self.reason})"


def choose_optimizer(network, images, optimizer=AUTO, learning_rate=None, schedule=None):
    """The `OptimizerChoice` for `network` on `images` (or other rows).

    What the user gave stands; `"auto"` (or nothing) is the recipe's SGD for
    kadapt's image networks (`IMAGE_NETWORKS`) on images, Adam for any other
    network or rows that are not images. A rate or schedule
    not given is the chosen optimizer's measured one.

    Args:
        network: String. The `--model` that trains (`"fast_resnet"`, `"mlp"`,
            `"package.module:function"`, ...).
        images: Bool. Whether the rows are images.
        optimizer: String. `"auto"` or a name of `OPTIMIZERS`. Defaults to `"auto"`.
        learning_rate: Float, `"auto"`, or `None` (not given). Defaults to `None`.
        schedule: String or `None` (not given). Defaults to `None`.

    Example:

    >>> choose_optimizer("mlp", images=False).optimizer
    'adam'
    """
    if optimizer not in (AUTO, *OPTIMIZERS):
        raise ValueError(f"Argument `optimizer` must be one of {', '.join((AUTO, *OPTIMIZERS))}. "
                         f"Received: optimizer={optimizer!r}")
    if optimizer == AUTO:
        optimizer = "sgd" if network in IMAGE_NETWORKS and images else "adam"
        measured = "Adam, measured on tables (benchmarks/README.md#table_recipe)"
        why = (f"the recipe's optimizer, measured on {RECIPE_NETWORK} and images" if optimizer == "sgd" else
               f"rows that are not images: {measured}" if not images else
               f"{network} is not one of kadapt's image networks, where the recipe's SGD at {MEASURED['sgd'][0]} "
               f"was measured: {measured}")
    else:
        why = f"--optimizer {optimizer}"
    rate = MEASURED[optimizer][0] if learning_rate is None else learning_rate
    schedule = MEASURED[optimizer][1] if schedule is None else schedule
    return OptimizerChoice(optimizer, rate, schedule, why)


def with_choice(config, choice):
    """`config` (`FastFitConfig`) training with `choice`."""
    return config.replace(optimizer=choice.optimizer, learning_rate=choice.learning_rate, schedule=choice.schedule)
