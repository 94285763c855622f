"""`TrainPlan`: every setting of a `kadapt train` run, resolved once.

`plan_training` turns the `RunConfig` (the flags as given or defaulted) and
the facts of the data it loaded (its rows, whether they are images, their
shape, the task) into one frozen plan. Everything after it reads the plan:
the network, the compile, the printed lines, `config.json` and the fit
(`kadapt.run.pipeline`). Each "auto" of the command is decided here, with the
reason printed:

- `--batch-size` not given: the recipe's for the rows (`kadapt.recipes.batch_size`);
- `--model auto`: `fast_resnet` for images of at least 16x16 pixels, else `mlp`;
- `--optimizer auto`, and a rate or schedule not given: `choose_optimizer`'s;
- `--augment auto`: shifts for images of at least 16x16 pixels; `--restore-best`
  not given: off for rows that are not images; a regression: no label smoothing;
- `--precision`: the one asked, the one a resumed run recorded, or float32 for
  several workers; `auto` in one process stays open (`TrainPlan.precision` is
  `None`): it is measured on the network (`kadapt.recipes.training.recipe_precision`);
- `--learning-rate auto`: the rate a resumed run's range test found; else it
  stays `"auto"` until the range test after the probe (`TrainPlan.with_found_rate`).

The micro-batch is measured, not planned: the probe runs on the built network.
"""

import dataclasses

from kadapt.precision import PrecisionChoice
from kadapt.precision import asked_precision
from kadapt.precision import pinned_precision
from kadapt.recipes.config import AUTO
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.optimizer_choice import OptimizerChoice
from kadapt.recipes.optimizer_choice import choose_optimizer
from kadapt.recipes.optimizer_choice import with_choice
from kadapt.run.config import RunConfig
from kadapt.run.config import with_batch_size
from kadapt.run.data import TrainingData
from kadapt.run.errors import UsageError

FLIP_INVARIANT = ("fashion_mnist",)  # a mirrored digit is another symbol
FAST_RESNET_MIN_PIXELS = 16  # three 2x poolings and a global one need 16x16 images
# --augment auto shifts images (and shifts them again at test time) from this size up: on 8x8 digits a
# 1-pixel shift is an eighth of the image, and shifting cost 6 points (benchmarks/README.md#digits_defaults)
AUGMENT_MIN_PIXELS = 16
_MIXING = ("cutout", "cutmix", "mixup")
_IMAGE_ONLY = _MIXING + ("expand",)
WORKERS_PRECISION = ("--precision auto measures in one process, and the workers could choose differently: float32 "
                     "(pass --precision bfloat16 or float16 for 16-bit steps)")


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What a `kadapt train` run trains, resolved from its flags and data (`plan_training`).

    Attributes:
        config: `RunConfig`. The options as given or defaulted, the logical
            batch filled in.
        network: String. The `--model` that trains, never `"auto"`.
        recipe: `kadapt.recipes.FastFitConfig`. The recipe it trains with:
            the chosen optimizer, schedule and rate (a number, or `"auto"`
            until the range test finds it), augmentation, restore-best.
        optimizer: `kadapt.recipes.optimizer_choice.OptimizerChoice`. The
            optimizer, rate and schedule as chosen from the flags, and why.
        precision: `kadapt.precision.PrecisionChoice`, or `None` where
            `--precision auto` is measured on the network.
        range_test: Dict or `None`. What `config.json` records of the range
            test that found the rate.
    """

    config: RunConfig
    network: str
    recipe: FastFitConfig
    optimizer: OptimizerChoice
    precision: PrecisionChoice | None = None
    range_test: dict | None = None

    def with_found_rate(self, range_test: dict) -> "TrainPlan":
        """The plan training at the rate a range test found (`range_test["learning_rate"]`)."""
        recipe = self.recipe.replace(learning_rate=range_test["learning_rate"])
        return dataclasses.replace(self, recipe=recipe, range_test=range_test)

    def record(self) -> dict:
        """What `config.json` records of the recipe: its augmentation, switches and range test."""
        return {"augmentation": augmentation_text(self.recipe), "recipe": dataclasses.asdict(self.recipe),
                "test_time_augmentation": self.recipe.test_time_augmentation,
                **({"range_test": self.range_test} if self.range_test else {})}


def plan_training(config: RunConfig, data: TrainingData, recorded: dict | None = None,
                  workers: int | None = None) -> TrainPlan:
    """The `TrainPlan` of `config` on `data`.

    Args:
        config: `RunConfig`.
        data: `kadapt.run.data.TrainingData`.
        recorded: Dict or `None`. A resumed run's `config.json` "resolved":
            its precision and range test stand. Defaults to `None`.
        workers: Int or `None`. The workers of a multi-worker run. Defaults to `None`.

    Raises:
        UsageError: A setting that cannot apply to these rows or workers.
    """
    recorded = recorded or {}
    config = with_batch_size(config, len(data.x_train))
    if workers is not None:
        _check_split(config.batch_size, workers)
    network = _network(config, data)
    choice = choose_optimizer(network, data.is_image, config.recipe.get("optimizer", AUTO),
                              config.recipe.get("learning_rate"), config.recipe.get("schedule"))
    recipe = _recipe(config, data, choice)
    plan = TrainPlan(config, network, recipe, choice, _precision(recipe.precision, recorded, workers))
    if recipe.learning_rate != AUTO:
        return plan
    if workers is not None:
        raise UsageError("--learning-rate auto runs a range test in each worker, and the workers could find "
                         "different rates: find one with `kadapt find-lr` and pass it as --learning-rate.")
    return plan.with_found_rate(recorded["range_test"]) if recorded.get("range_test") else plan


def _network(config, data):
    """The `--model` to build: `"auto"` is `fast_resnet` for images of at least
    16x16 pixels and `mlp` for the rest."""
    if config.model != "auto":
        return config.model
    big_images = data.is_image and min(data.input_shape[:2]) >= FAST_RESNET_MIN_PIXELS
    return "fast_resnet" if big_images else "mlp"


def _recipe(config, data, choice):
    """The `FastFitConfig` of a `RunConfig` on `data`, training with `choice`.

    Options the user did not give keep the recipe's defaults. Images are
    shifted (and mirrored where the classes survive it: Fashion-MNIST) with
    `--augment on`, and with `auto` when they are at least 16x16 pixels;
    rows that are not images are never augmented, and asking for it there is
    a `UsageError`; they end with the last epoch's weights (`--restore-best
    on` for the best epoch's). A regression (float labels) has no label smoothing,
    augmentation or test-time augmentation: a mixed or shifted row's target
    is not known.
    """
    given = dict(config.recipe)
    _check_augmentation(config, data, given)
    if data.task.is_regression:
        _check_regression(config, given)
        given.setdefault("label_smoothing", 0.0)
    augment = (data.is_image and not data.task.is_regression
               and (config.augment == "on" or config.augment == "auto" and _big_enough(data)))
    defaults = FastFitConfig()
    if not data.is_image:
        # The triangular schedule ends annealed at rate 0, and a tenth of a table's rows (a few dozen)
        # picks an earlier epoch by noise: the last epoch's weights, measured on 13 public tables
        # (benchmarks/README.md#public_tables: within the careful user's bar 8 -> 11 of 13).
        given.setdefault("restore_best_weights", False)
    given.setdefault("flip", augment and config.data in FLIP_INVARIANT)
    given.setdefault("translate", defaults.translate if augment else 0.0)
    # the given switches were judged by RunConfig; the choice first: Schedule-Free takes only its schedule
    return with_choice(defaults, choice).replace(**given)


def _precision(asked, recorded, workers):
    """The `PrecisionChoice` decided without timing steps, or `None` (measured on the network)."""
    if recorded.get("precision"):
        return PrecisionChoice(**recorded["precision"])
    if asked != AUTO:
        return asked_precision(asked)
    if workers is not None:  # timed in each worker, they could choose apart
        return pinned_precision() or PrecisionChoice("float32", {}, WORKERS_PRECISION)
    return None


def _check_split(batch_size, workers):
    if batch_size % workers:
        raise UsageError(f"--batch-size {batch_size} is the global batch of {workers} workers: use a "
                         f"multiple of {workers}, e.g. {batch_size - batch_size % workers or workers}.")


def _big_enough(data):
    return min(data.input_shape[:2]) >= AUGMENT_MIN_PIXELS


def augmentation_text(recipe):
    """A short description of the on-the-fly and test-time augmentation, for config.json and the report."""
    parts = [f"translate {recipe.translate:.3f}"] if recipe.translate else []
    parts += ["horizontal flip"] if recipe.flip else []
    tta = recipe.test_time_augmentation
    tested = (["flips"] if tta["flip"] else []) + ([f"{tta['shift']}-pixel shifts"] if tta["shift"] else [])
    parts += [f"test-time {' and '.join(tested)}"] if tested else []
    parts += [f"{name} {getattr(recipe, name)}" for name in _MIXING if getattr(recipe, name)]
    if recipe.expand:
        parts.append(f"expanded by {recipe.expand} x the rows ({recipe.expand_method})")
    return ", ".join(parts) or "off"


def _check_regression(config, given):
    asked = [f"--{name.replace('_', '-')}" for name in ("label_smoothing",) + _IMAGE_ONLY if given.get(name)]
    asked += ["--augment on"] if config.augment == "on" else []
    asked += ["--target-accuracy"] if config.target_accuracy is not None else []
    if asked:
        raise UsageError(f"{', '.join(asked)} apply to classes; the float labels of --data {config.data} are a "
                         f"regression target. Drop {', '.join(asked)}.")


def _check_augmentation(config, data, given):
    asked = [f"--{name}" for name in _IMAGE_ONLY if given.get(name)]
    if config.augment == "on" and not data.is_image:
        raise UsageError("--augment on needs image data; these rows are not images.")
    if asked and not data.is_image:
        raise UsageError(f"{', '.join(asked)} augment images; the rows of --data {config.data} are not images "
                         f"(shape {tuple(data.input_shape)}). Drop {', '.join(asked)}.")
    if asked and config.augment == "off":
        raise UsageError(f"{', '.join(asked)} cannot apply with --augment off. Drop one of them.")
