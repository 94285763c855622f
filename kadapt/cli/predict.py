"""`kadapt predict RUN_DIR --data ...`: classify rows (or predict a regression's values) with a
run's saved model, which takes the rows as they are kept: it standardizes and encodes them itself."""

import argparse
import csv
import re
import sys

import numpy as np

from kadapt.recipes.inference import predict_with_tta
from kadapt.run import RunDirectory
from kadapt.run import UsageError
from kadapt.run import run_directory as files
from kadapt.recipes.task import REGRESSION
from kadapt.recipes.task import RegressionSums
from kadapt.run.data import load_inputs
from kadapt.run.data import load_table_inputs
from kadapt.run.report import in_progress_text
from kadapt.run.tables import is_strings
from kadapt.run.tables import is_table_spec
from kadapt.run.tables import not_a_table
from kadapt.run.tables import other_file
from kadapt.run.tables import labelled
from kadapt.saving import load_model

PREDICT_BATCH_SIZE = 256
OUTPUT_SUFFIXES = (".npy", ".csv")


def add_predict_arguments(subparsers):
    parser = subparsers.add_parser("predict", description=__doc__, help="classify rows with a run's saved model")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `kadapt train`")
    parser.add_argument("--data", required=True,
                        help="fashion_mnist or digits (their test rows), a .npz with x_test[, y_test] or x[, y], "
                             "X.npy[,Y.npy] (every row), or X_TRAIN.npy,Y_TRAIN.npy,X_TEST.npy,Y_TEST.npy "
                             "(the test rows), or a .csv with the training table's columns (the --target column "
                             "optional); for a run on image folders, a folder of images (recursively; class "
                             "folders give labels) or image files separated by commas: file,class rows are written")
    parser.add_argument("--output", help="write the predicted classes (names for string labels) or values to this "
                                         ".npy or .csv file (one per row)")
    parser.add_argument("--probabilities", action="store_true",
                        help="write each row's class probabilities (softmax of the logits) to --output instead")
    parser.add_argument("--skip-bad-images", action="store_true",
                        help="a run on image folders: leave out files that do not decode and print their count "
                             "(default: such a file is an error naming it)")
    parser.set_defaults(run=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    _check_output(args.output, args.probabilities)
    directory = RunDirectory(args.run_dir)
    model = load_run_model(directory)
    notice = in_progress_text(directory)
    if notice:  # on stderr: stdout may carry the predicted rows
        print(f"{notice}; predicting with its last whole {files.MODEL}", file=sys.stderr)
    config = directory.read_json(files.CONFIG) or {}
    data = config.get("resolved", {}).get("data", {})
    regression = data.get("task", {}).get("kind") == REGRESSION
    if regression and args.probabilities:
        raise UsageError(f"--probabilities are of classes; {directory.path} is a regression, which predicts "
                         "values. Drop --probabilities.")
    if data.get("images"):  # a run on image folders: image files in, file,class rows out
        return _predict_images(args, model, config, directory.read_json(files.CLASSES))
    predictions = _Predictions(args, directory.read_json(files.CLASSES), regression, data.get("target"))
    try:
        for x, y, ids in _input_batches(args.data, config, data):
            predictions.add(_outputs(model, x, config), y, ids)
    finally:
        predictions.close()
    print(f"predicted {predictions.rows} rows of {args.data} with {directory / files.MODEL}")
    predictions.report()
    return 0


def _predict_images(args, model, config, names):
    from kadapt.run import image_predictions as images

    paths, labels = images.image_inputs(args.data, names)
    record = config["resolved"]["data"]["images"]
    kept, logits = images.image_logits(model, paths, record, _test_time_augmentation(config), args.skip_bad_images,
                                       PREDICT_BATCH_SIZE)
    decoded = [paths[i] for i in kept]
    if len(decoded) < len(paths):
        print(f"skipped {len(paths) - len(decoded)} unreadable image file(s) (--skip-bad-images)", file=sys.stderr)
    predicted = np.array(names)[np.argmax(logits, axis=-1)] if len(decoded) else np.array([], str)
    if labels is not None:
        right = predicted == labels[kept]
        print(f"accuracy {np.mean(right):.4f} ({int(np.sum(right))} of {len(right)} right)", file=sys.stderr)
    probabilities = softmax(logits) if args.probabilities else None
    rows = [[f"{p:.6g}" for p in row] for row in probabilities] if args.probabilities else [[c] for c in predicted]
    images.write_image_rows(args.output, decoded, names if args.probabilities else ["class"], rows)
    print(f"predicted {len(decoded)} images of {args.data}" + (f", written to {args.output}" if args.output else ""),
          file=sys.stderr)
    return 0


def _input_batches(spec, config, data):
    """`(rows, labels or None, row ids)` batches: a table's columns for a run trained on one (a table too
    large to hold a batch at a time, `kadapt.run.table_stream`) and its id columns, else arrays, in one
    batch."""
    if data.get("columns"):
        if not is_table_spec(spec):
            if other_file(spec):
                raise not_a_table(spec)
            raise UsageError(f"--data {spec}: this run was trained on a table; pass a .csv or .parquet file with "
                             f"its columns ({', '.join(data['columns'])}).")
        from kadapt.run.table_stream import prediction_batches
        from kadapt.run.table_stream import too_large

        if too_large([spec]):
            return prediction_batches(spec, data)
        return [load_table_inputs(spec, data, ids=True)]
    return [(*load_inputs(spec, config.get("options", {}).get("seed", 0)), {})]


def _outputs(model, x, config):
    if isinstance(x, dict) and any(is_strings(values) for values in x.values()):
        from kadapt.run.encoding import columns_dataset

        return model.predict(columns_dataset(x, PREDICT_BATCH_SIZE), verbose=0)
    if isinstance(x, dict):  # numbers only: Keras' array adapter takes them, on any backend
        return model.predict({name: values.reshape(-1, 1) for name, values in x.items()},
                             batch_size=PREDICT_BATCH_SIZE, verbose=0)
    _check_shape(model, x, config)
    return predict_with_tta(model, x, batch_size=PREDICT_BATCH_SIZE, **_test_time_augmentation(config))


class _Predictions:
    """What `kadapt predict` writes (`--output`) and reports of rows predicted
    a batch at a time: class names or indices (or their probabilities), or a
    regression's values, scored against the labels where the rows have them."""

    def __init__(self, args, names, regression, target):
        self.args, self.names, self.regression, self.target = args, names, regression, target or "value"
        self.rows, self.classes, self.handle, self.written = 0, None, None, []
        self.right = self.scored = 0
        self.errors = RegressionSums()
        self.low, self.high, self.total = np.inf, -np.inf, 0.0

    def add(self, outputs, y, ids=None):
        """Adds a batch: the model's `outputs`, its labels `y` (or `None`) and the columns that name
        its rows (`ids`, `{name: values}`: a table's ids, written first in a CSV)."""
        self.rows += len(outputs)
        ids = ids or {}
        if self.regression:
            values = outputs.reshape(-1)
            if y is not None:
                known = labelled(y)  # rows with an empty target are predicted, not scored
                self.errors.add(values[known], y[known])
            self.low, self.high = min(self.low, float(values.min(initial=np.inf))), max(
                self.high, float(values.max(initial=-np.inf)))
            self.total += float(values.sum())
            self._write(values, [self.target], ids)
            return
        classes = np.argmax(outputs, axis=-1)
        predicted = np.array(self.names)[classes] if self.names else classes
        counts = np.bincount(classes, minlength=outputs.shape[-1])
        self.classes = counts if self.classes is None else self.classes + counts
        if y is not None:
            known = labelled(y)
            given, y = predicted[known], y[known]
            self.right += int(np.sum(given == (y if self.names or y.dtype.kind in "iu" else y.astype(int))))
            self.scored += len(y)
        labels = self.names or range(outputs.shape[-1])
        if self.args.probabilities:
            self._write(softmax(outputs), [f"class_{c}" for c in labels], ids)
        else:
            self._write(predicted, ["class"], ids)

    def _write(self, rows, header, ids):
        """Appends `rows` to `--output`; `header`: the CSV's column names, written with the first rows,
        after those of `ids` (`{name: values}`), whose values lead each row."""
        output = self.args.output
        if output is None:
            return
        if output.endswith(".npy"):
            self.written.append(rows)  # saved as one array at the end (`close`)
            return
        try:
            # A class name may hold a comma or a quote: the csv module quotes it.
            if self.handle is None:
                self.handle = open(output, "w", newline="")
                csv.writer(self.handle, lineterminator="\n").writerow([*ids, *header])
            names = list(zip(*(values.tolist() for values in ids.values()))) if ids else [()] * len(rows)
            csv.writer(self.handle, lineterminator="\n").writerows(
                [*name, *row] for name, row in zip(names, _cells(rows), strict=True))
        except OSError as error:
            raise UsageError(f"--output {output} cannot be written: {error.strerror or error}.") from None

    def close(self):
        if self.handle is not None:
            self.handle.close()
        if self.written:
            try:
                np.save(self.args.output, np.concatenate(self.written))
            except OSError as error:
                raise UsageError(f"--output {self.args.output} cannot be written: {error.strerror or error}.") \
                    from None

    def report(self):
        output = self.args.output
        if self.regression:
            if self.errors.rows:
                scores = self.errors.scores()
                print(f"MAE {scores['mae']:.4g}, RMSE {scores['rmse']:.4g}, R² {scores['r2']:.4f} against the labels")
            if output is None:
                print(f"predicted {self.target}: mean {self.total / max(self.rows, 1):.4g}, from {self.low:.4g} to "
                      f"{self.high:.4g}")
            else:
                print(f"predicted values written to {output}")
            return
        if self.scored:
            print(f"accuracy {self.right / self.scored:.4f} ({self.right} of {self.scored} right)")
        if output is not None:
            print(f"{'class probabilities' if self.args.probabilities else 'predicted classes'} written to {output}")
        elif self.classes is not None:
            listed = ", ".join(f"{c}: {n}" for c, n in zip(self.names or range(len(self.classes)), self.classes))
            print(f"rows per predicted class: {listed}")


def _cells(rows):
    """The CSV cells of predicted `rows` ((N,) or (N, classes)): names as they are, whole numbers as
    such, values to 6 significant digits."""
    rows = rows.reshape(len(rows), -1)
    if rows.dtype.kind in "UO":
        return rows.tolist()
    form = "{:d}" if rows.dtype.kind in "iu" else "{:.6g}"
    return [[form.format(value) for value in row] for row in rows.tolist()]


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


def load_run_model(directory):
    path = directory / files.MODEL
    if not path.is_file():
        notice = in_progress_text(directory)
        if notice:
            raise UsageError(f"{notice}, and it holds no {files.MODEL} yet: the run saves it when it finishes.")
        raise UsageError(f"{directory.path} holds no {files.MODEL}: train it first (or let it finish).")
    try:
        return load_model(path)
    except (TypeError, ValueError) as error:
        if "deserialization of a `Lambda` layer" in str(error):
            raise UsageError(
                f"{path} holds a Lambda layer, Python code saved in the file; kadapt predict loads models in "
                "Keras' safe mode, which runs no code from a file, so it refuses it. If you trust the file, load "
                "it in Python with keras.saving.load_model(path, safe_mode=False); or replace the Lambda with a "
                "layer class registered with @keras.saving.register_keras_serializable() and train again."
            ) from None
        unknown = re.search(r"Could not locate class '([^']+)'", str(error))
        if unknown is None:
            raise
        # Safe mode imports no code named by the file: a run directory may come from anyone.
        raise UsageError(
            f"{path} uses the class {unknown.group(1)}, which kadapt predict cannot load (it imports no user "
            "code). Load it in Python: import the module that defines it (decorated with "
            "@keras.saving.register_keras_serializable()), then kadapt.load_model."
        ) from None


def _check_shape(model, x, config):
    expected = tuple(model.inputs[0].shape[1:])
    if tuple(x.shape[1:]) != expected:
        spec = config.get("options", {}).get("data")
        raise UsageError(f"--data has rows of shape {tuple(x.shape[1:])}; the model takes {expected} "
                         f"(it was trained on --data {spec}).")
