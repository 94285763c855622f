"""A table larger than memory: read twice, a batch at a time, its rows encoded onto disk.

`kadapt train` streams a table with `--stream on`, and by default (`auto`)
where holding it would take more than half the memory available
(`MEMORY_FACTOR` x the file: `benchmarks/recipe/table_scale.py` measured a
165 MB CSV at +1.24 GB held whole). The rows then go:

1. A first pass: each batch's columns as `kadapt.run.tables` reads them (a
   CSV's types from its first block; a later cell that does not fit its
   column's type widens the column, int -> float -> string, and the pass
   starts again), split as they are read, and over the training rows the
   column kinds, empty columns and ids, the numbers' statistics (mean and
   variance exact; the median of a seeded `SAMPLE_ROWS`-row sample), the
   string columns' most frequent values and the labels.
2. A second pass: each batch through the encoder made from those statistics
   (the one `model.keras` keeps) into float32 rows on disk
   (`kadapt.recipes.disk_rows`), which training reads a block at a time.

Each row's part is a function of the seed and its place in the file: a
`TEST_FRACTION` of test rows (without `--test`) and, of the rest,
`--validation-split` validation rows, at random (a file read once cannot
hold back its last rows).
"""

import collections
import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np

from kadapt.extras import require
from kadapt.recipes.disk_rows import RowStore
from kadapt.recipes.disk_rows import available_memory
from kadapt.run import tables
from kadapt.run.encoding import MEDIAN_ROWS as SAMPLE_ROWS  # the training rows the medians and the id check read
from kadapt.run.errors import UsageError

# Held whole, a table takes about this many times its file's size at its peak (table_scale: 7.5x).
MEMORY_FACTOR = 8
BATCH_ROWS = 65536  # a Parquet file's rows per batch
CSV_BLOCK_BYTES = 1 << 22  # a CSV's bytes per batch
COUNTED_VALUES = 100_000  # a string column's distinct values counted exactly; past twice this, the commonest kept
TRAIN, VALIDATION, TEST, UNUSED = 0, 1, 2, 3
# A CSV's size over its gzip's: 3-4x for columns of numbers, more for text; the high end, so that a
# compressed table too large to hold is streamed rather than read whole.
COMPRESSED_FACTOR = 10


def stream_reason(config):
    """Why `config`'s table is streamed (a line for the run's notes), or `None`: it is held in memory."""
    if config.stream == "off":
        return None
    if config.stream == "on":
        return "--stream on"
    reason = too_large([config.data, config.test])
    return None if reason is None else f"{reason} (--stream off holds it anyway)"


def too_large(paths):
    """Why the tables at `paths` are too large to hold in memory, or `None`. A compressed CSV
    counts as `COMPRESSED_FACTOR` times its size (its own would be known only once read)."""
    size = sum(Path(path).stat().st_size * (COMPRESSED_FACTOR if tables.is_compressed(path) else 1)
               for path in paths if path and Path(path).is_file())
    available = available_memory()
    if MEMORY_FACTOR * size <= available / 2:
        return None
    return (f"held whole it would take about {MEMORY_FACTOR * size / 2**30:.1f} GiB ({MEMORY_FACTOR}x the "
            f"file), more than half of the {available / 2**30:.1f} GiB available")


@dataclasses.dataclass(frozen=True)
class StreamedTable:
    """A streamed table's rows on disk (`DiskRows` per part), their coded
    labels, the `Labels`, the `ColumnPlan`, the encoder and what was chosen."""

    x: tuple  # train, validation, test DiskRows
    y: tuple  # their coded labels
    labels: object
    plan: object
    encoder: object
    vocabularies: dict
    notes: list
    embedding_sizes: tuple = ()


def stream_table(config, reason, test_fraction):
    """The `StreamedTable` of `config.data` (and `config.test`), read in two passes."""
    from kadapt.run import encoding
    from kadapt.run.labels import label_task

    test_fraction = 0.0 if config.test else test_fraction
    scan = _first_pass(config, test_fraction)
    labels_train, labels_val, labels_test = scan.labels.parts()
    labels = label_task(config.data, labels_train, (labels_val, labels_test), config.task, scan.labels.names)
    notes = [f"streamed from disk ({reason}): statistics from a first pass, the encoded rows written to a "
             "scratch file", *_dialect_notes(config), scan.split_note(config, test_fraction), *scan.label_notes,
             *tables.plan_notes(scan.plan),
             f"task: {labels.task.kind} ({labels.reason})"]
    stats = scan.statistics(embed=encoding.embeds(config.model))
    encoder, vocabularies = encoding.column_encoder(stats, tables.model_inputs(scan.plan.kinds))
    notes += encoding.notes(stats, "column {}")
    x = _second_pass(config, scan, encoder, vocabularies, test_fraction)
    # Classes stay in the fewest bytes that hold them (the labels of every row are in memory)
    y = tuple(labels.coded(part) if labels.task.is_regression or labels.numbers else part for part in
              (labels_train, labels_val, labels_test))
    return StreamedTable(x, y, labels, scan.plan, encoder, vocabularies, notes, stats.embedding_sizes)


def _uniform(positions, seed, stream):
    """Uniform [0, 1) numbers, one per file row, a function of `(seed, stream, row)` alone (SplitMix64)."""
    with np.errstate(over="ignore"):
        z = positions.astype(np.uint64) + np.uint64((2 * seed + stream + 1) * 0x9E3779B97F4A7C15 % 2**64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype("float64") / 2.0**53


def _parts(positions, config, test_fraction, test_file):
    """Each row's part: all `TEST` in a `--test` file, else a seeded draw."""
    if test_file:
        return np.full(len(positions), TEST)
    u = _uniform(positions, config.seed, 0)
    kept = (u - test_fraction) / (1 - test_fraction)
    return np.where(u < test_fraction, TEST, np.where(kept < config.validation_split, VALIDATION, TRAIN))


def _dialect_notes(config):
    """How the CSV files were read, where not as commas and decimal points (`tables.CsvDialect.note`)."""
    files = [(path, flag) for path, flag in ((config.data, "--data"), (config.test, "--test"))
             if path and not tables.is_parquet(path, flag)]
    return [note for note in (tables.csv_dialect(path, flag).note(path, flag) for path, flag in files) if note]


def _batches(path, flag, types):
    """`(pyarrow record batches of path, its schema)`, a CSV's columns read with `types`."""
    pa = require("pyarrow", extra="tables")
    parquet = tables.is_parquet(path, flag)
    try:
        if parquet:
            reader = require("pyarrow.parquet", extra="tables").ParquetFile(path)
            return reader.iter_batches(batch_size=BATCH_ROWS), reader.schema_arrow
        csv = require("pyarrow.csv", extra="tables")
        dialect = tables.csv_dialect(path, flag)
        if not dialect.quoted_lines and tables.quoted_anywhere(path):  # a quoted value may hold a line break
            dialect = dataclasses.replace(dialect, quoted_lines=True)
        reader = csv.open_csv(path, read_options=dialect.read_options(block_size=CSV_BLOCK_BYTES),
                              parse_options=dialect.parse_options(), convert_options=tables.csv_options(types, dialect))
        return reader, reader.schema
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
        raise tables.unreadable(path, flag, error) from None


class _Widen(Exception):
    """A CSV cell past the first block does not fit its column's type: read again with a wider one."""

    def __init__(self, name, kind):
        super().__init__(name)
        self.name, self.kind = name, kind


def read_batches(path, flag, types, kinds=None, words=None):
    """`(file row of the batch's first, columns, integer)` of each batch of `path` read with `types`:
    its columns as `kadapt.run.tables.numpy_columns` gives them (a label column `words` keeping true
    and false as words: `kadapt.run.tables.label_words`), and the names of those stored as whole
    numbers. A CSV cell that does not fit its column's type raises `_Widen`."""
    pa = require("pyarrow", extra="tables")
    batches, schema = _batches(path, flag, types)
    tables.check_names(path, flag, schema.names, 1)
    integer = frozenset(name for name, field in zip(tables.column_names(schema.names), schema)
                        if pa.types.is_integer(field.type))
    first = 0
    try:
        for batch in batches:
            yield first, tables.numpy_columns(path, flag, tables.label_words(pa, batch, words), kinds, first), integer
            first += batch.num_rows
    except pa.ArrowInvalid as error:
        found = re.search(r"CSV column #(\d+): CSV conversion error to (\w+)", str(error))
        if found is None or tables.is_parquet(path, flag):
            raise tables.unreadable(path, flag, error) from None
        raise _Widen(schema.names[int(found.group(1))], found.group(2)) from None


def _read(path, flag, types, target, kinds=None):
    """`read_batches` with the `target` column apart: `(first row, columns, labels, integer labels)`."""
    for first, columns, integer in read_batches(path, flag, types, kinds, words=target):
        tables.check_target_name(path, list(columns), target, flag)
        labels = columns.pop(target)
        tables.check_label_words(path, target, labels, first)
        yield first, columns, labels, target in integer


def prediction_batches(spec, data):
    """`kadapt predict`'s `(model columns, labels or None, row ids)` of a table too large to hold, a
    batch at a time, read as the run's config `data` says (`kadapt.run.encoding.table_inputs`;
    `kadapt.run.tables.row_ids`)."""
    from kadapt.run.encoding import table_inputs

    pa = require("pyarrow", extra="tables")
    kinds, target = data["columns"], data.get("target")
    dialect = None if tables.is_parquet(spec, "--data") else tables.csv_dialect(spec)
    true_false = tables.true_false_columns(spec, "--data", dialect) if dialect else ()
    types = {name: pa.string() if tables.read_as_strings(kind) else (pa.bool_() if name in true_false else pa.float64())
             if kind == tables.NUMERIC else pa.timestamp("s") for name, kind in kinds.items()}
    types.update({name: pa.string() for name in data.get("dropped_columns", {})})
    if target:  # class names are strings; classes given as numbers and values are read as numbers
        types[target] = pa.string() if data.get("classes") else pa.float64()
    decimal_point = dialect.decimal_point if dialect else "."
    try:
        for first, columns, integer in read_batches(spec, "--data", types, kinds, words=target):
            yield *table_inputs(spec, columns, integer, data, decimal_point, first), tables.row_ids(columns, data)
    except _Widen as change:
        raise UsageError(f"--data {spec}: a cell of column {change.name} is not of the kind the run trained on "
                         f"({kinds.get(change.name, 'the target')}). Fix the cell.") from None


def _batch_parts(labels, first, config, test_fraction, test_file, trained):
    """`(positions, parts, trained, end)` of a batch: each row's file position and part (`UNUSED`:
    no label, or past `--train-rows`), the training rows read so far, and the rows of the batch
    read (fewer where `--train-rows` ends the file there, else `None`)."""
    positions = np.arange(first, first + len(labels))
    parts = np.where(tables.labelled(labels), _parts(positions, config, test_fraction, test_file), UNUSED)
    if config.train_rows is None or test_file:
        return positions, parts, trained + int((parts == TRAIN).sum()), None
    seen = trained + np.cumsum(parts == TRAIN)
    parts[(seen > config.train_rows) | ((seen == config.train_rows) & (parts != TRAIN))] = UNUSED
    if seen[-1] < config.train_rows:
        return positions, parts, int(seen[-1]), None
    return positions, parts, config.train_rows, int(np.searchsorted(seen, config.train_rows)) + 1


def _widened(types, change):
    """`types` with the column of a `_Widen` one step wider: whole numbers or nothing -> floats -> strings."""
    pa = require("pyarrow", extra="tables")
    wider = pa.float64() if change.kind in ("int64", "null") else pa.string()
    if types.get(change.name) == pa.string():
        raise UsageError(f"a cell of column {change.name} cannot be read even as a string. Fix the file.")
    return {**types, change.name: wider}


class _Labels:
    """A table's labels as read: numbers in chunks, or words as indices into the names met so far."""

    def __init__(self):
        self.chunks, self.words, self.names = [[], [], []], {}, None

    def add(self, values, parts):
        if values.dtype.kind == "U":
            distinct, index = np.unique(values, return_inverse=True)
            codes = [self.words.setdefault(word, len(self.words)) for word in distinct.tolist()]
            values = np.array(codes, np.min_scalar_type(len(self.words)))[index.reshape(-1)]
        if values.dtype.kind in "iu" and len(values):  # classes (or counts) in the fewest bytes that hold them
            values = values.astype(np.result_type(np.min_scalar_type(values.min()), np.min_scalar_type(values.max())))
        for part in (TRAIN, VALIDATION, TEST):
            self.chunks[part].append(values[parts == part])

    def parts(self):
        """Train, validation and test labels: numbers, or indices into the sorted `names`."""
        joined = [np.concatenate(chunks) if chunks else np.zeros(0) for chunks in self.chunks]
        if not self.words:
            return joined
        order = sorted(self.words)
        self.names = np.array(order)
        recode = np.empty(len(order), np.min_scalar_type(len(order)))
        recode[[self.words[name] for name in order]] = np.arange(len(order))
        return [recode[part] if part.dtype.kind in "iu" else part.astype(recode.dtype) for part in joined]


class _Moments:
    """Count, sums (about the first value) and range of a numeric column's given values."""

    def __init__(self):
        self.given = self.missing = 0
        self.shift, self.sum, self.squares, self.low, self.high = None, 0.0, 0.0, np.inf, -np.inf

    def add(self, values):
        given = values[~np.isnan(values)].astype("float64")
        self.missing += len(values) - len(given)
        if not len(given):
            return
        if self.shift is None:
            self.shift = float(given[0])
        centred = given - self.shift
        self.given += len(given)
        self.sum += float(centred.sum())
        self.squares += float(np.square(centred).sum())
        self.low, self.high = min(self.low, float(given.min())), max(self.high, float(given.max()))


class _Counts:
    """A string column's value counts: exact up to `2 x COUNTED_VALUES` values, then the commonest."""

    def __init__(self):
        self.counts, self.exact, self.rows = collections.Counter(), True, 0

    def add(self, values):
        self.counts.update(values.tolist())
        self.rows += len(values)
        if len(self.counts) > 2 * COUNTED_VALUES:
            self.counts, self.exact = collections.Counter(dict(self.counts.most_common(COUNTED_VALUES))), False


class _Undecided(Exception):
    """A string column read as numbers written for people or as local dates from its first rows holds a
    value that is neither further on: read the file again with the column as strings, as a file held whole
    would read it."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class _Scan:
    """What the first pass learns: kinds, statistics, a sample, the labels."""

    def __init__(self, seed, words=frozenset()):
        self.seed, self.raw_kinds, self.given, self.has_time = seed, {}, collections.Counter(), set()
        # String columns whose first training rows are numbers written for people or local dates
        # (`kadapt.run.tables.column_plan`'s kinds and lines), and those (`words`) found not to be further on.
        self.written, self.written_advice, self.words = None, (), words
        self.moments, self.counts = collections.defaultdict(_Moments), collections.defaultdict(_Counts)
        self.sample, self.keys = {}, np.zeros(0)
        self.labels, self.label_notes, self.read = _Labels(), [], collections.Counter()
        self.label_markers = set()  # the words that marked a row's label unknown ("?")
        self.types, self.plan = {}, None

    def reset(self, flag):
        """Forgets what a pass over the `flag` file gathered, to read it again with wider types."""
        if flag == "--data":
            self.__init__(self.seed, self.words)
        else:
            self.labels.chunks[TEST], self.read[TEST] = [], 0
            self.label_notes = [note for note in self.label_notes if not note.startswith(flag)]

    def add_training(self, columns, positions):
        for name, values in columns.items():
            kind = values.dtype.kind
            if self.raw_kinds.setdefault(name, kind) != kind:
                raise UsageError(f"--data: column {name} holds dates in some rows and other values in others. Make "
                                 "it one kind (dates as YYYY-MM-DD), or strings throughout.")
            self.given[name] += int((~tables.missing(values)).sum())
            if kind == "M":
                days = values[~np.isnat(values)].astype("datetime64[s]")
                if np.any(days != days.astype("datetime64[D]")):
                    self.has_time.add(name)
        provisional = {name: self.written.get(name) or {"f": tables.NUMERIC, "M": tables.DATETIME}.get(
            values.dtype.kind, tables.STRING) for name, values in columns.items()}
        model = tables.model_columns(columns, provisional)
        for name, values in model.items():
            (self.counts[name] if tables.is_strings(values) else self.moments[name]).add(values)
        self._sample(model, _uniform(positions, self.seed, 1))

    def _sample(self, model, keys):
        """Keeps the `SAMPLE_ROWS` training rows of the smallest keys (a seeded uniform sample)."""
        keys = np.concatenate([self.keys, keys])
        joined = {name: np.concatenate([self.sample[name], values]) if name in self.sample else values
                  for name, values in model.items()}
        if len(keys) > SAMPLE_ROWS:
            kept = np.argpartition(keys, SAMPLE_ROWS)[:SAMPLE_ROWS]
            keys, joined = keys[kept], {name: values[kept] for name, values in joined.items()}
        self.keys, self.sample = keys, joined

    def written_kinds(self, path, flag, columns, decimal_point):
        """`columns` (a batch of the training file) checked against the kinds of its string columns read
        as numbers written for people ("$1,234.50") or local dates ("31/01/2024"), as a file held whole
        reads them, decided on the first batch; `_Undecided` where a later value is neither."""
        if self.written is None:
            strings = {name: values for name, values in columns.items()
                       if values.dtype.kind == "O" and name not in self.words}
            plan = tables.column_plan(strings, decimal_point)
            self.written = {name: kind for name, kind in plan.kinds.items()
                            if kind in tables.WRITTEN_KINDS or tables.date_format(kind)}
            self.written_advice = tuple(line for line in plan.advice
                                        if any(line.startswith(f"column {name}: ") for name in self.written))
        for name, kind in self.written.items():
            try:
                tables.as_kind(path, flag, name, columns[name], kind)
            except UsageError:
                raise _Undecided(name) from None

    def finish(self, path):
        """The `ColumnPlan` of the training rows."""
        kinds, dropped = {}, {}
        for name, kind in self.raw_kinds.items():
            if not self.given[name]:
                dropped[name] = "empty in every training row"
            elif name in self.written:
                kinds[name] = self.written[name]
            elif (kind == "O" and self._is_id(tables.input_name(name))) or (kind == "f" and self._is_number_id(name)):
                dropped[name] = tables.ID_REASON
            else:
                kinds[name] = {"f": tables.NUMERIC, "O": tables.STRING}.get(
                    kind, tables.DATETIME if name in self.has_time else tables.DATE)
                counts = self.counts[tables.input_name(name)]
                if kind == "O" and counts.exact and tables.yes_no(counts.counts):
                    kinds[name] = tables.YES_NO
        if not kinds:
            raise UsageError(f"--data {path}: no column besides the target holds values in the training rows. "
                             "Add the columns to learn from.")
        self.plan = tables.ColumnPlan(kinds, dropped, self.written_advice)

    def _is_number_id(self, name):
        """`tables.numeric_id_reason` of a streamed column: its sample's rows (each its own whole number
        there), none missing, and a range wide enough to give every row its own."""
        moments = self.moments[tables.input_name(name)]
        sample = self.sample[tables.input_name(name)]
        return bool(tables.numeric_id_reason(name, sample)) and not moments.missing and \
            moments.high - moments.low + 1 >= moments.given

    def _is_id(self, name):
        counts = self.counts[name]
        if counts.rows < tables.ID_MIN_ROWS:
            return False
        if counts.exact:
            return len(counts.counts) == counts.rows
        sample = self.sample[name]  # too many values to count: each distinct in the sample too
        return len(set(sample.tolist())) == len(sample)

    def statistics(self, embed=True):
        """The encoder's `Statistics` of the kept model columns (`embed`: `kadapt.run.encoding.statistics`')."""
        from kadapt.run import encoding

        inputs = tables.model_inputs(self.plan.kinds)
        numbers = [name for name, kind in inputs.items() if kind == tables.NUMERIC]
        rows = self.read[TRAIN]
        columns = []
        for name in numbers:
            moments, sample = self.moments[name], self.sample[name]
            if tables.is_strings(sample):  # a yes/no column: its statistics from its exact counts
                moments, sample = self._yes_no_moments(name)
            given = sample[~np.isnan(sample)]
            median = float(np.median(given.astype("float64"))) if len(given) else 0.0
            mean, variance = encoding.filled_moments(median, moments.shift or 0.0, moments.given, moments.sum,
                                                     moments.squares, rows) if moments.given else (0.0, 1.0)
            columns.append((median, mean, variance, moments.missing, moments.low, moments.high))
        median, mean, variance, missing, low, high = (np.array(values, "float64").reshape(-1) for values in
                                                      zip(*columns)) if columns else (np.zeros(0),) * 6
        counts = {name: self.counts[name].counts for name, kind in inputs.items() if kind == tables.STRING}
        vocabularies, embedded = encoding.string_vocabularies(counts, rows, embed)
        return encoding.Statistics(tuple(numbers), median, mean, variance, missing.astype("int64"), low, high, rows,
                                   vocabularies, {name: len(count) for name, count in counts.items()},
                                   median_rows=len(self.keys) if rows > SAMPLE_ROWS else None, embedded=embedded)

    def _yes_no_moments(self, name):
        """`(_Moments, values)` of a yes/no column from its counts: the moments exact, and values
        whose median is the column's."""
        words = collections.Counter()
        for word, count in self.counts[name].counts.items():  # yes, no and "" (missing), in any case
            words[str(word).lower()] += count
        ones, zeros = words["yes"], words["no"]
        moments = _Moments()
        moments.given, moments.missing = ones + zeros, words[""]
        moments.shift, moments.sum, moments.squares = 0.0, float(ones), float(ones)
        moments.low, moments.high = (0.0 if zeros else 1.0), (1.0 if ones else 0.0)
        # the median of the 1s and 0s: the commoner, 0.5 on a tie
        return moments, np.array([1.0] if ones > zeros else [0.0] if zeros > ones else [0.0, 1.0])

    def split_note(self, config, test_fraction):
        parts = f"{self.read[TRAIN]} training, {self.read[VALIDATION]} validation and {self.read[TEST]} test rows"
        if config.test:
            return f"{parts}: the validation rows ({config.validation_split:.0%} of --data's) drawn at random with --seed"
        return (f"{parts}: the test rows ({test_fraction:.0%}) and the validation rows ({config.validation_split:.0%} "
                "of the rest) drawn at random with --seed")


def _first_pass(config, test_fraction):
    scan = _Scan(config.seed)
    for path, flag in ((config.data, "--data"), (config.test, "--test")):
        if not path:
            continue
        types = tables.word_types(path, flag, config.target)  # true/false labels as the file writes them
        while True:  # a CSV's types are read from its first block; a later cell may widen them
            try:
                _scan_file(scan, path, flag, config, test_fraction, types)
                break
            except _Widen as change:
                types = _widened(types, change)
                scan.reset(flag)
            except _Undecided as change:  # strings after all, as a file held whole reads them
                scan.words |= {change.name}
                scan.reset(flag)
        scan.types[flag] = types
        if flag == "--data":
            if not scan.read[TRAIN]:
                raise tables.empty_target(path, config.target) if not sum(scan.read.values()) else \
                    UsageError(f"--data {path} leaves no training rows after the split. Give more rows.")
            scan.finish(path)
    return scan


def _scan_file(scan, path, flag, config, test_fraction, types):
    """Reads `path` once into `scan`."""
    test_file = flag == "--test"
    unlabelled = rows = trained = 0
    decimal_point = "." if tables.is_parquet(path, flag) else tables.csv_dialect(path, flag).decimal_point
    for first, columns, labels, integer in _read(path, flag, types, config.target,
                                                 scan.plan.kinds if test_file else None):
        if not test_file:
            scan.written_kinds(path, flag, columns, decimal_point)
        positions, parts, trained, end = _batch_parts(labels, first, config, test_fraction, test_file, trained)
        rows, keep = first + (len(labels) if end is None else end), parts != UNUSED
        unlabelled += int((~tables.labelled(labels[:end])).sum())
        scan.label_markers.update(tables.label_markers(labels[:end]))
        scan.labels.add(tables.label_array(path, config.target, labels, integer)[keep], parts[keep])  # "?": missing
        scan.read.update({part: int((parts == part).sum()) for part in (TRAIN, VALIDATION, TEST)})
        if test_file:
            tables.check_same_columns(path, columns, scan.plan, flag)
        else:
            train = parts == TRAIN
            scan.add_training({name: values[train] for name, values in columns.items()}, positions[train])
        if end is not None:
            break
    if unlabelled:
        scan.label_notes.append(f"{flag} {path}: {unlabelled} of {rows} rows have no {config.target} "
                                f"({tables.unlabelled_text(sorted(scan.label_markers))}): left out")


def _second_pass(config, scan, encoder, vocabularies, test_fraction):
    """The encoded rows of each part, written to a scratch directory: train, validation, test `DiskRows`."""
    from kadapt.run.encoding import encode
    from kadapt.run.encoding import indexed

    width = int(encoder.output.shape[-1])
    store = RowStore()
    need = sum(scan.read.values()) * width * 4
    free = shutil.disk_usage(store.path).free
    if need > free * 0.9:
        raise UsageError(f"--data {config.data}: its encoded rows take {need / 2**30:.1f} GiB on disk, and "
                         f"{store.path.parent} has {free / 2**30:.1f} GiB free. Free space there, or set TMPDIR to "
                         "a larger disk.")
    writers = [store.writer(name, (width,)) for name in ("train", "validation", "test")]
    for path, flag in ((config.data, "--data"), (config.test, "--test")):
        if not path:
            continue
        trained = 0
        for first, columns, labels, _ in _read(path, flag, scan.types[flag], config.target, scan.plan.kinds):
            _, parts, trained, end = _batch_parts(labels, first, config, test_fraction, flag == "--test", trained)
            inputs = tables.model_columns(columns, scan.plan.kinds)
            encoded = encode(encoder, indexed(inputs, vocabularies) if vocabularies else inputs)
            for part, writer in enumerate(writers):
                writer.write(encoded[parts == part])
            if end is not None:
                break
    return tuple(writer.close() for writer in writers)
