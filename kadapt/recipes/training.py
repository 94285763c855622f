"""The steps of the training recipe, shared by `kadapt.recipes.fast_fit` and `kadapt train`.

Each step is a small function of a `FastFitConfig`: the network, the
optimizer with its schedule, the loss, the input pipeline with on-the-fly
augmentation, the callbacks the schedule and the end of training need, the
micro-batching and the evaluation. Both front doors call these and nothing
else, so a change to the recipe reaches both.
"""

import keras
import numpy as np

from kadapt.augment import augment_dataset
from kadapt.augment import augmentation
from kadapt.augment import expand
from kadapt.batching import accumulate
from kadapt.callbacks import BestWeights
from kadapt.callbacks import MomentumScheduler
from kadapt.callbacks import ScheduleFreeEvaluation
from kadapt.extras import require
from kadapt.models.fast_resnet import fast_resnet
from kadapt.models.fast_resnet import patch_whitening
from kadapt.optimizers import Adam
from kadapt.optimizers import FilterMuon
from kadapt.optimizers import Prodigy
from kadapt.optimizers import SGD
from kadapt.optimizers import ScheduleFreeAdamW
from kadapt.optimizers import ScheduleFreeSGD
from kadapt.optimizers import live_rate
from kadapt.optimizers.filter_muon import muon_variables
from kadapt.precision import asked_precision
from kadapt.precision import choose_precision
from kadapt.range_test import find_learning_rate
from kadapt.recipes.config import AUTO
from kadapt.recipes.config import SCHEDULE_FREE
from kadapt.recipes.disk_rows import is_on_disk
from kadapt.recipes.inference import predict_with_tta
from kadapt.recipes.task import RegressionSums
from kadapt.recipes.task import Task
from kadapt.schedules import CosineAnnealing
from kadapt.schedules import CosineMomentum
from kadapt.schedules.piecewise_linear import PiecewiseLinear
from kadapt.validation import check_range

# The recipe feeds tf.data pipelines, on any Keras backend.
tf = require("tensorflow", extra="tensorflow")

WHITENING_IMAGES = 5000  # enough for a stable 2x2 patch covariance
MOMENTUM = 0.9  # of the triangular schedule
COSINE_MOMENTUM = (0.95, 0.85)  # max, min: low momentum at the peak rate
# The peak a `learning_rate="auto"` recipe compiles with until the range test
# replaces it; the test itself swaps the schedule out (`kadapt.find_learning_rate`).
PLACEHOLDER_PEAK = 1.0

# Rows on disk are scored this many at a time (their outputs are not held all at once).
EVALUATION_ROWS = 65536


def recipe_network(config, images, num_classes):
    """A fresh `fast_resnet` (logits out) for `images` (N, H, W, C), its
    whitening computed from the first `WHITENING_IMAGES` of them."""
    sample = np.asarray(images[:WHITENING_IMAGES], "float32")
    whitening = patch_whitening(sample, patch_size=2) if config.whitening else None
    return fast_resnet(
        sample.shape[1:], num_classes, config.widths, config.residual_stages,
        whitening=whitening, identity_init=config.identity_init,
        freeze_bn_scale=config.freeze_bn_scale, bias_lr_multiplier=config.bias_lr_multiplier,
    )


def recipe_precision(config, build_model, images, num_classes, batch_size, network=None):
    """The `PrecisionChoice` the recipe trains under: `config.precision`'s
    policy, or for `"auto"` the one `choose_precision` measures with
    `build_model` (a compiled network under the global policy) on a batch of
    `images`, kept for this machine and the `network` (its name) where one
    is given. Build the network to train under `choice.policy`."""
    if config.precision != "auto":
        return asked_precision(config.precision)
    batch = np.asarray(images[:batch_size], "float32")
    labels = one_hot(np.arange(len(batch)) % num_classes, num_classes)  # the labels do not change the time
    key = None if network is None else {"network": network, "input": list(batch.shape[1:]), "classes": num_classes,
                                        "widths": config.widths, "residual_stages": config.residual_stages,
                                        "optimizer": config.optimizer}
    return choose_precision(build_model, batch, labels, batch_size=len(batch), cache_key=key)


def compile_recipe(model, config, total_steps, task=Task()):
    """Compiles `model` with the recipe's optimizer and schedule and the
    `task`'s loss (`kadapt.recipes.task.Task`: smoothed cross-entropy on
    one-hot labels, or the mean squared error of the standardized target)
    and metrics; returns it."""
    model.compile(optimizer=recipe_optimizer(config, total_steps), loss=task.loss(config.label_smoothing),
                  metrics=task.metrics())
    return model


def recipe_optimizer(config, total_steps):
    """The recipe's optimizer (`config.optimizer`, from `OPTIMIZER_BUILDERS`)
    on its learning-rate schedule over `total_steps`, with decoupled weight decay."""
    if config.optimizer not in OPTIMIZER_BUILDERS:
        raise ValueError(f"Argument `config` must name an optimizer ({', '.join(OPTIMIZER_BUILDERS)}): choose "
                         f"one first with `kadapt.recipes.optimizer_choice.choose_optimizer`. "
                         f"Received: optimizer={config.optimizer!r}")
    return OPTIMIZER_BUILDERS[config.optimizer](recipe_schedule(config, total_steps), config)


def recipe_schedule(config, total_steps):
    """The learning rate over `total_steps`: triangular, cosine or constant, peaking at `config.learning_rate`."""
    warmup = int(config.warmup_fraction * total_steps)
    peak = PLACEHOLDER_PEAK if config.learning_rate == AUTO else config.learning_rate
    if config.schedule == "constant":
        return float(peak)
    if config.schedule == "cosine":
        return CosineAnnealing(peak, 0.0, total_steps, warmup_steps=warmup)
    # No warmup (fewer than 1 / warmup_fraction steps): start at the peak,
    # as CosineAnnealing does; [0, 1, 1] would not be a schedule at all.
    return (PiecewiseLinear([0, warmup, total_steps], [0.0, peak, 0.0]) if warmup
            else PiecewiseLinear([0, total_steps], [peak, 0.0]))


def _sgd(rate, config):
    return SGD(rate, momentum=MOMENTUM, nesterov=True, weight_decay=config.weight_decay,
               use_ema=config.ema_momentum is not None, ema_momentum=config.ema_momentum or 0.99)


def _adam(rate, config):
    return Adam(rate, weight_decay=config.weight_decay,
                use_ema=config.ema_momentum is not None, ema_momentum=config.ema_momentum or 0.99)


def _prodigy(rate, config):
    return Prodigy(rate, weight_decay=config.weight_decay,
                   use_ema=config.ema_momentum is not None, ema_momentum=config.ema_momentum or 0.99)


def _muon(optimizer):
    # Keras' Muon takes its orthogonalized step on 2-D kernels only and AdamW's on the rest (on fast_resnet:
    # every convolution filter, the BatchNorm biases and the classifier's bias); FilterMuon on the
    # convolution filters only (the classifier's kernel joins the AdamW ones, as in airbench). Both steps
    # at this rate (adam_lr_ratio 1; rms_rate 0.2 matches Muon's step size to Adam's). One decay for both
    # kinds, as the other optimizers take it. bias_lr_multiplier scales gradients, which neither step sees.
    def build(rate, config):
        built = optimizer(rate, weight_decay=config.weight_decay, adam_weight_decay=config.weight_decay,
                          use_ema=config.ema_momentum is not None, ema_momentum=config.ema_momentum or 0.99)
        live_rate(built)  # the channel kadapt's SGD and Adam have: MetaAdjuster, rescue, learning_rate_multiplier
        return built

    return build


def _schedule_free(optimizer):
    def build(rate, config):  # a float: the config allows Schedule-Free only the constant schedule
        return optimizer(rate, weight_decay=config.weight_decay)

    return build


# One builder per name of `kadapt.recipes.config.OPTIMIZERS`: `(rate or schedule, FastFitConfig) -> optimizer`.
OPTIMIZER_BUILDERS = {"sgd": _sgd, "adam": _adam, "prodigy": _prodigy,
                      "schedule_free_adamw": _schedule_free(ScheduleFreeAdamW),
                      "schedule_free_sgd": _schedule_free(ScheduleFreeSGD),
                      "muon": _muon(keras.optimizers.Muon), "muon_filters": _muon(FilterMuon)}


def muon_fallback(model):
    """`None`, or one line saying why `model`'s compiled Muon (Keras' or
    `FilterMuon`) takes its AdamW step on every weight: none is of the shape
    it orthogonalizes."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    if not isinstance(optimizer, keras.optimizers.Muon) or muon_variables(optimizer, model.trainable_variables):
        return None
    if isinstance(optimizer, FilterMuon):
        name, shape, other = "muon_filters", "convolution filter (3 to 5 dimensions)", "muon: its 2-D kernels"
    else:
        name, shape, other = "muon", "2-D kernel", "muon_filters: its convolution filters"
    return (f"--optimizer {name} falls back to its AdamW step on every weight: {model.name} has no {shape} "
            f"for Muon's orthogonalized step (--optimizer {other}; or adam)")


def with_found_learning_rate(config, model, total_steps, batches, make_trainer, seed=None, task=Task()):
    """`(config, result)`: for `learning_rate="auto"`, the range test's rate.

    Runs `kadapt.find_learning_rate` on `make_trainer()` (the compiled model
    that trains, e.g. `micro_batched(model, ...)`: the test steps are its
    steps) over the recipe's augmented `batches`, then compiles `model`
    again with the suggestion as the schedule's peak: make the trainer anew.
    Both front doors call this; `kadapt train` records the rate in
    `config.json`, so a resumed run does not test again.

    Args:
        config: `FastFitConfig`.
        model: The network, compiled by `compile_recipe`.
        total_steps: Int. The steps the schedule spans.
        batches: `tf.data.Dataset` of `(x, one-hot y)` logical batches
            (`shuffled_batches`); the test takes its first 100 (repeating it
            if it holds fewer).
        make_trainer: Callable `() -> keras.Model`.
        seed: Int or `None`. Seeds the augmentation. Defaults to `None`.
        task: `kadapt.recipes.task.Task` the model was compiled for.
            Defaults to classification.

    Returns:
        `(config with the found learning_rate, RangeTestResult)`, or
        `(config, None)` when `config.learning_rate` is a number.
    """
    if config.learning_rate != AUTO:
        return config, None
    result = find_learning_rate(make_trainer(), augmented_batches(batches.repeat(), config, seed))
    config = config.replace(learning_rate=result.suggestion)
    compile_recipe(model, config, total_steps, task)
    return config, result


def recipe_callbacks(config, total_steps):
    """The callbacks the schedule needs: `MomentumScheduler` for `"cosine"`."""
    if config.schedule != "cosine":
        return []
    warmup = int(config.warmup_fraction * total_steps)
    return [MomentumScheduler(CosineMomentum(*COSINE_MOMENTUM, total_steps, warmup_steps=warmup))]


def best_weights_callback(config, monitor, backup_dir=None):
    """`kadapt.callbacks.BestWeights` on `monitor` (kept across a resume in
    `backup_dir`, when given), or `None` when the config turns restoring
    off. Its `best_epoch` says which epoch's weights the model ends with."""
    if not config.restore_best_weights:
        return None
    return BestWeights(monitor=monitor, backup_dir=backup_dir)


def one_hot(labels, num_classes):
    """Float32 one-hot rows of int labels (N,); one-hot (N, C) labels pass through."""
    labels = np.asarray(labels)
    if labels.ndim == 2:
        return labels.astype("float32")
    return np.eye(num_classes, dtype="float32")[labels.astype(int)]


def expanded(x, y, config, num_classes, seed=None):
    """`(x, one-hot or soft y)`: the training rows with `config.expand x N`
    generated samples appended when `config.expand` is on."""
    if is_on_disk(x):  # a streamed table: nothing to expand, its targets made a batch at a time
        return x, y
    if not config.expand:
        return x, one_hot(y, num_classes)
    return expand(x, y, method=config.expand_method, factor=config.expand, num_classes=num_classes, seed=seed)


def steps_per_epoch(rows, batch_size):
    """Logical batches in one pass over `rows` training rows, the last one ragged."""
    return -(-rows // batch_size)


def shuffled_batches(x, y, batch_size, num_classes, seed=None, epochs=1, first_epoch=0):
    """Logical batches of `(x, one-hot y)` for epochs `first_epoch` to
    `epochs - 1`, one after the other, each epoch in its own order, its last
    batch ragged. Train on it with `steps_per_epoch(len(x), batch_size)`.

    With a `seed`, epoch e's order is a function of `(seed, e)` alone, so a
    run resumed at epoch e (`first_epoch=e`) sees the batches the
    uninterrupted run saw from there on. Rows on disk (`DiskRows`, with
    their `LabelTargets`) are read a window of blocks at a time."""
    check_range("first_epoch", first_epoch, low=0, high=epochs, integer=True)
    if is_on_disk(x):
        return x.shuffled_batches(y, batch_size, seed, epochs, first_epoch)
    x, labels = np.asarray(x, "float32"), one_hot(y, num_classes)
    steps = steps_per_epoch(len(x), batch_size)
    if seed is None:
        dataset = tf.data.Dataset.from_tensor_slices((x, labels))
        batches = dataset.shuffle(len(x), reshuffle_each_iteration=True).batch(batch_size).repeat(epochs - first_epoch)
    else:
        rows, targets = tf.constant(x), tf.constant(labels)

        def one_epoch(epoch):
            keys = tf.random.stateless_uniform([len(x)], seed=tf.stack([tf.constant(seed, "int64"), epoch]))
            return tf.data.Dataset.from_tensor_slices(tf.argsort(keys)).batch(batch_size)

        orders = tf.data.Dataset.range(first_epoch, epochs).flat_map(one_epoch)
        batches = orders.map(lambda order: (tf.gather(rows, order), tf.gather(targets, order)))
    return batches.apply(tf.data.experimental.assert_cardinality((epochs - first_epoch) * steps))


def augmented_batches(batches, config, seed=None, first_batch=0):
    """`batches` augmented on the fly as `config` says, in parallel, prefetched.

    With a `seed`, each batch's augmentation is a function of the seed and
    the batch's index in the run (`first_batch` is the index of the first
    one): the same on every run, and a resumed run continues as the
    uninterrupted one would.
    """
    if not config.augments:
        return batches.prefetch(tf.data.AUTOTUNE)
    pipeline = augmentation(config.flip, config.translate, config.cutout, config.cutmix, config.mixup, seed=seed)
    indexed = None if seed is None else first_batch
    return augment_dataset(batches, pipeline, first_batch=indexed).prefetch(tf.data.AUTOTUNE)


def fit_recipe(trainer: keras.Model, batches: tf.data.Dataset, config, *, epochs: int, steps_per_epoch: int,
               total_steps: int, arrange_callbacks, validation_data=None, seed: int | None = None,
               first_epoch: int = 0, backup_dir=None, verbose: int | str = 0,
               share: tuple[int, int] | None = None, **fit_kwargs) -> tuple:
    """The recipe's training, in its order: best-weights keeper, schedule
    callbacks, on-the-fly augmentation of `batches`, then `trainer.fit`.

    With a Schedule-Free optimizer, `ScheduleFreeEvaluation` goes last, on
    the augmented training batches: validation, the best weights kept and
    the model `fit` leaves are at x, the average, with BatchNorm statistics
    recomputed there.

    Both front doors (`fast_fit`, `kadapt train`) train through this.

    Args:
        trainer: The compiled model that trains (`micro_batched`).
        batches: `tf.data.Dataset` of `(x, one-hot y)` logical batches of
            epochs `first_epoch` to `epochs - 1` (`shuffled_batches`).
        config: `FastFitConfig`.
        epochs: Int. As in `Model.fit`.
        steps_per_epoch: Int. As in `Model.fit`.
        total_steps: Int. The steps the schedule spans (`compile_recipe`'s).
        arrange_callbacks: Callable `(schedule_callbacks, best_weights) ->
            list of callbacks`: where the caller's callbacks go around the
            recipe's (`best_weights` is `None` when the config restores none).
        validation_data: As in `Model.fit`. Defaults to `None`.
        seed: Int or `None`. Seeds the augmentation. Defaults to `None`.
        first_epoch: Int. The epoch `batches` starts at (a resumed run).
            Defaults to `0`.
        backup_dir: Path or `None`. Where the best weights survive a resume.
            Defaults to `None`.
        verbose: As in `Model.fit`. Defaults to `0`.
        share: `(index, count)` or `None`. Train on the index-th of count
            equal parts of every (augmented) batch: one of several JAX
            processes, each feeding its part (`process_share`). Defaults to
            `None` (every row).
        **fit_kwargs: More `Model.fit` arguments.

    Returns:
        `(history, best_weights)`: Keras' History and the best-weights
        callback (`None` when the config restores none).
    """
    if config.learning_rate == AUTO:
        raise ValueError("Argument `config` must hold a learning rate: find it first with "
                         "`with_found_learning_rate`. Received: learning_rate='auto'")
    monitor = "val_loss" if validation_data is not None else "loss"
    best = best_weights_callback(config, monitor, backup_dir=backup_dir)
    callbacks = arrange_callbacks(recipe_callbacks(config, total_steps), best)
    augmented = augmented_batches(batches, config, seed, first_batch=first_epoch * steps_per_epoch)
    if share is not None:
        augmented = process_share(augmented, *share)
    if config.optimizer in SCHEDULE_FREE:  # after the best weights: their restored x gets its statistics
        callbacks = [*callbacks, ScheduleFreeEvaluation(augmented)]
    history = trainer.fit(augmented, epochs=epochs, steps_per_epoch=steps_per_epoch,
                          validation_data=validation_data, callbacks=callbacks, verbose=verbose,
                          shuffle=False,  # the dataset shuffles; Keras would only warn
                          **fit_kwargs)
    return history, best


def process_share(batches: tf.data.Dataset, index: int, count: int) -> tf.data.Dataset:
    """The `index`-th of `count` equal parts of every batch of `(x, y)` `batches`,
    in order: what one of `count` processes feeds when Keras assembles the
    global batch from every process's rows (`kadapt.jax_processes`). Cut
    after augmenting, a mixed row is the same in every process's part as in
    the whole batch. Every batch must have a multiple of `count` rows."""
    def part(*tensors):
        size = tf.shape(tensors[0])[0] // count
        return tuple(t[index * size:(index + 1) * size] for t in tensors)

    return batches.map(part, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def micro_batched(model, micro_batch_size, memory_budget=None):
    """The model that trains: `model` itself when `micro_batch_size` is
    `None`, else `kadapt.accumulate(model, micro_batch_size)` (an int, or
    `"auto"` to probe), which recovers from out-of-memory within
    `memory_budget`."""
    if micro_batch_size is None:
        return model
    return accumulate(model, micro_batch_size, memory_budget=memory_budget)


def evaluate_recipe(model, x, y, config, task=Task(), batch_size=512):
    """The `task`'s scores (`Task.scores`) of `model` on `(x, labels y)`:
    `{"loss", "accuracy"}` (the cross-entropy, not smoothed) for classes,
    the outputs under the config's test-time augmentation
    (`FastFitConfig.test_time_augmentation`); MSE, MAE, RMSE and R² in the
    target's units for regression."""
    if is_on_disk(x):
        return _scores_on_disk(model, x, y, config, task, batch_size)
    outputs = predict_with_tta(model, x, batch_size=batch_size, **config.test_time_augmentation)
    return task.scores(outputs, y)


def _scores_on_disk(model, x, y, config, task, batch_size):
    """`Task.scores` of rows on disk, `EVALUATION_ROWS` at a time: the classes' mean loss and
    accuracy weighted by the rows of each chunk, a regression's sums merged (`RegressionSums`)."""
    sums, totals = RegressionSums(), dict.fromkeys(("loss", "accuracy"), 0.0)
    for start in range(0, len(x), EVALUATION_ROWS):
        stop = min(start + EVALUATION_ROWS, len(x))
        outputs = predict_with_tta(model, x.read(start, stop), batch_size=batch_size,
                                   **config.test_time_augmentation)
        if task.is_regression:
            sums.add(task.values(outputs), y[start:stop])
            continue
        for name, value in task.scores(outputs, y[start:stop]).items():
            totals[name] += value * (stop - start) / len(x)
    return sums.scores() if task.is_regression else totals
