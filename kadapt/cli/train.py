"""`kadapt train`: the whole adaptive pipeline on a data set, into a run directory."""

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import types
from pathlib import Path

from kadapt import jax_processes
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.config import command_line_switches
from kadapt.recipes.config import switch_flag
from kadapt.run.config import AUGMENT_SETTINGS
from kadapt.run.config import MODEL_NAMES
from kadapt.run.config import TASKS
from kadapt.run.config import RunConfig
from kadapt.run.config import STREAM_SETTINGS
from kadapt.run.errors import UsageError
from kadapt.run.run_directory import RunDirectory

DEFAULTS = RunConfig(data="fashion_mnist")
RECIPE = FastFitConfig()
ON_OFF = ("on", "off")
FIT_VERBOSITIES = ("auto", "0", "1", "2")


def add_train_arguments(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", description=__doc__ + _STAGES,
        help="the recipe: probe, plan, train with accumulation and the MetaAdjuster, evaluate, save",
    )
    add_data_arguments(parser)
    _add_image_arguments(parser)
    _add_run_arguments(parser)
    add_recipe_arguments(parser.add_argument_group("the recipe (kadapt.recipes.FastFitConfig)"))
    _add_job_arguments(parser)
    parser.set_defaults(run=run_train)


def add_data_arguments(parser):
    """The data and network flags, shared with `kadapt find-lr`."""
    add = parser.add_argument
    add("--data", help="fashion_mnist, digits (scikit-learn 8x8), a .npz with x_train, y_train, x_test, y_test, "
                       "or .npy files: X.npy,Y.npy (a seeded 20%% of the rows become the test rows) or "
                       "X_TRAIN.npy,Y_TRAIN.npy,X_TEST.npy,Y_TEST.npy, or a TABLE.csv (.tsv, .csv.gz) or TABLE.parquet "
                       "with --target (empty cells are filled and flagged); string labels are class names, float labels a "
                       "regression target, integer labels classes unless they take many values (--task); or a "
                       "folder of class folders of images, photos/CLASS/*.png|jpg|jpeg|bmp|gif")
    add("--target", help="the column of --data TABLE.csv|.parquet to predict (its other columns are the inputs)")
    add("--test", help="a table of test rows with --data TABLE's columns, or a folder of the same class folders "
                       "as --data photos/ (default: a seeded 20%% of its rows or files)")
    add("--task", choices=TASKS, help="classification or regression (default: read from the labels, the reason "
                                      "printed)")
    add("--stream", choices=STREAM_SETTINGS, help="a table or an image folder: train from its encoded rows or "
                                                 "decoded images written to disk, read a block at a time (on), hold "
                                                 "them in memory (off), or auto = stream what would take more than "
                                                 "half the free memory (default: auto)")
    add("--model", help=f"the network: {', '.join(MODEL_NAMES)}, or package.module:function, a function "
                        "(input_shape, num_classes) -> uncompiled keras.Model of num_classes logits (1 output for a "
                        "regression), imported from the current "
                        "directory (default: auto = fast_resnet for images of at least 16x16 pixels, else mlp)")
    add("--batch-size", type=int, help="logical batch: rows per optimizer step (default: 256, halved down to 16 while an epoch would have fewer than 64 steps)")
    add("--augment", choices=AUGMENT_SETTINGS, help="shift images (and mirror Fashion-MNIST) during training and at test time: on, off, or auto = on "
             "for images of at least 16x16 pixels (default: auto)")
    add("--validation-split", type=float,
        help=f"fraction of training rows held out, the last ones (default: {DEFAULTS.validation_split})")
    add("--seed", type=int, help=f"random seed (default: {DEFAULTS.seed})")
    add("--train-rows", type=int, help="use only the first N training rows (short runs, tests)")


def _add_image_arguments(parser):
    """The flags of image folders (--data photos/ with photos/CLASS/*.png)."""
    add = parser.add_argument
    add("--image-size", help="image folders: the size images are resized to, HxW or N pixels (default: the median "
                             "height and width of a sample of the files, the longer side at most 64)")
    add("--skip-bad-images", action="store_true", default=None,
        help="image folders: leave out files that do not decode (truncated, corrupt) and print their count "
             "(default: such a file is an error naming it)")


def _add_run_arguments(parser):
    add = parser.add_argument
    add("--memory-budget", help="memory a step may use, e.g. 2GiB (default: the device's)")
    add("--epochs", type=int, help=f"passes over the training rows (default: {DEFAULTS.epochs})")
    add("--meta", help="MetaAdjuster meta-model: default, off, or a .keras file (default: default)")
    add("--target-accuracy", type=float, help="stop once the validation accuracy reaches this")
    add("--max-steps", type=int, help="stop after this many optimizer steps (short runs, tests)")


def add_recipe_arguments(group):
    """One flag per `FastFitConfig` switch: its name, help and choices come from the field."""
    for field in command_line_switches():
        kind = _value_type(field)
        default = getattr(RECIPE, field.name)
        options = {"dest": field.name, "help": f"{field.metadata['help']} (default: {_shown(default)})"}
        if kind is bool:
            options.update(type=_on_off, metavar="{on,off}")
        elif kind is tuple:
            options.update(type=_ints, metavar="N,N,...")
        else:
            options.update(type=kind, choices=field.metadata["choices"])
        options.setdefault("metavar", None if options.get("choices") else switch_flag(field)[2:].upper())
        group.add_argument(switch_flag(field), **options)


def _add_job_arguments(parser):
    add = parser.add_argument
    add("--fit-verbose", choices=FIT_VERBOSITIES, default="auto",
        help="Keras fit's progress output: 0 none, 1 a progress bar, 2 one line per epoch "
             "(default: auto = 1 on a terminal, else 2)")
    add("--out", help="the run directory (default: runs/DATA-MODEL-TIME)")
    add("--workers", type=int, default=1,
        help="train on N local worker processes on 127.0.0.1 (TensorFlow: tf.distribute.MultiWorkerMirroredStrategy; "
             "JAX: jax.distributed and keras.distribution.DataParallel); --batch-size is the global batch. A "
             "TF_CONFIG (or, on JAX, Keras' KERAS_DISTRIBUTION_* variables) in the environment makes this process one "
             "worker of that cluster instead (multi-host runs)")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    existing.add_argument("--resume", action="store_true",
                          help="continue the interrupted run in --out from its last finished epoch")


_STAGES = """

The recipe of kadapt.recipes.fast_fit: probe the largest micro-batch that
fits (--memory-budget), plan the logical batch as micro-batches, train with
exact in-step gradient accumulation (SGD, Nesterov, decoupled weight decay,
the triangular or cosine schedule, label smoothing, on-the-fly augmentation),
with the MetaAdjuster watching, restore the best epoch's weights, evaluate on
the test rows (test-time flips and shifts where the training used them) and save
model.keras, history, per-step log, plots and TensorBoard logs.
"""

_OPTIONS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name != "recipe") + tuple(
    f.name for f in command_line_switches())


def run_train(args) -> int:
    out = args.out or _default_out(args)
    if args.workers != 1:
        return _launch(args, out)  # before anything that loads a backend: the launcher loads none
    member = cluster_member()  # JAX's processes join before anything runs on JAX
    with member.exit_on_error(out) if member is not None else contextlib.nullcontext():
        return _train(args, out, member)


def _train(args, out, member):
    from kadapt.run.phases import PhaseClock
    from kadapt.run.phases import process_age
    from kadapt.run.pipeline import start_run
    from kadapt.run.pipeline import train

    run = start_run({name: getattr(args, name) for name in _OPTIONS}, out,
                    overwrite=args.overwrite, resume=args.resume, member=member,
                    clock=PhaseClock(start_up=process_age()))
    try:
        with run:  # this process alone writes `out` until the run ends
            train(run, echo=_echo, verbose=fit_verbosity(args.fit_verbose, sys.stdout))
    except KeyboardInterrupt:
        print(f"kadapt: interrupted: {out} keeps what finished; continue with "
              f"`kadapt train --resume --out {out}`", file=sys.stderr)
        return 130
    return 0


def cluster_member():
    """This process's part in a multi-worker run: a `kadapt.run.workers.ClusterMember`
    where `TF_CONFIG` is set, a `kadapt.run.jax_workers.JaxProcess` where Keras'
    `KERAS_DISTRIBUTION_NUM_PROCESSES` is, else `None`."""
    if os.environ.get("TF_CONFIG"):
        from kadapt.run.workers import ClusterMember

        return ClusterMember.from_environment()
    if os.environ.get(jax_processes.NUM_PROCESSES):
        from kadapt.run.jax_workers import JaxProcess  # loads Keras: not at the top of the launcher's module

        return JaxProcess.from_environment()
    return None


def fit_verbosity(setting: str, stream) -> int:
    """Keras fit's `verbose` for `--fit-verbose`: `"auto"` is a progress bar
    on a terminal and one line per epoch elsewhere (a log, a pipe: no
    carriage returns or escape codes)."""
    if setting != "auto":
        return int(setting)
    return 1 if stream.isatty() else 2


def _launch(args, out):
    from kadapt.run.workers import launch_local_workers
    from kadapt.run.workers import worker_setup

    if args.workers < 1:
        raise UsageError(f"--workers must be a positive int. Received: {args.workers}")
    setup = worker_setup(_configured_backend())
    for variable in ("TF_CONFIG", jax_processes.NUM_PROCESSES):
        if os.environ.get(variable):
            raise UsageError(f"--workers starts its own local cluster, but {variable} is set (this process is "
                             f"already one worker of a cluster): drop --workers, or unset {variable}.")
    lock, _ = RunDirectory(out).claim(args.overwrite, args.resume)  # before any worker starts
    argv = _without_workers(args.argv)
    if args.out is None:
        argv += ["--out", out]  # one directory for all: the default name has the time in it
    try:
        return launch_local_workers(args.workers, argv, echo=_echo, setup=setup, lock=lock)  # they share the lock
    finally:
        lock.release()


def _configured_backend():
    """Keras' backend as Keras will choose it, read without loading Keras (the
    launcher loads no backend): `KERAS_BACKEND`, else `keras.json`'s, else TensorFlow."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    settings = Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras") / "keras.json"
    try:
        return json.loads(settings.read_text()).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


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


def _value_type(field):
    """The type a flag's text becomes: the field's, without `None` (`float | None` is `float`)."""
    kinds = field.type.__args__ if isinstance(field.type, types.UnionType) else (field.type,)
    if float in kinds and str in kinds:
        return _number_or_word  # `learning_rate`: a number or "auto"
    kind = next(k for k in kinds if k is not type(None))
    return getattr(kind, "__origin__", kind)  # tuple[int, ...] is a tuple


def _shown(default):
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None or default == 0.0:
        return "off"
    return ",".join(map(str, default)) if isinstance(default, tuple) else str(default)


def _number_or_word(text):
    """A float, or the word itself (`FastFitConfig` judges it: "auto")."""
    try:
        return float(text)
    except ValueError:
        return text


def _on_off(text):
    if text not in ON_OFF:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from on, off)")
    return text == "on"


def _ints(text):
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, e.g. 64,128,256: {text!r}") from None


def _echo(line):
    print(line, flush=True)
