"""From `kadapt train`'s options to the recipe: the `FastFitConfig` and the network."""

from kadapt.recipes.config import AUTO
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.optimizer_choice import choose_optimizer
from kadapt.recipes.optimizer_choice import with_choice
from kadapt.run.errors import UsageError

FLIP_INVARIANT = ("fashion_mnist",)  # a mirrored digit is another symbol
FAST_RESNET_MIN_PIXELS = 16  # three 2x poolings and a global one need 16x16 images
# --augment auto shifts images (and shifts them again at test time) from this size up: on 8x8 digits a
# 1-pixel shift is an eighth of the image, and shifting cost 6 points (benchmarks/README.md#digits_defaults)
AUGMENT_MIN_PIXELS = 16
_MIXING = ("cutout", "cutmix", "mixup")
_IMAGE_ONLY = _MIXING + ("expand",)


def network_name(config, data):
    """The `--model` to build: `"auto"` is `fast_resnet` for images of at least
    16x16 pixels and `mlp` for the rest."""
    if config.model != "auto":
        return config.model
    big_images = data.is_image and min(data.input_shape[:2]) >= FAST_RESNET_MIN_PIXELS
    return "fast_resnet" if big_images else "mlp"


def recipe_config(config, data):
    """The `FastFitConfig` of a `RunConfig` on `data` (`TrainingData`).

    Options the user did not give keep the recipe's defaults; the optimizer,
    its rate and schedule are `optimizer_choice`'s. Images are
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
    return with_choice(defaults, optimizer_choice(config, data)).replace(**given)


def optimizer_choice(config, data):
    """The `OptimizerChoice` of a `RunConfig` on `data`: `--optimizer`, or one
    chosen for the network (`kadapt.recipes.optimizer_choice`)."""
    given = config.recipe
    return choose_optimizer(network_name(config, data), data.is_image, given.get("optimizer", AUTO),
                            given.get("learning_rate"), given.get("schedule"))


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
