"""`kadapt train`: the whole adaptive pipeline on a data set, into a run directory."""

import argparse
import os
import sys
import time
from pathlib import Path

from kadapt.recipes import FastFitConfig
from kadapt.recipes.config import EXPAND_METHODS
from kadapt.recipes.config import PRECISIONS
from kadapt.run import RunConfig
from kadapt.run import UsageError
from kadapt.run import start_run
from kadapt.run import train
from kadapt.run.config import AUGMENT_SETTINGS
from kadapt.run.config import MODEL_NAMES
from kadapt.run.config import SCHEDULE_NAMES
from kadapt.run.config import SWITCHES
from kadapt.run.run_directory import RunDirectory
from kadapt.run.workers import ClusterMember
from kadapt.run.workers import launch_local_workers

DEFAULTS = RunConfig(data="fashion_mnist")
RECIPE = FastFitConfig()


def add_train_arguments(subparsers):
    parser = subparsers.add_parser(
        "train", description=__doc__ + _STAGES,
        help="the recipe: probe, plan, train with accumulation and the MetaAdjuster, evaluate, save",
    )
    add = parser.add_argument
    add("--data", help="fashion_mnist, digits (scikit-learn 8x8), a .npz with x_train, y_train, x_test, y_test, "
                       "or .npy files: X.npy,Y.npy (a seeded 20%% of the rows become the test rows) or "
                       "X_TRAIN.npy,Y_TRAIN.npy,X_TEST.npy,Y_TEST.npy; labels are integer classes")
    add("--model", help=f"the network: {', '.join(MODEL_NAMES)}, or package.module:function, a function "
                        "(input_shape, num_classes) -> uncompiled keras.Model of logits, imported from the current "
                        "directory (default: auto = fast_resnet for images of at least 16x16 pixels, else mlp)")
    add("--batch-size", type=int, help=f"logical batch: rows per optimizer step (default: {DEFAULTS.batch_size})")
    add("--memory-budget", help="memory a step may use, e.g. 2GiB (default: the device's)")
    add("--epochs", type=int, help=f"passes over the training rows (default: {DEFAULTS.epochs})")
    add("--widths", type=_widths,
        help=f"fast_resnet's channels per stage (default: {','.join(map(str, RECIPE.widths))})")
    add("--schedule", choices=SCHEDULE_NAMES,
        help=f"triangular LR with momentum 0.9, or cosine LR with cosine momentum (default: {RECIPE.schedule})")
    add("--learning-rate", type=float, help=f"peak learning rate (default: {RECIPE.learning_rate})")
    add("--weight-decay", type=float, help=f"decoupled weight decay (default: {RECIPE.weight_decay})")
    add("--label-smoothing", type=float, help=f"of the cross-entropy (default: {RECIPE.label_smoothing})")
    add("--cutout", type=float, help="erase a patch of this fraction of the image (default: off)")
    add("--cutmix", type=float, help="CutMix factor (default: off)")
    add("--mixup", type=float, help="MixUp alpha (default: off)")
    add("--expand", type=float, help="append this many generated samples per training image before training "
                                      "(kadapt.augment.expand; default: off)")
    add("--expand-method", choices=EXPAND_METHODS, help="how --expand makes samples (default: mixup)")
    add("--precision", choices=PRECISIONS,
        help="float32, bfloat16 or float16 (Keras mixed precision), or auto: time a few steps under each the "
             f"device has units for and keep the fastest that beats float32 by 1.15x (default: {RECIPE.precision})")
    add("--ema", type=float, help="average the weights with this momentum, e.g. 0.99 (needs --restore-best off)")
    add("--restore-best", choices=SWITCHES,
        help="end with the weights of the epoch with the best val_loss (default: on)")
    add("--meta", help="MetaAdjuster meta-model: default, off, or a .keras file (default: default)")
    add("--target-accuracy", type=float, help="stop once the validation accuracy reaches this")
    add("--augment", choices=AUGMENT_SETTINGS, help="augment images with kadapt.augment (default: auto)")
    add("--validation-split", type=float,
        help=f"fraction of training rows held out, the last ones (default: {DEFAULTS.validation_split})")
    add("--seed", type=int, help=f"random seed (default: {DEFAULTS.seed})")
    add("--max-steps", type=int, help="stop after this many optimizer steps (short runs, tests)")
    add("--train-rows", type=int, help="use only the first N training rows (short runs, tests)")
    add("--out", help="the run directory (default: runs/DATA-MODEL-TIME)")
    add("--workers", type=int, default=1,
        help="train on N local worker processes (tf.distribute.MultiWorkerMirroredStrategy, 127.0.0.1); "
             "--batch-size is the global batch. A TF_CONFIG in the environment makes this process one "
             "worker of that cluster instead (multi-host runs)")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    existing.add_argument("--resume", action="store_true",
                          help="continue the interrupted run in --out from its last finished epoch")
    parser.set_defaults(run=run_train)


_STAGES = """

The recipe of kadapt.recipes.fast_fit: probe the largest micro-batch that
fits (--memory-budget), plan the logical batch as micro-batches, train with
exact in-step gradient accumulation (SGD, Nesterov, decoupled weight decay,
the triangular or cosine schedule, label smoothing, on-the-fly augmentation),
with the MetaAdjuster watching, restore the best epoch's weights, evaluate on
the test rows (test-time flips and shifts where the training used them) and save
model.keras, history, per-step log, plots and TensorBoard logs.
"""

_OPTIONS = ("data", "model", "batch_size", "memory_budget", "epochs", "widths", "schedule", "learning_rate",
            "weight_decay", "label_smoothing", "cutout", "cutmix", "mixup", "expand", "expand_method", "precision",
            "ema",
            "restore_best", "meta", "target_accuracy", "augment", "validation_split", "seed", "max_steps",
            "train_rows")


def run_train(args):
    out = args.out or _default_out(args)
    if args.workers != 1:
        return _launch(args, out)
    member = ClusterMember.from_environment()
    run = start_run({name: getattr(args, name) for name in _OPTIONS}, out,
                    overwrite=args.overwrite, resume=args.resume, member=member)
    try:
        train(run, echo=_echo)
    except KeyboardInterrupt:
        print(f"kadapt: interrupted: {out} keeps what finished; continue with "
              f"`kadapt train --resume --out {out}`", file=sys.stderr)
        return 130
    return 0


def _launch(args, out):
    if args.workers < 1:
        raise UsageError(f"--workers must be a positive int. Received: {args.workers}")
    if os.environ.get("TF_CONFIG"):
        raise UsageError("--workers starts its own local cluster, but TF_CONFIG is set (this process is "
                         "already one worker of a cluster): drop --workers, or unset TF_CONFIG.")
    RunDirectory(out).check_new_run(args.overwrite, args.resume)  # before any worker starts
    argv = _without_workers(args.argv)
    if args.out is None:
        argv += ["--out", out]  # one directory for all: the default name has the time in it
    return launch_local_workers(args.workers, argv, echo=_echo)


def _without_workers(argv):
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            kept.append(arg)
    return kept


def _default_out(args):
    if args.resume:
        raise UsageError("--resume needs --out, the run directory to continue.")
    data = Path(args.data or "data").stem
    return f"runs/{data}-{args.model or 'auto'}-{time.strftime('%Y%m%d-%H%M%S')}"


def _widths(text):
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, e.g. 64,128,256: {text!r}") from None


def _echo(line):
    print(line, flush=True)
