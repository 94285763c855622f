"""The preprocessing `kadapt train` learns from the training rows and saves with the model.

As in Keras' FeatureSpace guide: the encoder turns the rows into a float
matrix once, the network trains on that matrix (probe, micro-batches and
schedule as on any array), and `model.keras` is the end-to-end model raw rows
-> the same encoder -> the trained network, so `kadapt predict`,
`kadapt.load_model(...).predict` and plain Keras take rows as the user keeps them.

- Numbers (array rows (N, features), or a table's numeric columns joined):
  a missing value (NaN) becomes the column's training median (of a seeded
  `MEDIAN_ROWS`-row sample on a longer table) and, for a
  column with missing training values, also sets a "was missing" input of its
  own (as fastai's FillMissing and scikit-learn's `SimpleImputer(add_indicator=True)`
  do); then `keras.layers.Normalization`, (x - mean) / std with the training
  rows' mean and std after filling (std 1 where a column holds one value: it
  stays harmless on rows that differ).
- Strings: one-hot by a `keras.layers.StringLookup` over the training values,
  the missing `""` one of them, with one out-of-vocabulary slot that a value
  unseen in training maps to; a column of more values than `category_limit`
  (1,024, fewer on a long table) keeps its most frequent ones, the rest share that slot.
  A column of more than `EMBED_ABOVE` values (names, shops, codes) is instead
  an index into its training values (0 for a value unseen), one float column
  at the end of the matrix, which the table network turns into an `Embedding`
  of its own (`kadapt.models.table_mlp`): `Statistics.embedded`; not for a
  user's `--model`, which gets one-hot columns.
- Regression: the network learns the standardized target; the saved model
  ends with `Normalization(invert=True)`, output * std + mean.

A table's inputs are a dict of named (N, 1) columns (`kadapt.run.tables.model_columns`),
strings as `dtype="string"`. Only Keras' own layers and ops: the saved model
loads in safe mode without kadapt. The statistics are computed on arrays
(NumPy), not by `adapt`, which would stream every row through TensorFlow.
"""

import collections
import dataclasses

import keras
import numpy as np

from kadapt.run import tables
from kadapt.run.coded_strings import CodedStrings
from kadapt.run.errors import UsageError
from kadapt.run.labels import number_names
from kadapt.run.tables import STRING
from kadapt.run.tables import is_strings

ENCODE_BATCH_SIZE = 262144
# A string column is one-hot over at most MAX_CATEGORIES of its values, its most frequent, and fewer
# where a table's one-hot inputs would pass ONE_HOT_BYTES as float32 over its training rows (the
# encoded rows are held, or written, whole), MIN_CATEGORIES at least. Each value kept adds what it
# carries, to 1,024 on a 1,000-value column (benchmarks/recipe/many_values.py; figures in
# benchmarks/README.md#many_values).
MAX_CATEGORIES = 1024
MIN_CATEGORIES = 64
ONE_HOT_BYTES = 2**30
# The medians of a longer column are those of a seeded sample of this many of its rows, as a streamed
# table's are (`kadapt.run.table_stream`): a median only fills empty cells, and a full sort-by-partition
# of each column was a tenth of a 2,000,000-row table's data phase (benchmarks/README.md#table_scale).
MEDIAN_ROWS = 200_000
# A string column of more distinct training values than EMBED_ABOVE is an index into its values,
# EMBED_VALUES of them at most, the most frequent; the network embeds it. Measured
# (benchmarks/README.md#many_values): on a long table the embedding was as good as one-hot or better at
# 100 to 10,000 values; on a short one (cars' names, a row a value) one-hot was better. A value seen
# once keeps its own vector: pooled with the unseen ones, the embedding lost.
EMBED_ABOVE = 1024
EMBED_VALUES = 100_000


@dataclasses.dataclass(frozen=True)
class Statistics:
    """What an encoder is made from, of the training rows: for the numeric
    inputs (in order, `numbers`) each one's `median` (0 for a column empty in
    every row), the `mean` and `variance` (1 for a column of one value) of the
    column filled with its median, its `missing` count and its smallest and
    largest given value; for the string inputs their one-hot `vocabularies`
    (`categories`) and `distinct` value counts, `embedded` those of them
    given as indices (`string_vocabularies`). `rows`: the training rows.
    Made from arrays (`statistics`) or, for a streamed table, a pass over
    the file (`kadapt.run.table_stream`)."""

    numbers: tuple
    median: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    missing: np.ndarray
    low: np.ndarray
    high: np.ndarray
    rows: int
    vocabularies: dict = dataclasses.field(default_factory=dict)
    distinct: dict = dataclasses.field(default_factory=dict)
    median_rows: int | None = None  # the sample the medians are of, where not every row
    embedded: tuple = ()  # the string columns given as indices for an embedding, not one-hot

    @property
    def embedding_sizes(self):
        """Each embedded column's index count (its values and the one for all others), in the
        order of the encoded matrix's last columns."""
        return tuple(len(self.vocabularies[name]) + 1 for name in self.embedded)

    @property
    def flagged(self):
        """The positions of the numeric inputs with a missing training value: each gets a "was missing" input."""
        return np.flatnonzero(self.missing)


def statistics(columns: dict, embed: bool = True) -> Statistics:
    """The `Statistics` of training columns `{name: (N,) array}`: float numbers
    (NaN where missing) or strings (categories); `embed`: whether a
    many-valued string column is embedded (`string_vocabularies`)."""
    strings = {name: values for name, values in columns.items() if is_strings(values)}
    numbers = {name: np.asarray(values) for name, values in columns.items() if name not in strings}
    rows = len(next(iter(columns.values()))) if columns else 0
    sample = np.sort(np.random.default_rng(0).choice(rows, MEDIAN_ROWS, replace=False)) if rows > MEDIAN_ROWS else None
    stats = [_column_statistics(values, sample) for values in numbers.values()]
    median, mean, variance, missing, low, high = (np.array(values, "float64").reshape(-1) for values in
                                                  zip(*stats)) if stats else (np.zeros(0),) * 6
    counts = {name: collections.Counter(values.counts() if isinstance(values, CodedStrings) else values.tolist())
              for name, values in strings.items()}
    vocabularies, embedded = string_vocabularies(counts, rows, embed)
    return Statistics(tuple(numbers), median, mean, variance, missing.astype("int64"), low, high, rows,
                      vocabularies, {name: len(count) for name, count in counts.items()},
                      median_rows=MEDIAN_ROWS if sample is not None else None, embedded=embedded)


def string_vocabularies(counts: dict, rows: int, embed: bool = True) -> tuple[dict, tuple]:
    """`(vocabularies, embedded)` of string columns from their value counts
    `{name: Counter}` over `rows` training rows: a column of more than
    `EMBED_ABOVE` values (where `embed`) is embedded, its vocabulary its
    `EMBED_VALUES` most frequent; the others are one-hot over
    `categories(counts, category_limit(...))`. Embedded names come last."""
    embedded = tuple(name for name, count in counts.items() if embed and len(count) > EMBED_ABOVE)
    limit = category_limit(rows, len(counts) - len(embedded))
    vocabularies = {name: categories(count, limit) for name, count in counts.items() if name not in embedded}
    vocabularies.update((name, categories(counts[name], EMBED_VALUES)) for name in embedded)
    return vocabularies, embedded


def row_encoder(stats: Statistics, width: int) -> keras.Model:
    """Raw rows (N, width), NaN where missing -> rows filled, flagged and standardized."""
    inputs = keras.Input((width,), name="rows")
    return keras.Model(inputs, _numbers(inputs, stats), name="encoder")


def column_encoder(stats: Statistics, kinds: dict, strings: bool | None = None) -> tuple[keras.Model, dict]:
    """`(encoder, vocabularies)`: the encoder of a dict of raw (N, 1) columns
    (`{input name: "numeric" or "string"}`) -> [numbers filled, flagged and
    standardized, one-hot categories], made from the training rows' `stats`.

    On TensorFlow the strings go in as they are (`vocabularies` is empty). Only
    TensorFlow has string tensors, so on another backend a string column goes
    in as its index in its vocabulary (`indexed`: 0 for a value unseen in
    training, as StringLookup's out-of-vocabulary slot), one-hot by
    `keras.layers.CategoryEncoding`: the same matrix; `vocabularies` says how
    rows reach the model, and a run keeps it in its config. `strings=False`
    builds that index form on TensorFlow too (`training_rows`)."""
    strings = strings_in_model() if strings is None else strings
    inputs = {name: keras.Input((1,), dtype=("string" if strings else "int32") if kind == STRING else "float32",
                                name=name) for name, kind in kinds.items()}
    parts = []
    if stats.numbers:
        columns = [inputs[name] for name in stats.numbers]
        joined = columns[0] if len(columns) == 1 else keras.layers.Concatenate(name="numbers")(columns)
        parts.append(_numbers(joined, stats))
    for name, vocabulary in stats.vocabularies.items():
        if name in stats.embedded:
            continue
        lookup = keras.layers.StringLookup(vocabulary=vocabulary, num_oov_indices=1, output_mode="one_hot",
                                           name=f"lookup_{name}") if strings else \
            keras.layers.CategoryEncoding(len(vocabulary) + 1, output_mode="one_hot", name=f"lookup_{name}")
        parts.append(lookup(inputs[name]))
    for name in stats.embedded:  # an index per row, 0 for a value not kept: the network embeds it
        index = keras.layers.StringLookup(vocabulary=stats.vocabularies[name], num_oov_indices=1,
                                          output_mode="int", name=f"index_{name}")(inputs[name]) if strings else \
            inputs[name]
        parts.append(keras.ops.cast(index, "float32"))
    features = parts[0] if len(parts) == 1 else keras.layers.Concatenate(name="features")(parts)
    return keras.Model(inputs, features, name="encoder"), ({} if strings else dict(stats.vocabularies))


def training_rows(stats: Statistics, kinds: dict, parts: list, encoder: keras.Model | None = None) -> list:
    """The float32 matrices of `parts` (dicts of model columns) by the index
    form of the encoder (`column_encoder(..., strings=False)`) on every
    backend: the matrix the saved encoder makes of the same rows, without
    handing TensorFlow a string per row (tests/test_tables_as_kept.py holds the two equal).
    `encoder`: the saved one (`column_encoder(stats, kinds)`), used where it is
    that index form already (no string column, or a backend without string
    tensors): an encoder of a wide table takes seconds to build (2,000 columns: 2 s)."""
    if encoder is None or (stats.vocabularies and strings_in_model()):
        encoder, _ = column_encoder(stats, kinds, strings=False)
    return [encode(encoder, indexed(x, stats.vocabularies)) for x in parts]


def notes(stats: Statistics, where: str) -> list:
    """One line per choice the encoder makes about a column (`where` formats
    its name): missing values filled and flagged, a column of one value kept,
    the rarer values of a many-valued string column pooled."""
    lines = []
    sampled = f" (of a {stats.median_rows}-row sample)" if stats.median_rows else ""
    for i, name in enumerate(stats.numbers):
        if stats.missing[i]:
            lines.append(f"{where.format(name)}: {stats.missing[i]} of {stats.rows} training values missing: filled "
                         f"with the median{sampled} {stats.median[i]:g}, and an input flags them")
        elif stats.rows and stats.low[i] == stats.high[i]:
            lines.append(f"{where.format(name)}: {stats.low[i]:g} in every training row: kept (it adds nothing)")
    for name, distinct in stats.distinct.items():
        kept = len(stats.vocabularies[name])
        if name in stats.embedded:
            some = f"the {kept} most frequent" if distinct > kept else "each"
            lines.append(f"{where.format(name)}: {distinct} distinct values: an embedding, a vector for {some}, one "
                         "for a value not seen in training")
        elif distinct > kept:
            lines.append(f"{where.format(name)}: {distinct} distinct values: one input for each of the "
                         f"{kept} most frequent, one for all the others")
    return lines


def embeds(model: str) -> bool:
    """Whether a run of `--model model` embeds many-valued string columns: the table network
    (`kadapt.models.table_mlp`) does; a user's network gets one-hot columns, as it would expect."""
    return model in ("auto", "mlp")


def strings_in_model() -> bool:
    """Whether this backend's models take string inputs (TensorFlow's only)."""
    return keras.backend.backend() == "tensorflow"


def indexed(columns: dict, vocabularies: dict) -> dict:
    """`columns` with each column of `vocabularies` as int32 indices: 0 for a
    value not in its vocabulary, i + 1 for `vocabulary[i]` (StringLookup's layout)."""
    return {name: _indices(values, vocabularies[name]) if name in vocabularies else values
            for name, values in columns.items()}


def _indices(values, vocabulary):
    if isinstance(values, CodedStrings):
        return values.indices(vocabulary)
    order = np.argsort(np.array(vocabulary, dtype=str))
    known = np.array(vocabulary, dtype=str)[order]
    values = np.asarray(values).astype(str)
    position = np.minimum(np.searchsorted(known, values), max(len(known) - 1, 0))
    found = known[position] == values if len(known) else np.zeros(len(values), bool)
    return np.where(found, order[position] + 1, 0).astype("int32")


def categories(counts: collections.Counter, limit: int = MAX_CATEGORIES) -> list:
    """The one-hot vocabulary of a string column from its value counts: its
    values, or its `limit` most frequent (ties by value), most frequent first."""
    return [str(name) for name, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]]


def category_limit(rows: int, columns: int) -> int:
    """How many values each of a table's `columns` string columns keeps over
    `rows` training rows: `MAX_CATEGORIES`, fewer where the one-hot inputs
    would pass `ONE_HOT_BYTES` as float32, `MIN_CATEGORIES` at least."""
    fitting = ONE_HOT_BYTES // (4 * max(rows, 1) * max(columns, 1))
    return int(max(MIN_CATEGORIES, min(MAX_CATEGORIES, fitting)))


def filled_moments(median, shift, given, given_sum, given_squares, rows):
    """`(mean, variance)` of a column of `rows` rows filled with `median`: its
    `given` values (their sum and sum of squares taken about `shift`, for
    precision) and the median in the other rows; variance 1 where it is 0 (a
    column of one value). A streamed table's statistics, a batch at a time."""
    absent = rows - given
    centre = median - shift
    mean = (given_sum + absent * centre) / rows
    variance = (given_squares + absent * centre**2) / rows - mean**2
    return mean + shift, variance if variance > 0 else 1.0


def _column_statistics(values, sample=None):
    """`(median, mean, variance, missing, low, high)` of one column filled with its median (that of
    its rows at `sample`, where given); from the given values' sums in float64, so that no filled
    copy of a long column is made."""
    missing = np.isnan(values)
    rows, absent = len(values), int(np.count_nonzero(missing))
    given = values[~missing] if absent else values  # a complete column is not copied
    if not len(given):
        return 0.0, 0.0, 1.0, absent, np.nan, np.nan
    if sample is not None:  # a long column: the median of its sampled rows
        picked = values[sample]
        sampled = picked[~np.isnan(picked)] if absent else picked
    else:
        sampled = given
    median = float(np.median(sampled.astype("float64"))) if len(sampled) else float(np.median(given))
    mean = (given.sum(dtype="float64") + absent * median) / rows
    centred = given.astype("float64")  # one float64 copy, squared and summed by a dot product
    centred -= mean
    variance = (np.dot(centred, centred) + absent * (median - mean) ** 2) / rows
    return median, mean, variance if variance > 0 else 1.0, absent, given.min(), given.max()


def _numbers(inputs, stats):
    """`inputs` (N, features) filled with the training medians, standardized,
    then the "was missing" flags of the columns that had missing values."""
    absent = keras.ops.isnan(inputs)
    filled = keras.ops.where(absent, stats.median.astype("float32"), inputs)
    normalized = keras.layers.Normalization(mean=stats.mean, variance=stats.variance, dtype="float32",
                                            name="normalization")(filled)
    if not len(stats.flagged):
        return normalized
    flags = keras.ops.cast(keras.ops.take(absent, stats.flagged.astype("int32"), axis=1), "float32")
    return keras.layers.Concatenate(name="numbers_and_missing")([normalized, flags])


def encode(encoder: keras.Model, x) -> np.ndarray:
    """The float32 matrix of raw rows `x` (an array, or a dict of (N,) columns)."""
    # Called eagerly, a large chunk at a time, into one array: `predict` would trace a function for
    # each of the train, validation and test sets, and a list of chunks would be copied once more.
    rows = len(next(iter(x.values()))) if isinstance(x, dict) else len(x)
    encoded = np.empty((rows, *encoder.output.shape[1:]), "float32")
    for start in range(0, rows, ENCODE_BATCH_SIZE):
        chunk = encoder(_tensors(_rows(x, start, start + ENCODE_BATCH_SIZE)))
        encoded[start:start + ENCODE_BATCH_SIZE] = keras.ops.convert_to_numpy(chunk)
    return encoded


def _rows(x, start, stop):
    if isinstance(x, dict):
        return {name: values[start:stop].reshape(-1, 1) for name, values in x.items()}
    return np.asarray(x[start:stop], "float32")


def _tensors(rows):
    """Rows as the backend's tensors; strings as `tf.string` (only TensorFlow has string tensors)."""
    if not isinstance(rows, dict):
        return keras.ops.convert_to_tensor(rows)
    return {name: _string_tensor(values) if is_strings(values) else keras.ops.convert_to_tensor(values)
            for name, values in rows.items()}


def _string_tensor(values):
    import tensorflow as tf

    return tf.constant(values if values.dtype.kind == "O" else values.astype(str))  # Python strings as they are


def table_inputs(spec: str, columns: dict, integer, data: dict, decimal_point: str = ".",
                 first_row: int = 0) -> tuple[dict, np.ndarray | None]:
    """`load_table_inputs` of a table's columns as read (all of them, or a streamed file's batch
    whose first row is the file's `first_row`); `integer`: the names of the columns stored as
    whole numbers; `decimal_point`: the file's (`kadapt.run.tables.CsvDialect`)."""
    target = data.get("target")
    plan = tables.ColumnPlan(data["columns"], data.get("dropped_columns", {}))
    given = {name: values for name, values in columns.items() if name != target}
    tables.check_same_columns(spec, given, plan, flag="--data")
    labels = None
    if target in columns:
        labels = tables.label_array(spec, target, columns[target], target in integer, decimal_point)
        if data.get("task", {}).get("kind") == "regression" and labels.dtype.kind in "OUS":
            row = int(np.flatnonzero((labels != "") & ~np.array([tables.is_number(value) for value in labels]))[0])
            where = f"line {first_row + row + 2}" if tables.table_suffix(spec) in tables.CSV_SUFFIXES else \
                f"row {first_row + row} (counted from 0)"
            raise UsageError(f"--data {spec}: column {target} holds {str(labels[row])!r} on {where}; the run predicts "
                             "numbers there. Fix the cell, or drop the column to predict without scoring.")
        if data.get("classes") and labels.dtype.kind in "iuf":  # class names written as numbers (-1, 1; codes)
            labels = number_names(labels)
    columns = tables.model_columns(given, plan.kinds)
    if data.get("vocabularies"):
        columns = indexed(columns, data["vocabularies"])
    return columns, labels


def inference_model(encoder: keras.Model | None, network: keras.Model, task) -> keras.Model:
    """Raw rows -> `encoder` -> `network` (-> the target in its units, for
    regression): what `model.keras` holds. The network itself where there is
    nothing around it (images classified by a functional or Sequential network)."""
    if encoder is None and not task.is_regression and isinstance(network, (keras.Sequential, keras.Function)):
        return network
    inputs = encoder.input if encoder is not None else keras.Input(network.inputs[0].shape[1:], name="rows")
    outputs = network(encoder.output if encoder is not None else inputs)
    if task.is_regression:
        outputs = keras.layers.Normalization(mean=task.target_mean, variance=task.target_std**2, invert=True,
                                             dtype="float32", name="target_units")(outputs)
    return keras.Model(inputs, outputs, name=network.name)


def columns_dataset(columns: dict, batch_size: int = 4096):
    """A `tf.data.Dataset` of batches of a dict of (N,) model columns
    (`kadapt.run.tables.model_columns`), each (batch, 1) (Keras' array adapter takes no strings)."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices({name: values.reshape(-1, 1)
                                               for name, values in columns.items()}).batch(batch_size)
