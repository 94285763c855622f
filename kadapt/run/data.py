"""The data of a run: a named offline set, a user's `.npz` or `.npy` files, or a CSV or Parquet table.

Images become (N, height, width, channels) float32; uint8 pixels are scaled
to [0, 1]. `kadapt train` and `kadapt predict` prepare inputs the same way,
here, so a saved model sees at inference what it saw in training. Rows that
are not images are encoded by layers made from the training rows
(`kadapt.run.encoding`: missing values filled and flagged), which
`model.keras` keeps; the labels say the task (`kadapt.run.labels`). Every
choice made about the user's data (a column dropped or kept, rows without a
label, the task) is a note of the run, printed and saved in its config.
"""

import dataclasses
import functools
import zipfile
from pathlib import Path

import numpy as np

from kadapt.extras import require
from kadapt.recipes.disk_rows import LabelTargets
from kadapt.recipes.disk_rows import is_on_disk
from kadapt.recipes.task import Task
from kadapt.run import tables
from kadapt.run.coded_strings import CodedStrings
from kadapt.run.config import DATA_NAMES
from kadapt.run.errors import UsageError
from kadapt.run.image_folders import check_image_flags
from kadapt.run.image_folders import is_image_folder
from kadapt.run.labels import label_task
from kadapt.run.tables import is_table_spec

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
# The test rows split off a set that comes without them (digits, `--data x.npy,y.npy`).
TEST_FRACTION = 0.2
NPY_FORMS = "X.npy,Y.npy or X_TRAIN.npy,Y_TRAIN.npy,X_TEST.npy,Y_TEST.npy"


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """Train, validation and test rows as the network takes them, and their labels.

    `x_*` are float32: images as prepared, table rows encoded by `encoder`
    (`kadapt.run.encoding`, adapted on the training rows; `None` for images).
    `y_*` are int class labels (class names become their index in
    `class_names`) or float targets (regression), as `task` says.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    task: Task
    encoder: object = None
    class_names: tuple | None = None  # string labels, sorted
    columns: dict | None = None  # a table's feature columns: {name: "numeric", "string" or "date"}
    target: str | None = None  # a table's label column
    dropped: dict | None = None  # a table's columns left out: {name: reason}
    notes: tuple = ()  # what was chosen about the data, one line each
    vocabularies: dict | None = None  # a table's string columns given to the model as indices (not on TensorFlow)
    embedding_sizes: tuple = ()  # the index counts of a table's embedded columns, the matrix's last (`Statistics`)
    images: dict | None = None  # image folders: the training size, its reason, the files (`kadapt.run.image_folders`)

    @property
    def num_classes(self):
        """The network's output width: the classes, or 1 for regression."""
        return self.task.outputs

    @property
    def input_shape(self):
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def is_image(self):
        return self.x_train.ndim == 4

    def targets(self, y):
        """What the network is trained to output for labels `y` (`Task.targets`)."""
        return self.task.targets(y)

    @property
    def streamed(self):
        """Whether the rows are on disk (a streamed table, `kadapt.recipes.disk_rows`), not arrays."""
        return is_on_disk(self.x_train)

    @functools.cached_property
    def train_targets(self):
        """`targets(y_train)`, made once and read-only: the training stream, a rescue's range test
        and a judged restart's branch share it (one-hot rows of many classes are large); for rows
        on disk, made a batch at a time (`LabelTargets`)."""
        if self.streamed:
            return LabelTargets(self.y_train, self.task)
        return _read_only(self.targets(self.y_train))

    @functools.cached_property
    def val_targets(self):
        """`targets(y_val)`, made once and read-only (fit's validation and a judged restart's score)."""
        if self.streamed:
            return LabelTargets(self.y_val, self.task)
        return _read_only(self.targets(self.y_val))

    def in_memory(self, rows):
        """`(x_train, train_targets, x_val, val_targets)` as arrays: all of them, or for rows on
        disk about `rows` training and `rows // 4` validation rows spread over the files (what a
        range test and a judged restart read)."""
        if not self.streamed:
            return self.x_train, self.train_targets, self.x_val, self.val_targets
        train, x_train = self.x_train.sample(rows)
        val, x_val = self.x_val.sample(rows // 4)
        return x_train, self.train_targets[train], x_val, self.val_targets[val]

    def chance_loss(self, label_smoothing=0.0, on_validation=False):
        """The loss of the best constant predictor (`Task.chance_loss`, fit on
        `y_train`): the cross-entropy of the training label frequencies
        (smoothed by `label_smoothing`), or the standardized target's mean
        squared distance from the training mean; scored on the training rows,
        or on the validation rows (`on_validation`)."""
        return self.task.chance_loss(self.y_train, label_smoothing, self.y_val if on_validation else None)

    def summary(self):
        return {
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "task": self.task.to_dict(),
            "train_rows": len(self.x_train),
            "validation_rows": len(self.x_val),
            "test_rows": len(self.x_test),
            **({"streamed": True} if self.streamed else {}),
            **({"target": self.target, "columns": self.columns, "dropped_columns": self.dropped or {}}
               if self.columns else {}),
            **({"classes": list(self.class_names)} if self.class_names else {}),
            **({"vocabularies": self.vocabularies} if self.vocabularies else {}),
            **({"images": self.images} if self.images else {}),
            "notes": list(self.notes),
        }


def load_data(config):
    """The `TrainingData` of a `RunConfig`: its set, rows and validation split,
    the task its labels call for, table rows encoded by layers adapted on
    the training rows alone."""
    if is_image_folder(config.data):
        return _image_folder_data(config)
    check_image_flags(config)
    if is_table_spec(config.data):
        from kadapt.run.table_stream import stream_reason

        reason = stream_reason(config)
        if reason is not None:
            return _streamed_data(config, reason)
    return _training_data(config, *_raw_data(config))


def _streamed_data(config, reason):
    """A table too large to hold (`kadapt.run.table_stream`): its encoded rows on disk, its labels in memory."""
    from kadapt.run.table_stream import stream_table

    table = stream_table(config, reason, TEST_FRACTION)
    (x_train, x_val, x_test), (y_train, y_val, y_test) = table.x, table.y
    return TrainingData(x_train, y_train, x_val, y_val, x_test, y_test, table.labels.task, table.encoder,
                        table.labels.class_names, columns=table.plan.kinds, target=config.target,
                        dropped=table.plan.dropped, notes=tuple(table.notes), vocabularies=table.vocabularies or None,
                        embedding_sizes=table.embedding_sizes)


def _training_data(config, train, test, plan, notes):
    """`load_data`'s rows, split and labelled: `train` and `test` as `(x, y)`."""
    (x_train, y_train), (x_test, y_test) = train, test
    if config.train_rows is not None:
        x_train, y_train = _take(x_train, slice(config.train_rows)), y_train[: config.train_rows]
    # As Keras' `validation_split`: the last rows, before any shuffling.
    rows = len(y_train)
    cut = _validation_cut(rows, config.validation_split)
    if cut <= 0:
        raise UsageError(f"--data {config.data} leaves no training rows after the validation split.")
    labels = label_task(config.data, y_train[:cut], (y_train[cut:], y_test), config.task)
    notes = [*notes, f"task: {labels.task.kind} ({labels.reason})"]
    x_parts = [_take(x_train, slice(cut)), _take(x_train, slice(cut, None)), x_test]
    x_parts, encoder, encoder_notes, vocabularies, sizes = _encoded(x_parts, plan, config.model)
    y_parts = [labels.coded(y) for y in (y_train[:cut], y_train[cut:], y_test)]
    table = {"columns": plan.kinds, "target": config.target, "dropped": plan.dropped} if plan else {}
    return TrainingData(x_parts[0], y_parts[0], x_parts[1], y_parts[1], x_parts[2], y_parts[2], labels.task, encoder,
                        labels.class_names, notes=tuple([*notes, *encoder_notes]), vocabularies=vocabularies or None,
                        embedding_sizes=sizes, **table)


def _image_folder_data(config):
    """Class folders of image files, decoded (`kadapt.run.image_folders`), then
    split and labelled as any rows: the training files come in a seeded order."""
    from kadapt.run.image_folders import read_image_folders

    images = read_image_folders(config)
    return dataclasses.replace(_training_data(config, images.train, images.test, None, []), images=images.record)


def _raw_data(config):
    """`(x_train, y_train), (x_test, y_test), plan, notes`: arrays, or a
    table's model columns (dicts of (N,) arrays) with its `ColumnPlan` (else
    `None`), and the notes of what was chosen."""
    if is_table_spec(config.data):
        return _table_data(config)
    if config.target is not None or config.test is not None:
        if tables.other_file(config.data):  # a table in a form kadapt does not read (a spreadsheet, ...)
            raise tables.not_a_table(config.data)
        flag = "--target" if config.target is not None else "--test"
        value = config.target if config.target is not None else config.test
        raise UsageError(f"{flag} goes with a table (--data TABLE.csv or TABLE.parquet); --data {config.data} is "
                         f"not one. Drop {flag}. Received: {flag}={value}")
    if config.stream == "on":
        raise UsageError(f"--stream on reads a table or an image folder from disk; --data {config.data} is arrays, "
                         "held in memory. Drop --stream.")
    train, test = load_arrays(config.data, config.seed)
    return train, test, None, []


def _table_data(config):
    table = tables.read_table(config.data, target=config.target)
    tables.check_target(config.data, table.columns, config.target)
    (x, y), notes = _labelled_rows(config.data, table, config.target)
    notes = [*table.notes, *notes]
    tables.check_input_names(config.data, x)
    plan = tables.column_plan(x, table.decimal_point)
    notes += tables.plan_notes(plan)
    x = tables.model_columns(x, plan.kinds)
    if config.test is None:
        train, test = _seeded_split(x, y, config.seed, config)
        return train, test, plan, notes
    test_table = tables.read_table(config.test, flag="--test", kinds=plan.kinds, words=config.target)
    tables.check_same_columns(config.test, {k: v for k, v in test_table.columns.items() if k != config.target},
                              plan, flag="--test")
    if config.target not in test_table.columns:
        raise UsageError(f"--test {config.test} lacks the --target column {config.target}: test rows need their "
                         "labels. Add the column.")
    (x_test, y_test), test_notes = _labelled_rows(config.test, test_table, config.target, "--test")
    test_notes = [*test_table.notes, *test_notes]
    return (x, y), (tables.model_columns(x_test, plan.kinds), y_test), plan, notes + test_notes


def _labelled_rows(path, table, target, flag="--data"):
    """`(feature columns, labels)` of the rows of `table` that have a label, and a note of those left out."""
    columns = dict(table.columns)
    labels = columns.pop(target)
    tables.check_label_words(path, target, labels, decimal_point=table.decimal_point)
    keep = tables.labelled(labels)
    array = tables.label_array(path, target, labels, target in table.integer, table.decimal_point)  # "?": missing
    written = array.dtype.kind == "f" and tables.written_numbers(labels[keep], tables.written_kind(table.decimal_point))
    notes = []
    if not keep.all():
        notes.append(f"{flag} {path}: {int((~keep).sum())} of {len(keep)} rows have no {target} "
                     f"({tables.unlabelled_text(tables.label_markers(labels))}): left out")
        columns, array = {name: values[keep] for name, values in columns.items()}, array[keep]
    if written:  # words that were numbers written for people
        notes.append(f"--target {target}: numbers written with thousands separators or a currency sign: read as "
                     "numbers")
    return (columns, array), notes


def _encoded(x_parts, plan, model):
    """`(x_parts encoded, encoder, notes, vocabularies, embedding_sizes)`: the
    encoder made from the training rows (`x_parts[0]`), of a table's model
    columns or of array rows (N, features), and the parts as the float
    matrices it makes; images (and other shapes) as they are, encoder `None`.
    `vocabularies`: `kadapt.run.encoding.column_encoder`'s; `model`: the
    run's `--model` (whether it embeds, `kadapt.run.encoding.embeds`)."""
    from kadapt.run import encoding

    x_train = x_parts[0]
    if plan is not None:
        stats = encoding.statistics(x_train, embed=encoding.embeds(model))
        kinds = {name: tables.STRING if name in stats.vocabularies else tables.NUMERIC for name in x_train}
        encoder, vocabularies = encoding.column_encoder(stats, kinds)
        return (encoding.training_rows(stats, kinds, x_parts, encoder), encoder, encoding.notes(stats, "column {}"),
                vocabularies, stats.embedding_sizes)
    if x_train.ndim != 2:
        return x_parts, None, [], {}, ()
    stats = encoding.statistics(dict(enumerate(x_train.T)))
    encoder = encoding.row_encoder(stats, x_train.shape[1])
    return ([encoding.encode(encoder, x) for x in x_parts], encoder,
            encoding.notes(stats, "column {} (counted from 0) of the inputs"), {}, ())


def input_file(spec):
    """The file of `--data` that holds the training inputs."""
    return spec.split(",")[0] if is_npy_spec(spec) else spec


def _take(x, index):
    if is_on_disk(x):  # a range of the rows on disk, nothing read
        return x.part(index.start, index.stop)
    return {name: values[index] for name, values in x.items()} if isinstance(x, dict) else x[index]


def load_arrays(spec: str, seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """`(x_train, y_train), (x_test, y_test)` of a name, an `.npz` path or
    comma-separated `.npy` paths (`NPY_FORMS`), prepared."""
    if spec == "fashion_mnist":
        train, test = _fashion_mnist()
    elif spec == "digits":
        train, test = _digits(seed)
    elif spec.endswith(".npz"):
        arrays = read_npz(spec, NPZ_KEYS)
        train, test = (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])
    elif is_npy_spec(spec):
        train, test = _npy_arrays(spec, seed)
    else:
        raise UsageError(
            f"--data must be one of {', '.join(DATA_NAMES)} or a .npz file with "
            f"{', '.join(NPZ_KEYS)}, or .npy files {NPY_FORMS}. Received: --data={spec}"
        )
    return _prepared(spec, *train), _prepared(spec, *test)


def is_npy_spec(spec: str) -> bool:
    """Whether `--data` names `.npy` files (comma-separated)."""
    return any(path.endswith(".npy") for path in spec.split(","))


def read_npy(path: str) -> np.ndarray:
    """The array of one `.npy` file (no pickled objects), or a `UsageError`."""
    if not Path(path).is_file():
        raise UsageError(f"--data {path} does not exist.")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise UsageError(
            f"--data {path} is not a readable .npy of a numeric array ({_one_line(error)})."
        ) from None
    if not isinstance(array, np.ndarray):  # np.load reads an archive whatever its name
        array.close()
        raise UsageError(f"--data {path} is an .npz archive, not one .npy array: rename it to .npz.")
    return array


def read_npz(path: str, keys: tuple) -> dict:
    """The arrays `keys` of an `.npz` file (no pickled objects), or a `UsageError`."""
    if not Path(path).is_file():
        raise UsageError(f"--data {path} does not exist.")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise UsageError(
            f"--data {path} is not a readable .npz of numeric arrays ({_one_line(error)})."
        ) from None
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise UsageError(
            f"--data {path} lacks {', '.join(missing)}: it needs {', '.join(keys)} "
            f"(it has: {', '.join(arrays) or 'nothing'})."
        )
    return {key: arrays[key] for key in keys}


def prepare_inputs(spec: str, x: np.ndarray) -> np.ndarray:
    """Float32 inputs: uint8 images scaled to [0, 1], a channel axis added to
    (N, height, width) images. NaN or inf is a `UsageError` naming the row and column."""
    if x.dtype.kind not in "uif":
        raise UsageError(f"--data {spec}: inputs must be numbers. Received dtype {x.dtype}.")
    if x.ndim < 2:
        raise UsageError(f"--data {spec}: inputs need a row axis and features. Received shape {x.shape}.")
    _check_finite(spec, x)
    scale = 255.0 if x.dtype == np.uint8 else 1.0
    x = x.astype("float32") / scale
    return x[..., None] if x.ndim == 3 else x


def prepare_labels(spec: str, y: np.ndarray, rows: int) -> np.ndarray:
    """Labels, shape (N,): integer classes, float targets or class names
    (`kadapt.run.labels` tells the task from them)."""
    y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if y.ndim != 1 or y.dtype.kind not in "iufU" or len(y) != rows:
        raise UsageError(
            f"--data {spec}: labels must be {rows} values, one per input row: integer classes, float targets or "
            f"class names. Received shape {y.shape}, dtype {y.dtype}."
        )
    return y


def _check_finite(spec, x):
    """Inf is an error; NaN is missing, which only rows of features (N, features) may be."""
    if x.dtype.kind != "f":
        return
    bad = np.isinf(x) if x.ndim == 2 else ~np.isfinite(x)
    if not bad.any():
        return
    row, *position = (int(i) for i in np.argwhere(bad)[0])
    where = f"column {position[0]}" if len(position) == 1 else f"position {tuple(position)}"
    what = "a missing value (NaN), which only rows of features may hold" if np.isnan(x[(row, *position)]) \
        else f"{x[(row, *position)]}, not a number a network can learn from"
    raise UsageError(f"--data {input_file(spec)}: row {row}, {where} (counted from 0) of the inputs is {what}. "
                     "Fix or drop the row.")


def _prepared(spec, x, y):
    x = prepare_inputs(spec, x)
    return x, prepare_labels(spec, y, len(x))


def _fashion_mnist():
    from kadapt.datasets import fashion_mnist

    try:
        return fashion_mnist()
    except FileNotFoundError as error:
        raise UsageError(_one_line(error)) from None


def _digits(seed):
    """scikit-learn's 8x8 digits (pixels 0..16, scaled to [0, 1]), a seeded 80/20 split."""
    load_digits = require("sklearn.datasets", extra="data").load_digits

    digits = load_digits()
    return _seeded_split((digits.images / 16.0).astype("float32"), digits.target, seed)


def _seeded_split(x, y, seed, config=None):
    """`(x_train, y_train), (x_test, y_test)`: a seeded `TEST_FRACTION` of the
    rows, drawn at random because files are often sorted by class.

    With a table's `config`, its `--train-rows` are drawn here too, and each
    part is gathered in the file's order, a gather that reads memory forward
    (about 3x faster on a long table than the draw's order,
    benchmarks/README.md#table_scale); then the validation rows that
    `_training_data` cuts off the training part's end are put back in the
    draw's order (a restart is judged on the first of them), a shuffle
    within those rows alone. The training shuffles the others anyway."""
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - TEST_FRACTION))
    train, test = order[:cut], order[cut:]
    if config is None:
        return (_take(x, train), y[train]), (_take(x, test), y[test])
    train = train[: config.train_rows]
    kept = _validation_cut(len(train), config.validation_split)
    validation = _in_file_order(train[kept:], len(y))
    drawn = np.searchsorted(validation, train[kept:])  # the draw's order, as positions in `validation`
    x_train, y_train = _gathered(x, y, np.concatenate([_in_file_order(train[:kept], len(y)), validation]))
    for values in (*x_train.values(), y_train):
        _codes(values)[kept:] = _codes(values)[kept:][drawn]
    return (x_train, y_train), _gathered(x, y, _in_file_order(test, len(y)))


def _gathered(x, y, rows):
    return _take(x, rows), y[rows]


def _codes(values):
    """The array of a model column (a `CodedStrings`' codes) or labels, to reorder in place."""
    return values.codes if isinstance(values, CodedStrings) else values


def _validation_cut(rows, validation_split):
    """How many of `rows` training rows train, the rest validating (Keras' `validation_split`)."""
    return rows - int(rows * validation_split)


def _in_file_order(rows, count):
    """The distinct row numbers `rows` (of `count` rows) in increasing order (a mask: no sort)."""
    chosen = np.zeros(count, bool)
    chosen[rows] = True
    return np.flatnonzero(chosen)


def _npy_paths(spec, counts):
    """The paths of `--data X.npy,Y.npy[,...]`, `len` in `counts`."""
    paths = spec.split(",")
    if len(paths) not in counts or not all(path.endswith(".npy") for path in paths):
        raise UsageError(f"--data takes {' or '.join(map(str, counts))} .npy files separated by commas, "
                         f"{NPY_FORMS}. Received: --data={spec}")
    return paths


def _npy_arrays(spec, seed):
    """Train and test arrays of 4 files, or of 2 with the test rows split off."""
    paths = _npy_paths(spec, (2, 4))
    arrays = [read_npy(path) for path in paths]
    if len(arrays) == 4:
        for path, x in zip(paths[::2], arrays[::2]):
            prepare_inputs(path, x)  # a bad row named in its own file
        return tuple(arrays[:2]), tuple(arrays[2:])
    # Checked before the split, which would cut a label file of other rows into a plausible
    # shape; `load_arrays` prepares them again, which leaves prepared arrays as they are.
    x = prepare_inputs(spec, arrays[0])
    return _seeded_split(x, prepare_labels(spec, arrays[1], len(x)), seed)


def _one_line(error):
    return " ".join(str(error).split())


def load_inputs(spec: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows to predict and their labels (`None` when the file has none): the
    test split of a named set or of four `.npy` files, `x_test`/`y_test`
    (else `x`/`y`) of an `.npz`, or every row of `X.npy[,Y.npy]`."""
    if is_npy_spec(spec) and len(spec.split(",")) < 4:
        return _npy_inputs(spec)
    if not spec.endswith(".npz"):
        _, (x, y) = load_arrays(spec, seed)
        return x, y
    with_keys = _npz_keys(spec)
    x_key = "x_test" if "x_test" in with_keys else "x"
    y_key = "y_test" if x_key == "x_test" else "y"
    keys = (x_key, y_key) if y_key in with_keys else (x_key,)
    arrays = read_npz(spec, keys)
    x = prepare_inputs(spec, arrays[x_key])
    y = prepare_labels(spec, arrays[y_key], len(x)) if y_key in arrays else None
    return x, y


def load_table_inputs(spec: str, data: dict, ids: bool = False) -> tuple:
    """The model columns of every row of the table file `spec`, read as the
    run's config `data` says (its columns' kinds, those dropped, its target),
    and the target's labels (`None` without that column); with `ids`, also
    the columns the run dropped as ids, as written (`kadapt.run.tables.row_ids`)."""
    from kadapt.run.encoding import table_inputs

    # A CSV's ids read as written ("007" stays so); a Parquet file's as it stores them.
    csv = tables.table_suffix(spec) in tables.CSV_SUFFIXES
    named = {name: tables.STRING for name in tables.id_columns(data)} if csv else {}
    table = tables.read_table(spec, kinds={**data["columns"], **named}, words=data.get("target"))
    columns, labels = table_inputs(spec, table.columns, table.integer, data, table.decimal_point)
    return (columns, labels, tables.row_ids(table.columns, data)) if ids else (columns, labels)


def _npz_keys(path):
    if not Path(path).is_file():
        raise UsageError(f"--data {path} does not exist.")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return set(archive.files)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise UsageError(f"--data {path} is not a readable .npz ({_one_line(error)}).") from None


def _npy_inputs(spec):
    arrays = [read_npy(path) for path in _npy_paths(spec, (1, 2, 4))]
    x = prepare_inputs(spec, arrays[0])
    return x, prepare_labels(spec, arrays[1], len(x)) if len(arrays) == 2 else None


def _read_only(array):
    array.flags.writeable = False  # shared by several consumers: none may change it for the others
    return array
