"""`FastFitConfig`: every switch of the training recipe, with the defaults it was measured with."""

import dataclasses

from kadapt.validation import check_range

SCHEDULES = ("triangular", "cosine", "constant")
# The optimizers a recipe can train with, by name (`kadapt.recipes.training.OPTIMIZER_BUILDERS` builds them);
# `"auto"` lets `kadapt train` choose one for the network (`kadapt.recipes.optimizer_choice`).
OPTIMIZERS = ("sgd", "adam", "prodigy", "schedule_free_adamw", "schedule_free_sgd", "muon", "muon_filters")
# Schedule-Free averages its iterates instead of following a schedule (`kadapt.optimizers.ScheduleFreeAdamW`).
SCHEDULE_FREE = ("schedule_free_adamw", "schedule_free_sgd")
PRECISIONS = ("float32", "bfloat16", "float16", "auto")
EXPAND_METHODS = ("mixup", "cutmix", "cutout")
AUTO = "auto"  # a `learning_rate` the range test finds (`kadapt.find_learning_rate`)


def switch(default, help: str, choices: tuple[str, ...] | None = None, flag: str | None = None) -> dataclasses.Field:
    """A `FastFitConfig` field that `kadapt train` offers as a flag.

    Args:
        default: The field's default.
        help: String. The flag's help (the default is appended to it).
        choices: Tuple of strings, or `None` for any value of the field's type.
            Defaults to `None`.
        flag: String, or `None` for the field's name. The flag is this with
            `-` for `_`. Defaults to `None`.
    """
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "flag": flag or None})


@dataclasses.dataclass(frozen=True)
class FastFitConfig:
    """Everything the recipe (`kadapt.recipes.fast_fit`, `kadapt train`) can switch.

    Attributes:
        widths, residual_stages, whitening, identity_init, freeze_bn_scale,
            bias_lr_multiplier: The network (`kadapt.models.fast_resnet`;
            `whitening` is a bool here: compute it from the training data).
        schedule: `"triangular"`: `PiecewiseLinear` 0 -> peak -> 0 with
            constant momentum 0.9 (the speed records' choice); `"cosine"`:
            `CosineAnnealing` learning rate with `CosineMomentum`
            (0.95 -> 0.85 -> 0.95) through `MomentumScheduler`. Both Nesterov.
            The two measured equal within seed noise on Fashion-MNIST
            (benchmarks/README.md#fashion_mnist_fast); triangular is the default.
            `"constant"`: the rate throughout (no warmup, no annealing).
        optimizer: `"sgd"`: `kadapt.optimizers.SGD`, Nesterov (the speed
            records' choice, measured on `fast_resnet`); `"adam"`:
            `kadapt.optimizers.Adam`; `"prodigy"`: `kadapt.optimizers.Prodigy`
            (its rate multiplies the step size it estimates); `"muon"`: Keras'
            `keras.optimizers.Muon` with kadapt's live rate
            (`kadapt.optimizers.live_rate`): its orthogonalized step on 2-D
            kernels, its AdamW step on every other variable (a convolution's
            4-D filters included); `"muon_filters"`:
            `kadapt.optimizers.FilterMuon` with the live rate: the Muon step
            on the convolution filters (each flattened to a matrix, as
            airbench), the AdamW step on every other variable; each on the
            schedule, with the decoupled weight decay. `"schedule_free_adamw"`,
            `"schedule_free_sgd"`: `kadapt.optimizers.ScheduleFreeAdamW` and
            `ScheduleFreeSGD` at the `"constant"` schedule only (they average
            the iterates instead; any other is a `ValueError`), their weight
            decay applied at the gradient point; the model evaluated,
            restored and saved is their average x, its BatchNorm statistics
            recomputed there (`kadapt.callbacks.ScheduleFreeEvaluation`). `"auto"`: `kadapt train` picks one for the
            network and rows (`kadapt.recipes.optimizer_choice.choose_optimizer`);
            `fast_fit` trains `fast_resnet`, so `"sgd"`.
        learning_rate: Peak learning rate (for the mean loss of a batch), or
            `"auto"`: before training, a learning-rate range test on the
            compiled network and the recipe's batches
            (`kadapt.find_learning_rate`, rule `"valley"`) finds it
            (`kadapt.recipes.training.with_found_learning_rate`).
        warmup_fraction: Fraction of the steps spent warming up.
        weight_decay: Keras' decoupled decay: w -= lr * weight_decay * w each
            step. A PyTorch SGD value wd_torch with momentum mu corresponds
            to about wd_torch / (1 - mu), since PyTorch's decay passes through
            the momentum buffer.
        label_smoothing: Of the categorical cross-entropy.
        flip, translate, cutout, cutmix, mixup: On-the-fly augmentation
            (`kadapt.augment.augmentation`); `flip` also turns on flip
            test-time augmentation in the recipe's evaluation.
        test_shift: Int >= 0. Pixels of the diagonal shifts that test-time
            augmentation averages in (`kadapt.recipes.predict_with_tta`),
            where the training shifts images (`translate` > 0); 0 turns
            them off. On three 8-epoch Fashion-MNIST runs, test accuracy
            92.86% without, 93.15% with flips (2 passes), 93.40% with flips
            and 1-pixel shifts (6 passes), 93.16% with 2-pixel shifts
            (benchmarks/README.md, tta_passes).
        expand: Float >= 0. Before training, append `expand x N` generated
            samples (`kadapt.augment.expand`, `expand_method`) with soft
            labels to the N training images; 0 turns it off.
        expand_method: `"mixup"`, `"cutmix"` or `"cutout"`.
        ema_momentum: `None`, or the momentum of Keras' weight averaging
            (`use_ema`); the averaged weights replace the trained ones at the
            end of `fit`.
        precision: `"float32"`, `"bfloat16"` or `"float16"` (Keras' mixed
            precision policies: float32 variables, computation in 16 bits,
            float16 with loss scaling), or `"auto"` (the default): time steps
            of the network under each the device has units for and keep the
            fastest that beats float32 by 1.15x, once per machine and network
            (`kadapt.precision.choose_precision`; `$KADAPT_PRECISION` pins one).
        restore_best_weights: At the end of training, restore the weights of
            the epoch with the best monitored value (`val_loss`, else `loss`),
            as `keras.callbacks.EarlyStopping(restore_best_weights=True)`
            does. Cannot be combined with `ema_momentum` (the averaged
            weights would be replaced by unaveraged ones).
    """

    widths: tuple[int, ...] = switch((64, 128, 256), "fast_resnet's channels per stage")
    residual_stages: tuple[int, ...] = (0, 2)
    whitening: bool = True
    identity_init: bool = True
    freeze_bn_scale: bool = True
    bias_lr_multiplier: float = 4.0
    schedule: str = switch("triangular", "triangular LR with momentum 0.9, cosine LR with cosine momentum, or "
                                         "a constant LR", choices=SCHEDULES)
    optimizer: str = switch(AUTO, "sgd (Nesterov, the recipe's for fast_resnet), adam, prodigy, schedule_free_adamw, "
                                  "schedule_free_sgd (learning-rate-free; their reference defaults), muon (Keras' "
                                  "Muon), muon_filters (Muon on the convolution filters), or auto: sgd for "
                                  "fast_resnet and small_cnn on images, adam for any other network or rows, each "
                                  "at its measured rate and schedule unless given",
                            choices=(AUTO, *OPTIMIZERS))
    learning_rate: float | str = switch(0.2, "peak learning rate (where --optimizer auto chooses adam, adam's "
                                             "measured one), or auto: find it with a learning-rate range test "
                                             "before training (kadapt.find_learning_rate)")
    warmup_fraction: float = 0.15
    weight_decay: float = switch(5e-3, "decoupled weight decay")
    label_smoothing: float = switch(0.1, "of the cross-entropy")
    flip: bool = True
    translate: float = 2 / 28
    test_shift: int = 1
    cutout: float = switch(0.0, "erase a patch of this fraction of the image")
    cutmix: float = switch(0.0, "CutMix factor")
    mixup: float = switch(0.0, "MixUp alpha")
    expand: float = switch(0.0, "append this many generated samples per training image before training "
                                "(kadapt.augment.expand)")
    expand_method: str = switch("mixup", "how --expand makes samples", choices=EXPAND_METHODS)
    ema_momentum: float | None = switch(None, "average the weights with this momentum, e.g. 0.99 "
                                              "(needs --restore-best off)", flag="ema")
    restore_best_weights: bool = switch(True, "end with the weights of the epoch with the best val_loss "
                                              "(kadapt train: images; off for tables and other rows)",
                                        flag="restore_best")
    precision: str = switch("auto", "float32, bfloat16 or float16 (Keras mixed precision), or auto: time steps "
                                    "under each the device has units for and keep the fastest that beats float32 "
                                    "by 1.15x, once per machine and network ($KADAPT_PRECISION pins one)",
                            choices=PRECISIONS)

    def __post_init__(self):
        if not self.widths or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in self.widths):
            raise ValueError(f"Argument `widths` must be positive ints, one per stage, e.g. (64, 128, 256). "
                             f"Received: widths={self.widths}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Argument `schedule` must be one of {', '.join(SCHEDULES)}. "
                             f"Received: schedule={self.schedule!r}")
        if self.optimizer not in (AUTO, *OPTIMIZERS):
            raise ValueError(f"Argument `optimizer` must be one of {', '.join((AUTO, *OPTIMIZERS))}. "
                             f"Received: optimizer={self.optimizer!r}")
        if self.learning_rate != AUTO:
            _check_rate(self.learning_rate)
        self._check_schedule_free()
        check_range("warmup_fraction", self.warmup_fraction, low=0.0, high=1.0, high_open=True)
        check_range("weight_decay", self.weight_decay, low=0.0)
        check_range("label_smoothing", self.label_smoothing, low=0.0, high=1.0)
        check_range("translate", self.translate, low=0.0, high=1.0, high_open=True)
        check_range("test_shift", self.test_shift, low=0, integer=True)
        check_range("cutout", self.cutout, low=0.0, high=1.0)
        check_range("cutmix", self.cutmix, low=0.0, high=1.0)
        check_range("mixup", self.mixup, low=0.0)
        check_range("expand", self.expand, low=0.0)
        if self.expand_method not in EXPAND_METHODS:
            raise ValueError(f"Argument `expand_method` must be one of {', '.join(EXPAND_METHODS)}. "
                             f"Received: expand_method={self.expand_method!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"Argument `precision` must be one of {', '.join(PRECISIONS)}. "
                             f"Received: precision={self.precision!r}")
        if self.ema_momentum is not None:
            check_range("ema_momentum", self.ema_momentum, low=0.0, high=1.0, high_open=True)
            if self.restore_best_weights:
                raise ValueError(
                    "Arguments `ema_momentum` and `restore_best_weights` cannot both be set: restoring "
                    "an epoch's weights would discard the average. Pass restore_best_weights=False. "
                    f"Received: ema_momentum={self.ema_momentum}, restore_best_weights=True"
                )

    def _check_schedule_free(self):
        if self.optimizer not in SCHEDULE_FREE:
            return
        if self.schedule != "constant":
            raise ValueError(f"Argument `schedule` must be 'constant' with optimizer={self.optimizer!r}: Schedule-Free "
                             f"averages its iterates instead of annealing the rate. Pass schedule='constant'. "
                             f"Received: schedule={self.schedule!r}")
        if self.ema_momentum is not None:
            raise ValueError(f"Argument `ema_momentum` must be None with optimizer={self.optimizer!r}: Schedule-Free "
                             f"averages the weights itself. Pass ema_momentum=None. "
                             f"Received: ema_momentum={self.ema_momentum}")

    @property
    def augments(self) -> bool:
        """Whether any on-the-fly augmentation is on."""
        return bool(self.flip or self.translate or self.cutout or self.cutmix or self.mixup)

    @property
    def test_time_augmentation(self) -> dict:
        """`{"flip", "shift"}`: the keyword arguments of `predict_with_tta`
        that evaluate a network trained with this config."""
        return {"flip": self.flip, "shift": self.test_shift if self.translate else 0}

    def replace(self, **changes) -> "FastFitConfig":
        """A copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)


def _check_rate(value):
    if isinstance(value, str):
        raise ValueError(f"Argument `learning_rate` must be a positive number or 'auto'. "
                         f"Received: learning_rate={value!r}")
    check_range("learning_rate", value, low=0.0, low_open=True)


def command_line_switches() -> list[dataclasses.Field]:
    """The `FastFitConfig` fields that `kadapt train` offers as flags (made with `switch`), in order."""
    return [field for field in dataclasses.fields(FastFitConfig) if "help" in field.metadata]


def switch_flag(field: dataclasses.Field) -> str:
    """The flag of a `command_line_switches` field, e.g. `--ema` for `ema_momentum`."""
    return "--" + (field.metadata["flag"] or field.name).replace("_", "-")
