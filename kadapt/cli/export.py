"""`kadapt export RUN_DIR`: the run's `model.keras` as a TensorFlow SavedModel
for a serving stack (TF Serving, TFLite's converter, `tf.saved_model.load`).

Keras' own `Model.export` writes it: one `serve` endpoint that takes the rows
as `model.keras` does (raw rows, a table's named columns, images) and
returns what it returns. Loading it needs TensorFlow alone.
"""

from pathlib import Path

from kadapt.run.errors import UsageError
from kadapt.run.run_directory import RunDirectory

FORMAT = "tf_saved_model"


def add_export_arguments(subparsers) -> None:
    parser = subparsers.add_parser("export", description=__doc__, help="write a run's model as a SavedModel")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `kadapt train`")
    parser.add_argument("--out", help="the SavedModel directory to write (default: RUN_DIR/saved_model)")
    parser.set_defaults(run=run_export)


def run_export(args) -> int:
    import keras

    from kadapt.cli.predict import load_run_model

    directory = RunDirectory(args.run_dir)
    out = Path(args.out) if args.out else directory.path / "saved_model"
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} exists and is not empty: name a new directory (or remove it).")
    if keras.backend.backend() != "tensorflow":
        raise UsageError(f"kadapt export writes a TensorFlow SavedModel, which needs the TensorFlow backend; "
                         f"this one is {keras.backend.backend()}. Run it with KERAS_BACKEND=tensorflow.")
    load_run_model(directory).export(str(out), format=FORMAT, verbose=False)
    print(f"exported {directory.path / 'model.keras'} to {out} (a SavedModel; endpoint `serve`)")
    return 0
