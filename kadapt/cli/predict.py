"""`kadapt predict RUN_DIR --data ...`: classify rows with a run's saved model."""

import argparse
import re

import numpy as np

from kadapt.recipes.inference import predict_with_tta
from kadapt.run import RunDirectory
from kadapt.run import UsageError
from kadapt.run import run_directory as files
from kadapt.run.data import load_inputs
from kadapt.saving import load_model

PREDICT_BATCH_SIZE = 256
OUTPUT_SUFFIXES = (".npy", ".csv")


def add_predict_arguments(subparsers):
    parser = subparsers.add_parser("predict", description=__doc__, help="classify rows with a run's saved model")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `kadapt train`")
    parser.add_argument("--data", required=True,
                        help="fashion_mnist or digits (their test rows), a .npz with x_test[, y_test] or x[, y], "
                             "X.npy[,Y.npy] (every row), or X_TRAIN.npy,Y_TRAIN.npy,X_TEST.npy,Y_TEST.npy "
                             "(the test rows)")
    parser.add_argument("--output", help="write the predicted classes to this .npy or .csv file (one per row)")
    parser.add_argument("--probabilities", action="store_true",
                        help="write each row's class probabilities (softmax of the logits) to --output instead")
    parser.set_defaults(run=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    _check_output(args.output, args.probabilities)
    directory = RunDirectory(args.run_dir)
    model = _load_model(directory)
    config = directory.read_json(files.CONFIG) or {}
    x, y = load_inputs(args.data, config.get("options", {}).get("seed", 0))
    _check_shape(model, x, args.data)
    logits = predict_with_tta(model, x, batch_size=PREDICT_BATCH_SIZE, **_test_time_augmentation(config))
    classes = np.argmax(logits, axis=-1)
    print(f"predicted {len(classes)} rows of {args.data} with {directory / files.MODEL}")
    if y is not None:
        print(f"accuracy {np.mean(classes == y):.4f} ({int(np.sum(classes == y))} of {len(y)} right)")
    if args.output is not None:
        what = "class probabilities" if args.probabilities else "predicted classes"
        _save(args.output, softmax(logits) if args.probabilities else classes)
        print(f"{what} written to {args.output}")
    else:
        counts = np.bincount(classes, minlength=int(model.outputs[0].shape[-1]))
        print("rows per predicted class: " + ", ".join(f"{c}: {n}" for c, n in enumerate(counts)))
    return 0


def softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of class probabilities; the networks `kadapt train` trains output logits."""
    logits = np.asarray(logits, "float32")  # a mixed-precision network may give float16
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))  # no overflow for large logits
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _check_output(output, probabilities):
    if output is not None and not output.endswith(OUTPUT_SUFFIXES):
        raise UsageError(f"--output must name a .npy or .csv file. Received: --output={output}")
    if probabilities and output is None:
        raise UsageError("--probabilities writes to --output: add --output probabilities.npy (or .csv).")


def _test_time_augmentation(config):
    """As the run evaluated; a run recorded before test-time shifts existed used flips only."""
    resolved = config.get("resolved", {})
    flip = bool(resolved.get("recipe", {}).get("flip", False))
    return resolved.get("test_time_augmentation", {"flip": flip, "shift": 0})


def _load_model(directory):
    path = directory / files.MODEL
    if not path.is_file():
        raise UsageError(f"{directory.path} holds no {files.MODEL}: train it first (or let it finish).")
    try:
        return load_model(path)
    except (TypeError, ValueError) as error:
        unknown = re.search(r"Could not locate class '([^']+)'", str(error))
        if unknown is None:
            raise
        # Safe mode imports no code named by the file: a run directory may come from anyone.
        raise UsageError(
            f"{path} uses the class {unknown.group(1)}, which kadapt predict cannot load (it imports no user "
            "code). Load it in Python: import the module that defines it (decorated with "
            "@keras.saving.register_keras_serializable()), then kadapt.load_model."
        ) from None


def _check_shape(model, x, spec):
    expected = tuple(model.inputs[0].shape[1:])
    if tuple(x.shape[1:]) != expected:
        raise UsageError(f"--data {spec} has rows of shape {tuple(x.shape[1:])}; the model takes {expected}.")


def _save(path, rows):
    """`.npy`, or `.csv` with a header: `class`, or `class_0,class_1,...` for probabilities."""
    try:
        if path.endswith(".npy"):
            np.save(path, rows)
        elif rows.ndim == 1:
            np.savetxt(path, rows, fmt="%d", header="class", comments="")
        else:
            header = ",".join(f"class_{c}" for c in range(rows.shape[1]))
            np.savetxt(path, rows, fmt="%.6g", delimiter=",", header=header, comments="")
    except OSError as error:
        raise UsageError(f"--output {path} cannot be written: {error.strerror or error}.") from None
