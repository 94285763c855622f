"""`RunConfig`: what a `kadapt train` run was asked to do, defaults filled in.

Options the user did not give are `None` on the way in, so a resumed run can
tell a changed option from a default one.
"""

import dataclasses
import math
from pathlib import Path

from kadapt.batching.memory_budget import parse_memory_size
from kadapt.recipes.config import PRECISIONS
from kadapt.recipes.config import SCHEDULES
from kadapt.run.errors import UsageError
from kadapt.run.user_model import SIGNATURE as MODEL_SIGNATURE
from kadapt.run.user_model import is_model_spec

MODEL_NAMES = ("auto", "fast_resnet", "small_cnn", "mlp")
DATA_NAMES = ("fashion_mnist", "digits")
META_SETTINGS = ("default", "off")
AUGMENT_SETTINGS = ("auto", "on", "off")
SWITCHES = ("on", "off")
SCHEDULE_NAMES = SCHEDULES


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The options of one run (constructor arguments only; results go to `run.json`)."""

    data: str
    # auto: fast_resnet for images of at least 16x16 pixels, mlp for the rest; or package.module:function
    model: str = "auto"
    batch_size: int = 256  # the recipe's measured batch (kadapt.recipes.fast_fit)
    memory_budget: str | None = None
    epochs: int = 10
    # The recipe's switches: None takes `kadapt.recipes.FastFitConfig`'s default.
    widths: tuple | None = None
    schedule: str | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    label_smoothing: float | None = None
    cutout: float | None = None
    cutmix: float | None = None
    mixup: float | None = None
    expand: float | None = None
    expand_method: str | None = None
    ema: float | None = None
    precision: str | None = None
    restore_best: str = "on"
    validation_split: float = 0.1
    meta: str = "default"
    target_accuracy: float | None = None
    augment: str = "auto"
    seed: int = 0
    max_steps: int | None = None
    train_rows: int | None = None

    def __post_init__(self):
        _positive_int("batch_size", self.batch_size)
        _positive_int("epochs", self.epochs)
        _optional_positive_int("max_steps", self.max_steps)
        _optional_positive_int("train_rows", self.train_rows)
        _model(self.model)
        _choice("augment", self.augment, AUGMENT_SETTINGS)
        _choice("restore_best", self.restore_best, SWITCHES)
        if self.widths is not None:
            _widths(self.widths)
        if self.schedule is not None:
            _choice("schedule", self.schedule, SCHEDULE_NAMES)
        if self.precision is not None:
            _choice("precision", self.precision, PRECISIONS)
        _meta(self.meta)
        _fraction("validation_split", self.validation_split, high=0.5)
        _memory_budget(self.memory_budget)
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise UsageError(f"--learning-rate must be positive. Received: --learning-rate={self.learning_rate}")
        if self.target_accuracy is not None:
            _target(self.target_accuracy, self.validation_split)

    def to_dict(self):
        return dataclasses.asdict(self)


def resolve_config(options, saved=None):
    """The `RunConfig` of `options` (a dict; `None` = not given).

    With `saved` (the config of the run being resumed) the saved values
    stand; a given option that differs from them is an error, because the
    learning-rate schedule and the backup belong to the saved run.
    """
    given = {k: v for k, v in options.items() if v is not None}
    if saved is None:
        if "data" not in given:
            raise UsageError("--data is required: fashion_mnist, digits, a .npz file, or .npy files.")
        return RunConfig(**given)
    if saved.get("widths") is not None:
        saved = {**saved, "widths": tuple(saved["widths"])}  # JSON keeps a list
    changed = sorted(k for k, v in given.items() if saved.get(k) != v)
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')}={given[k]} (saved: {saved.get(k)})" for k in changed)
        raise UsageError(
            f"--resume continues the run as it was configured; these options differ: {flags}. "
            "Drop them, or start a new run with --overwrite or another --out."
        )
    known = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig(**{k: v for k, v in saved.items() if k in known})


def schedule_steps(config, train_rows):
    """`(steps_per_epoch, total_steps)` for `train_rows` rows."""
    steps_per_epoch = math.ceil(train_rows / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    return steps_per_epoch, total_steps


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{_flag(name)} must be a positive integer. Received: {_flag(name)}={value}")


def _optional_positive_int(name, value):
    if value is not None:
        _positive_int(name, value)


def _choice(name, value, choices):
    if value not in choices:
        raise UsageError(
            f"{_flag(name)} must be one of {', '.join(choices)}. Received: {_flag(name)}={value}"
        )


def _model(value):
    """A built-in name or a well-formed `package.module:function` (imported when the network is built)."""
    if value in MODEL_NAMES:
        return
    module, _, function = str(value).partition(":")
    if not is_model_spec(value) or not module or not function.isidentifier():
        raise UsageError(
            f"--model must be one of {', '.join(MODEL_NAMES)}, or package.module:function naming "
            f"{MODEL_SIGNATURE}, e.g. my_models:build. Received: --model={value}"
        )


def _meta(value):
    if value in META_SETTINGS:
        return
    if not str(value).endswith(".keras") or not Path(value).is_file():
        raise UsageError(
            f"--meta must be default, off, or an existing .keras meta-model file. Received: --meta={value}"
        )


def _widths(value):
    if not value or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in value):
        raise UsageError(f"--widths must be positive integers, one per stage, e.g. 64,128,256. "
                         f"Received: --widths={value}")


def _fraction(name, value, high):
    if not 0 <= value <= high:
        raise UsageError(f"{_flag(name)} must be in [0, {high}]. Received: {_flag(name)}={value}")


def _memory_budget(value):
    if value is None:
        return
    try:
        parse_memory_size(value)
    except (TypeError, ValueError):
        raise UsageError(
            f"--memory-budget must be a size such as 2GiB or 512MB. Received: --memory-budget={value}"
        ) from None


def _target(value, validation_split):
    if not 0 < value <= 1:
        raise UsageError(f"--target-accuracy must be in (0, 1]. Received: --target-accuracy={value}")
    if validation_split == 0:
        raise UsageError(
            "--target-accuracy is checked on the validation rows: use a --validation-split above 0."
        )


def _flag(name):
    return "--" + name.replace("_", "-")
