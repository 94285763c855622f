"""`RunConfig`: what a `kadapt train` run was asked to do, defaults filled in.

Options the user did not give are `None` on the way in, so a resumed run can
tell a changed option from a default one. The recipe's switches are not
repeated here: `RunConfig.recipe` holds the `FastFitConfig` fields the user
gave, by field name (`kadapt.recipes.config.command_line_switches`).
"""

import dataclasses
import math
from pathlib import Path

from kadapt.recipes.batch_size import recipe_batch_size
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.config import command_line_switches
from kadapt.recipes.config import switch_flag
from kadapt.recipes.optimizer_choice import MEASURED
from kadapt.run.errors import UsageError

MODEL_NAMES = ("auto", "fast_resnet", "small_cnn", "mlp")
DATA_NAMES = ("fashion_mnist", "digits")
META_SETTINGS = ("default", "off")
AUGMENT_SETTINGS = ("auto", "on", "off")
TASKS = ("classification", "regression")
STREAM_SETTINGS = ("auto", "on", "off")
RECIPE_FLAGS = {field.name: switch_flag(field) for field in command_line_switches()}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The options of one run (constructor arguments only; results go to `run.json`)."""

    data: str
    target: str | None = None  # a table's column to predict
    test: str | None = None  # a table of test rows (else a seeded fifth of --data's)
    task: str | None = None  # "classification" or "regression"; None: read from the labels (kadapt.run.labels)
    stream: str = "auto"  # a table: on, off, or auto = where it would not fit in memory (kadapt.run.table_stream)
    # auto: fast_resnet for images of at least 16x16 pixels, mlp for the rest; or package.module:function
    model: str = "auto"
    batch_size: int | None = None  # None: the recipe's for the training rows (kadapt.recipes.batch_size)
    memory_budget: str | None = None
    epochs: int = 10
    # The `FastFitConfig` switches given, by field name; the others take the recipe's defaults.
    recipe: dict = dataclasses.field(default_factory=dict)
    validation_split: float = 0.1
    meta: str = "default"
    target_accuracy: float | None = None
    augment: str = "auto"
    seed: int = 0
    max_steps: int | None = None
    train_rows: int | None = None
    image_size: str | None = None  # image folders: HxW or N (else chosen from the files)
    skip_bad_images: bool = False  # image folders: leave out a file that does not decode (else an error)

    def __post_init__(self):
        _optional_positive_int("batch_size", self.batch_size)
        _positive_int("epochs", self.epochs)
        _optional_positive_int("max_steps", self.max_steps)
        _optional_positive_int("train_rows", self.train_rows)
        _model(self.model)
        _choice("augment", self.augment, AUGMENT_SETTINGS)
        if self.task is not None:
            _choice("task", self.task, TASKS)
        _choice("stream", self.stream, STREAM_SETTINGS)
        _check_recipe(self.recipe)
        _meta(self.meta)
        _fraction("validation_split", self.validation_split, high=0.5)
        _memory_budget(self.memory_budget)
        if self.target_accuracy is not None:
            _target(self.target_accuracy, self.validation_split)
        if self.image_size is not None:
            _image_size(self.image_size)

    def to_dict(self):
        return dataclasses.asdict(self)


def resolve_config(options, saved=None):
    """The `RunConfig` of `options` (a flat dict of run options and recipe
    switches by field name; `None` = not given).

    With `saved` (the config of the run being resumed) the saved values
    stand; a given option that differs from them is an error, because the
    learning-rate schedule and the backup belong to the saved run.
    """
    given = {k: v for k, v in _by_field_name(options).items() if v is not None}
    if saved is None:
        if "data" not in given:
            raise UsageError("--data is required: fashion_mnist, digits, a .npz file, .npy files, a .csv table, "
                             "or a folder of class folders of images.")
        return _run_config(given)
    saved = _flat_options(saved)
    recipe_defaults = FastFitConfig()
    changed = sorted(k for k, v in given.items() if saved.get(k, getattr(recipe_defaults, k, None)) != v)
    if changed:
        flags = ", ".join(f"{_flag(k)}={given[k]} (saved: {saved.get(k)})" for k in changed)
        raise UsageError(
            f"--resume continues the run as it was configured; these options differ: {flags}. "
            "Drop them, or start a new run with --overwrite or another --out."
        )
    return _run_config(saved)


def _run_config(options):
    run_options = {f.name for f in dataclasses.fields(RunConfig)} - {"recipe"}
    unknown = sorted(set(options) - run_options - set(RECIPE_FLAGS))
    if unknown:
        raise UsageError(f"Unknown option(s) of kadapt train: {', '.join(unknown)}.")
    recipe = {k: v for k, v in options.items() if k in RECIPE_FLAGS}
    return RunConfig(recipe=recipe, **{k: v for k, v in options.items() if k in run_options})


def _flat_options(saved):
    """A saved `config.json` "options" as one flat dict, lists back to tuples.

    Runs written before `RunConfig.recipe` existed kept the switches at the
    top level under their flag names (`ema`, `restore_best` on/off)."""
    flat = {k: v for k, v in saved.items() if k != "recipe" and v is not None}
    flat.update(saved.get("recipe") or {})
    flat = _by_field_name(flat)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()}


def _by_field_name(options):
    """`options` with recipe switches under a flag name (`ema`) renamed to their field (`ema_momentum`)."""
    renamed = dict(options)
    for field in command_line_switches():
        old = switch_flag(field)[2:].replace("-", "_")
        if old != field.name and old in renamed:
            value = renamed.pop(old)
            renamed[field.name] = (value == "on") if isinstance(value, str) and field.type is bool else value
    return renamed


def in_flags(message):
    """A `FastFitConfig` error in the command's words (`ema_momentum` is `--ema`)."""
    for name, flag in RECIPE_FLAGS.items():
        message = message.replace(f"`{name}`", flag).replace(f"{name}=", f"{flag}=")
    return message


def with_batch_size(config, train_rows):
    """`config` with its logical batch: the one given, else the recipe's for `train_rows` rows."""
    if config.batch_size is not None:
        return config
    return dataclasses.replace(config, batch_size=recipe_batch_size(train_rows))


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
    from kadapt.run.user_model import SIGNATURE as MODEL_SIGNATURE  # imports Keras: not while parsing options
    from kadapt.run.user_model import is_model_spec

    module, _, function = str(value).partition(":")
    if not is_model_spec(value) or not module or not function.isidentifier():
        raise UsageError(
            f"--model must be one of {', '.join(MODEL_NAMES)}, or package.module:function naming "
            f"{MODEL_SIGNATURE}, e.g. my_models:build. Received: --model={value}"
        )


def _check_recipe(recipe):
    """Judges the given switches as `FastFitConfig` does, before any data is loaded."""
    unknown = sorted(set(recipe) - set(RECIPE_FLAGS))
    if unknown:
        raise UsageError(f"Argument `recipe` must hold switches of FastFitConfig "
                         f"({', '.join(RECIPE_FLAGS)}). Received: {', '.join(unknown)}")
    ema = recipe.get("ema_momentum")
    if ema is not None and recipe.get("restore_best_weights", True):
        raise UsageError(f"--ema averages the weights, and --restore-best on would replace the average with "
                         f"one epoch's weights: add --restore-best off. Received: --ema={ema}")
    # The schedule not given is the optimizer's measured one, as `choose_optimizer` will choose it.
    schedule = {"schedule": MEASURED[recipe["optimizer"]][1]} if recipe.get("optimizer") in MEASURED else {}
    try:
        FastFitConfig(**{**schedule, **recipe})
    except ValueError as error:
        raise UsageError(in_flags(str(error))) from None


def _meta(value):
    if value in META_SETTINGS:
        return
    if not str(value).endswith(".keras") or not Path(value).is_file():
        raise UsageError(
            f"--meta must be default, off, or an existing .keras meta-model file. Received: --meta={value}"
        )


def _fraction(name, value, high):
    if not 0 <= value <= high:
        raise UsageError(f"{_flag(name)} must be in [0, {high}]. Received: {_flag(name)}={value}")


def _memory_budget(value):
    if value is None:
        return
    # kadapt.batching loads TensorFlow; the parser and `kadapt report` import this module without it.
    from kadapt.batching.memory_budget import parse_memory_size

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


def _image_size(value):
    from kadapt.run.image_folders import parse_image_size  # loads Keras: not while parsing options

    parse_image_size(value)


def _flag(name):
    return RECIPE_FLAGS.get(name) or "--" + name.replace("_", "-")
