"""A user's table (`--data TABLE.csv|TABLE.parquet --target COLUMN`) as it is kept.

Read by pyarrow, column by column (a CSV's types inferred as pandas does over
the same reader; a Parquet file's as written). Empty cells are data: `NA`,
`NaN`, `nan`, `null` and an empty cell are one "missing". Each column gets a
kind from the training file, and the kinds bind the test file and the rows
`kadapt predict` reads:

- `numeric`: numbers, whole or not, and true/false columns (as 1/0); a
  missing cell is NaN, which the model fills and flags (`kadapt.run.encoding`);
- `string`: categories, a missing cell the category `""`;
- `yes/no`: a column of the words yes and no (any case), one input of 1 and 0,
  NaN where missing (true/false columns are read as 1/0 numbers already);
- `date` (or `datetime` where a time of day is given): given to the model as
  numbers, one input per part (`COLUMN.year`, `.month`, `.day`, `.weekday`,
  and `.hour` for a `datetime`).

A column empty in every training row and a string column with a distinct value
on every row (an id) are dropped; every such choice is a note of the run.
Errors name the file, the column and the fix.
"""

import csv as stdlib_csv
import dataclasses
import functools
import re
from pathlib import Path

import numpy as np

from kadapt.extras import require
from kadapt.run.coded_strings import CodedStrings
from kadapt.run.errors import UsageError

NUMERIC = "numeric"
STRING = "string"
DATE = "date"
DATETIME = "datetime"  # dates with a time of day: the hour is a part too
YES_NO = "yes/no"  # words yes and no (any case): one input, 1 for yes and 0 for no
YES_NO_WORDS = {"yes": 1.0, "no": 0.0}
# Dates as people write them (1/31/2023, 31.01.2023 14:05): day and month in either order, which the
# values settle where one of them passes 12 in the first place or in the second; a column whose values
# settle nothing stays words (its order would be a guess), named with the fix. A settled column's kind
# is `DATE` or `DATETIME` and the format it is read with ("date %m/%d/%Y"), kept in the run's config
# so that a later file is read in the training file's order.
LOCAL_DATE = re.compile(r"(\d{1,2})([/.\-])(\d{1,2})\2(\d{4}|\d{2})(?:([ T])\d{1,2}:\d{2}(:\d{2})?)?")
# Dates with the month's name (English, full or cut to three letters: pyarrow's %b reads both), which
# settle the order themselves: "05-Jan-2023", "5 Jan 2023", "Jan 5, 2023", "January 5 2023".
MONTH_NAME_FORMS = ("%d-%b-%Y", "%d-%b-%y", "%d %b %Y", "%b %d, %Y", "%b %d %Y")
FORM_PARTS = {"%d": r"\d{1,2}", "%m": r"\d{1,2}", "%Y": r"\d{4}", "%y": r"\d{2}", "%H": r"\d{1,2}", "%M": r"\d{2}",
              "%S": r"\d{2}", "%b": r"[A-Za-z]{3,9}"}
# What a column of numbers holds where a value is unknown, in files that write no empty cell (UCI's "?"),
# and the error values a spreadsheet writes into a cell whose formula failed ("#DIV/0!").
MARKER = re.compile(r"[?*.\-]{1,3}|#(DIV/0!|VALUE!|REF!|NAME\?|NUM!|NULL!|N/A|ERROR!)")
# In a label column, only "?" and the formula errors: "+" and "-" are classes there (UCI's credit approval).
LABEL_MARKER = re.compile(r"\?{1,3}|#(DIV/0!|VALUE!|REF!|NAME\?|NUM!|NULL!|N/A|ERROR!)")
# Numbers written for people: thousands separators (commas, or spaces as in "4 129", the no-break ones
# too), a currency sign, a percent sign ("$1,234.50", "€ 12", "-1,000", "12.5%": 12.5, as written), and
# parentheses for a negative amount, as accounts write it ("(1,234.50)": -1234.5).
# pyarrow reads them as strings; as strings a price would be a category of its own per value.
WRITTEN_NUMBER = "written number"
WRITTEN_FORM = r"[-+]?[$€£¥]?\s?(\d{1,3}(,\d{3})+|\d{1,3}([ \u00a0\u202f]\d{3})+|\d+)(\.\d+)?\s?%?"
WRITTEN = re.compile(rf"{WRITTEN_FORM}|\({WRITTEN_FORM}\)")
# The same in a file of decimal commas (`CsvDialect`), thousands by points or spaces: "1.234,56 €",
# "12,5 %". Its kind says so, and a later file's column is read with it, whatever that file's dialect.
WRITTEN_DECIMAL_COMMA = "written number, decimal comma"
WRITTEN_COMMA_FORM = r"[-+]?[$€£¥]?\s?(\d{1,3}(\.\d{3})+|\d{1,3}([ \u00a0\u202f]\d{3})+|\d+)(,\d+)?\s?[%€]?"
WRITTEN_COMMA = re.compile(rf"{WRITTEN_COMMA_FORM}|\({WRITTEN_COMMA_FORM}\)")
WRITTEN_KINDS = {WRITTEN_NUMBER: WRITTEN, WRITTEN_DECIMAL_COMMA: WRITTEN_COMMA}
# Delimited text as tables are published: comma- or tab-separated, and the plain-text names UCI's
# repository and other archives give them (`adult.data`, `table.txt`), the delimiter read off the file.
CSV_SUFFIXES = (".csv", ".tsv", ".txt", ".dat", ".data")
# Files that hold a table kadapt does not read: what each is, and how to make one it reads.
OTHER_TABLES = {
    **dict.fromkeys((".xlsx", ".xlsm", ".xls", ".ods"), ("a spreadsheet", "save the sheet as CSV (UTF-8)")),
    **dict.fromkeys((".zip", ".tar", ".tgz", ".7z", ".rar"), ("an archive", "unpack it and pass the table inside")),
    **dict.fromkeys((".json", ".jsonl", ".ndjson"), ("JSON", "write the table as Parquet (pandas: "
                                                              "`read_json(...).to_parquet(\"table.parquet\")`)")),
    **dict.fromkeys((".feather", ".arrow", ".orc", ".h5", ".hdf5", ".sav", ".dta", ".sas7bdat", ".pkl", ".pickle"),
                    ("not a CSV or Parquet file", "write the table as Parquet (pandas: `to_parquet`)")),
}
TABLE_FORMS = "CSV (.csv, .tsv, .txt; compressed: .csv.gz) and Parquet (.parquet)"
# The delimiters published CSV files use: commas; semicolons, where the comma is the decimal point (a
# spreadsheet's export in much of Europe); tabs; bars. Read off the file's first lines (`csv_dialect`).
DELIMITERS = (",", ";", "\t", "|")
# Single spaces, as R's `write.table` writes by default, only where none of those splits every line alike.
SPACE = " "
ENCODING_NAMES = {"utf-16": "UTF-16", "cp1252": "Windows-1252 (its first lines are not UTF-8)"}
DELIMITER_NAMES = {",": "commas", ";": "semicolons", "\t": "tabs", "|": "bars", SPACE: "spaces"}
THOUSANDS_POINT = re.compile(r"-?\d{1,3}(\.\d{3})+")  # "150.000": a thousand or a decimal, as the file writes
SNIFF_BYTES = 1 << 16
TITLE_LINES = 10  # lines of text above a CSV's header that are named as such (`csv_dialect`)
PARQUET_SUFFIXES = (".parquet", ".pq")
# A CSV compressed whole (`data.csv.gz`), as large tables are published: pyarrow decompresses it by
# the name's last suffix, reading and streaming alike.
COMPRESSIONS = (".gz", ".bz2", ".zst", ".lz4")
# What pandas reads as missing, as pyarrow's CSV reader takes it.
NULL_VALUES = ["", "NA", "N/A", "n/a", "NaN", "nan", "-nan", "NULL", "null", "None", "#N/A", "<NA>"]
ISO_DATE = r"^\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2})?)?$"
DATE_PARTS = ("year", "month", "day", "weekday")
# A string column of at least this many rows whose every training row holds its own value is an id.
ID_MIN_ROWS = 20
ID_REASON = "a distinct value on every training row (an id)"
# A column of numbers is an id where its name says so ("Id", "customer_id", "PassengerId", "CustomerID")
# and every training row holds its own whole number: a count or a measure of that name is not one.
ID_NAME = re.compile(r"(?i:(^|[\s_.\-])id)$|[a-z](Id|ID)$")


@dataclasses.dataclass(frozen=True)
class Table:
    """A file's columns (`{name: (N,) array}`, file order) and the names of
    those stored as integers (a label column of whole numbers written `3`, not `3.0`)."""

    columns: dict
    integer: frozenset = frozenset()
    notes: tuple = ()  # how the file was read, where that is a choice (`CsvDialect.note`)
    decimal_point: str = "."  # a CSV's (`CsvDialect`): how its numbers written for people read


@dataclasses.dataclass(frozen=True)
class ColumnPlan:
    """The kinds of a table's kept feature columns (`{name: kind}`, in file order)
    and the columns left out, `{name: reason}`; saved in a run's config."""

    kinds: dict
    dropped: dict = dataclasses.field(default_factory=dict)
    advice: tuple = ()  # lines on columns read otherwise than their look suggests (`column_plan`)


def is_table_spec(spec) -> bool:
    """Whether `--data` names a CSV (compressed or not) or Parquet file."""
    return isinstance(spec, str) and table_suffix(spec) in CSV_SUFFIXES + PARQUET_SUFFIXES


def table_suffix(path) -> str:
    """The suffix that names a table file's kind, past a CSV's compression suffix (`t.csv.gz`: `.csv`)."""
    suffixes = [suffix.lower() for suffix in Path(path).suffixes]
    if len(suffixes) > 1 and suffixes[-1] in COMPRESSIONS and suffixes[-2] in CSV_SUFFIXES:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def is_compressed(path) -> bool:
    """Whether a table file is a compressed CSV."""
    return Path(path).suffix.lower() in COMPRESSIONS and table_suffix(path) in CSV_SUFFIXES


def read_table(path: str, flag: str = "--data", kinds: dict | None = None, target: str | None = None,
               words: str | None = None) -> Table:
    """The `Table` of a CSV or Parquet file, its columns float64 numbers (NaN
    where missing), object strings (`""` where missing) or datetime64 dates
    (NaT). With `kinds` (a run's), those columns are read as those kinds. With
    `target` (a training file held whole), every other column compact: numbers
    float32, as the model takes them, and strings `CodedStrings`. The column
    `words` (or `target`), a label column, keeps true and false as words (`label_words`)."""
    pa = require("pyarrow", extra="tables")
    table, dialect = _arrow_table(pa, path, flag, kinds, words or target)
    names = table.column_names
    check_names(path, flag, names, table.num_rows)
    note = dialect.note(path, flag) if dialect else None
    notes = [note] if note else []
    columns = numpy_columns(path, flag, table, kinds, compact={name for name in names if name.strip() != target}
                            if target is not None else (), notes=notes)
    return Table(columns, frozenset(name for name, field in zip(column_names(names), table.schema)
                                    if pa.types.is_integer(field.type)),
                 tuple(notes), dialect.decimal_point if dialect else ".")


def numpy_columns(path, flag, table, kinds=None, first_row=0, compact=(), notes=None):
    """`{name: (N,) array}` of a pyarrow table or record batch (`read_table`'s
    kinds of array), checked; `first_row`: the file row of its first (a
    streamed file's batch), for the errors; the columns named in `compact` as
    `read_table` reads them with a target. A column of numbers with a marker
    in some cells (`MARKER`: "?", "-") is numbers, the marked cells missing,
    where no `kinds` say otherwise; `notes` (a list) gets a line for each."""
    pa = require("pyarrow", extra="tables")
    said = {}  # what reading a column changed, by column: a line of the notes
    named = column_names(table.column_names)  # a name as the user types it
    columns = {name: _numpy_column(pa, path, flag, name, table.column(i), given in compact, said)
               for i, (name, given) in enumerate(zip(named, table.column_names))}
    if notes is not None:
        notes.extend(f"{flag} {path}: column {name}: {line}" for name, line in said.items())
    spaced = [name for name in table.column_names if name != name.strip()]
    if spaced and notes is not None:
        notes.append(f"{flag} {path}: the spaces around {len(spaced)} column names removed ({spaced[0]!r} is "
                     f"{spaced[0].strip()!r})")
    for name, values in columns.items():
        # The training file's feature columns (coded: a target's words are class names) and a later file's
        # numbers.
        if isinstance(values, CodedStrings) if kinds is None else kinds.get(name) == NUMERIC:
            marked = _marked_numbers(values, name in compact)
            if marked is not None:
                columns[name], markers, count = marked
                if notes is not None:
                    notes.append(f"{flag} {path}: column {name}: numbers, and {' and '.join(map(repr, markers))} in "
                                 f"{count} rows: read as missing")
    for name, values in columns.items():
        _check_no_infinity(path, flag, name, values, first_row)
    for name, kind in (kinds or {}).items():
        if name in columns:
            columns[name] = as_kind(path, flag, name, columns[name], kind)
    return columns


def is_parquet(path, flag) -> bool:
    """Whether the table file `path` is Parquet (else CSV); a `UsageError` where it is missing or neither."""
    if not Path(path).is_file():
        raise UsageError(f"{flag} {path} does not exist.")
    suffix = table_suffix(path)
    if suffix not in CSV_SUFFIXES + PARQUET_SUFFIXES:
        raise not_a_table(path, flag)
    return suffix in PARQUET_SUFFIXES


def other_file(spec) -> bool:
    """Whether `--data` names a file that is neither a table kadapt reads nor arrays (`.npz`, `.npy`)."""
    return not is_table_spec(spec) and Path(spec).is_file() and Path(spec).suffix.lower() not in (".npz", ".npy")


def not_a_table(path, flag="--data") -> UsageError:
    """The error for a file that is not a table kadapt reads, with the way to make one of it."""
    what, how = OTHER_TABLES.get(table_suffix(path), ("neither CSV nor Parquet", "save the table as one of them"))
    return UsageError(f"{flag} {path} is {what}, and kadapt reads tables from {TABLE_FORMS} files: {how}.")


def _arrow_table(pa, path, flag, kinds, words=None):
    parquet = is_parquet(path, flag)
    try:
        if parquet:
            return label_words(pa, require("pyarrow.parquet", extra="tables").read_table(path), words), None
        csv = require("pyarrow.csv", extra="tables")
        # A training file's string column stays strings (codes of digits); numbers and dates are inferred and checked.
        dialect = csv_dialect(path, flag)
        types = {name: pa.string() for name, kind in (kinds or {}).items() if read_as_strings(kind)}
        types.update(word_types(path, flag, words, dialect))
        # Into the system allocator: under pyarrow's default (mimalloc) a process's first read of a
        # long CSV, and its columns' copy into NumPy after it, were slower (benchmarks/README.md#table_scale).
        try:
            return label_words(pa, _read_csv(pa, csv, path, dialect, types), words), dialect
        except pa.ArrowInvalid as error:  # a line break in a quoted value past the lines read for the dialect
            if "newlines_in_values" not in str(error) or dialect.quoted_lines:
                raise
            dialect = dataclasses.replace(dialect, quoted_lines=True)
            return label_words(pa, _read_csv(pa, csv, path, dialect, types), words), dialect
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
        raise unreadable(path, flag, error) from None


def word_types(path, flag, name, dialect=None) -> dict:
    """`{name: pa.string()}` where the CSV's first lines hold only true and false words (any case) in
    column `name`, a label column: read as strings, the classes keep the file's words (`TRUE`, not
    1, in predictions); else `{}`. `dialect`: the file's `CsvDialect`, where read already."""
    if not name or is_parquet(path, flag):
        return {}
    pa = require("pyarrow", extra="tables")
    return {name: pa.string()} if name in true_false_columns(path, flag, dialect) else {}


def true_false_columns(path, flag, dialect=None) -> set:
    """The names of a CSV's columns whose first lines hold only true and false words (any case), as
    pyarrow reads them to booleans; `dialect`: the file's `CsvDialect`, where read already."""
    dialect = dialect or csv_dialect(path, flag)
    with require("pyarrow", extra="tables").input_stream(str(path), compression="detect") as file:
        head = file.read(SNIFF_BYTES).decode(dialect.encoding.replace("utf8", "utf-8"), errors="replace")
    lines = head.splitlines()[int(dialect.delimiter_line):][:-1 if len(head) >= SNIFF_BYTES else None]
    rows = list(stdlib_csv.reader(lines, delimiter=dialect.delimiter))
    names = column_names(rows[0]) if rows else []
    cells = [{row[i].strip().lower() for row in rows[1:] if len(row) == len(names)} - {""} for i in range(len(names))]
    return {name for name, seen in zip(names, cells) if seen and seen <= {"true", "false"}}


def label_words(pa, table, name):
    """`table` (a pyarrow table or record batch) with its boolean column `name`, a label column, as
    the words true and false (a Parquet file's stored booleans), else as it is."""
    if not name or name not in table.schema.names or not pa.types.is_boolean(table.schema.field(name).type):
        return table
    index = table.schema.get_field_index(name)
    return table.set_column(index, name, table.column(index).cast(pa.string()))


def _read_csv(pa, csv, path, dialect, types):
    return csv.read_csv(path, read_options=dialect.read_options(), parse_options=dialect.parse_options(),
                        convert_options=csv_options(types, dialect), memory_pool=pa.system_memory_pool())


def csv_options(types, dialect=None):
    """pyarrow's CSV conversion as kadapt reads every CSV: `NULL_VALUES` missing, true/false words as
    booleans, numbers with the `CsvDialect`'s decimal point."""
    csv = require("pyarrow.csv", extra="tables")
    return csv.ConvertOptions(null_values=NULL_VALUES, strings_can_be_null=True, column_types=types,
                              true_values=["true", "True", "TRUE"], false_values=["false", "False", "FALSE"],
                              decimal_point=(dialect or CsvDialect()).decimal_point)


@dataclasses.dataclass(frozen=True)
class CsvDialect:
    """How a CSV file separates its values, writes its decimal point and encodes its text
    (UTF-8; UTF-16 where the file starts with its byte-order mark, as a spreadsheet's
    "Unicode" export and Windows tools write it; Windows-1252 where its first lines are not
    UTF-8, as a spreadsheet's plain "CSV" on Windows is written)."""

    delimiter: str = ","
    decimal_point: str = "."
    encoding: str = "utf8"
    # A quoted value may hold a line break (a comment, an address): pyarrow must then parse the file
    # in order (~12% slower on table_scale's file), so only a file with quotes in it does.
    quoted_lines: bool = False
    # A header one name short of the rows' values, as R's `write.table` writes row names: its names,
    # the rows' first values read as a column with no name.
    row_names: tuple | None = None
    # A first line "sep=;" names the delimiter, as a spreadsheet writes it for itself: skipped.
    delimiter_line: bool = False

    def parse_options(self):
        return require("pyarrow.csv", extra="tables").ParseOptions(delimiter=self.delimiter,
                                                                    newlines_in_values=self.quoted_lines)

    def read_options(self, **options):
        skipped = int(self.delimiter_line)
        if self.row_names is not None:  # the header line skipped, the names given with one for the row names
            options.update(column_names=["", *self.row_names], skip_rows=skipped + 1)
        elif skipped:
            options.update(skip_rows=skipped)
        return require("pyarrow.csv", extra="tables").ReadOptions(encoding=self.encoding, **options)

    def note(self, path, flag):
        """The line saying how the file was read, where not as commas and decimal points in UTF-8 or
        its rows have names; else `None`."""
        said = []
        if (self.delimiter, self.decimal_point, self.encoding) != (",", ".", "utf8") or self.delimiter_line:
            decimal = ", decimal commas" if self.decimal_point == "," else ""
            text = f", text in {ENCODING_NAMES[self.encoding]}" if self.encoding != "utf8" else ""
            named = f" (its first line, {'sep=' + self.delimiter!r}, says so: skipped)" if self.delimiter_line else ""
            said.append(f"values separated by {DELIMITER_NAMES[self.delimiter]}{named}{decimal}{text}")
        if self.row_names is not None:
            said.append("its header names one column fewer than its rows hold: each row's first value is its "
                        "name (R's write.table), read as a column with no name")
        return f"{flag} {path}: {'; '.join(said)}" if said else None


def csv_dialect(path, flag="--data") -> CsvDialect:
    """The `CsvDialect` of a CSV file, read off its first lines: the delimiter
    of `DELIMITERS` that splits the header into the most columns and every
    line into as many (tabs in a `.tsv`); with another delimiter than the
    comma, a decimal comma where the numbers are written `0,5` and none `0.5`
    (`1,234`, three digits after the comma everywhere, is a decimal comma beside
    semicolons only: beside tabs or bars it is a thousand, a `WRITTEN` number). Lines of text above
    the header (a title) are a `UsageError` naming them."""
    with require("pyarrow", extra="tables").input_stream(str(path), compression="detect") as file:
        head = file.read(SNIFF_BYTES)
    encoding = "utf-16" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf8" if _head_is_utf8(head) else "cp1252"
    lines = head.decode(encoding.replace("utf8", "utf-8"), errors="replace").splitlines()
    named = re.fullmatch(r"sep=(.)", lines[0].strip("\ufeff")) if lines else None
    if named is not None and named.group(1) in DELIMITER_NAMES:  # "sep=;": a spreadsheet's line for itself
        return dataclasses.replace(_dialect(path, flag, lines[1:], head, encoding, named.group(1)),
                                   delimiter_line=True)
    return _dialect(path, flag, lines, head, encoding)


def _head_is_utf8(head):
    """Whether the first bytes of a file are UTF-8 (a character cut at their end aside)."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start >= len(head) - 3 and error.reason == "unexpected end of data"
    return True


def _dialect(path, flag, lines, head, encoding, named=None):
    """`csv_dialect` of the file's first `lines` (decoded from `head`, its first bytes, as `encoding`);
    `named`: the delimiter a first line "sep=;" names."""
    numbered = [(number, line) for number, line in enumerate((lines[:-1] if len(head) == SNIFF_BYTES else lines)[:50],
                                                             start=1) if line.strip()]
    lines = [line for _, line in numbered]
    quoted = '"' in "".join(lines)
    widths = {delimiter: _width(lines, delimiter) for delimiter in DELIMITERS}
    widths = {delimiter: width for delimiter, width in widths.items() if width}
    row_names = None
    if named is not None:
        delimiter = named
    elif table_suffix(path) == ".tsv":
        delimiter = "\t"
    elif widths:
        delimiter = max(widths, key=lambda name: (widths[name], -DELIMITERS.index(name)))
    else:
        delimiter, row_names = _row_names(lines, DELIMITERS)
        if delimiter is None:  # single spaces, the last resort: every line alike, or R's row names
            delimiter, row_names = (SPACE, None) if _width(lines, SPACE) else _row_names(lines, (SPACE,))
        if delimiter is None:
            _check_title(path, flag, numbered)
            return CsvDialect(encoding=encoding, quoted_lines=quoted)
    if delimiter == ",":
        return CsvDialect(encoding=encoding, quoted_lines=quoted, row_names=row_names)
    cells = [cell.strip() for row in stdlib_csv.reader(lines[1:], delimiter=delimiter) for cell in row]
    fractions = [found.group(1) for found in (re.fullmatch(r"-?\d*,(\d+)", cell) for cell in cells) if found]
    # "1.234" beside semicolons may be a thousand written with a point ("1.234,56" is one): no evidence.
    point = any(re.fullmatch(r"-?\d*\.\d+", cell) and not (delimiter == ";" and THOUSANDS_POINT.fullmatch(cell))
                for cell in cells)
    grouped = any(re.fullmatch(r"-?\d{1,3}(\.\d{3})+,\d+", cell) for cell in cells)
    # "1,234" is a thousand beside tabs (a decimal comma beside semicolons); "0,5" a half beside either.
    comma = any(len(digits) != 3 for digits in fractions) or (fractions and delimiter == ";") or grouped
    return CsvDialect(delimiter, "," if comma and not point else ".", encoding, quoted, row_names)


def _row_names(lines, delimiters):
    """`(delimiter, header names)` where the header holds one value fewer than every line after it,
    which all hold one number of values, split at one of `delimiters` (R's `write.table` with row
    names); `(None, None)` otherwise."""
    for delimiter in delimiters:
        width = _width(lines[1:], delimiter)
        header = next(stdlib_csv.reader(lines[:1], delimiter=delimiter), [])
        first = [row[0] for row in stdlib_csv.reader(lines[1:], delimiter=delimiter) if row]
        if width > 2 and len(header) == width - 1 and len(set(first)) == len(first):  # row names are unique
            return delimiter, tuple(header)
    return None, None


def quoted_anywhere(path) -> bool:
    """Whether a CSV file holds a quote past the first lines `csv_dialect` reads (a streamed file,
    read in blocks, must know before its first block). Read once per file and version."""
    stat = Path(path).stat()
    return _quoted_anywhere(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _quoted_anywhere(path, size, mtime):
    with require("pyarrow", extra="tables").input_stream(path, compression="detect") as file:
        while block := file.read(1 << 24):
            if b'"' in block:
                return True
    return False


def _width(lines, delimiter):
    """How many values every one of `lines` holds split at `delimiter`, where that is one number above 1; else 0."""
    fields = [len(row) for row in stdlib_csv.reader(lines, delimiter=delimiter)]
    return fields[0] if fields and fields[0] > 1 and all(width == fields[0] for width in fields) else 0


def _check_title(path, flag, numbered):
    """A `UsageError` where the first of the lines (`(line number, text)` of those not blank; up to
    `TITLE_LINES`) hold at most half as many values as the lines after them, which all hold one
    number of values: a title above the header."""
    lines = [line for _, line in numbered]
    for first in range(1, min(TITLE_LINES, len(lines) - 1) + 1):
        for delimiter in DELIMITERS:
            width = _width(lines[first:], delimiter)
            if width and all(len(row) <= width // 2 for row in stdlib_csv.reader(lines[:first], delimiter=delimiter)):
                above = f"line {numbered[0][0]} ({lines[0][:60]!r}) is" if first == 1 else \
                    f"lines {numbered[0][0]}-{numbered[first - 1][0]} (the first: {lines[0][:60]!r}) are"
                raise UsageError(f"{flag} {path}: {above} text above the table, whose header is line "
                                 f"{numbered[first][0]} "
                                 f"({width} values separated by {DELIMITER_NAMES[delimiter]}). Delete the lines "
                                 "above the header.")


def unreadable(path, flag, error):
    """The `UsageError` of a file pyarrow cannot read as a table."""
    kind = "Parquet" if table_suffix(path) in PARQUET_SUFFIXES else "CSV"
    return UsageError(f"{flag} {path} is not a readable {kind} table ({_one_line(error)}). Fix the file.")


def column_names(names) -> list:
    """A file's column names as kadapt names them: without the spaces around them ("a, b" headers, a
    comma and a space, give " b"), and, where several have no name (a spreadsheet's export of empty
    columns beside the table: "a,b,,"), "Unnamed: i" after their position, as pandas names them."""
    stripped = [name.strip() for name in names]
    unnamed = stripped.count("") > 1
    return [f"Unnamed: {i}" if unnamed and name == "" else name for i, name in enumerate(stripped)]


def check_names(path, flag, names, rows):
    """A `UsageError` for a table with two columns of one name (spaces around it aside), or without rows."""
    names = column_names(names)
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise UsageError(f"{flag} {path}: the column name {duplicated[0]!r} appears {names.count(duplicated[0])} "
                         "times; the second would silently replace the first. Rename one of them.")
    if not names or rows == 0:
        raise UsageError(f"{flag} {path} is empty: it needs a header line of column names and at least one "
                         "row of values.")


def _numpy_column(pa, path, flag, name, column, compact=False, said=None):
    """A column's NumPy array (`numpy_columns`); `said` (a dict) gets a line where reading changed its values."""
    kind = column.type
    said = {} if said is None else said
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind) \
            or pa.types.is_decimal(kind) or pa.types.is_null(kind):
        if pa.types.is_integer(kind) and _past_float(pa, column):  # a hash, a long id: float64 holds it roughly
            said[name] = "whole numbers past 2**53, beyond a float's exact range (an id or a code?): read as the " \
                         "nearest floats"
        values = column.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        return values.astype("float32") if compact else values
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return column.cast(pa.timestamp("s")).to_numpy(zero_copy_only=False)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind):
        # "red " is "red": a space a spreadsheet does not show would make a class or category of its own.
        strings, value = CodedStrings.from_arrow(pa, column).stripped()
        if value is not None:
            said[name] = f"the spaces around its values removed ({value!r} is {value.strip()!r})"
        distinct = strings.values[strings.values != ""]
        if _iso_dates(pa, pa.array(distinct, pa.string())):  # a Parquet file keeps dates as the strings it was given
            return np.array(strings.strings(), "datetime64[s]")
        return strings if compact else strings.strings()
    if pa.types.is_binary(kind) and table_suffix(path) in CSV_SUFFIXES:  # pyarrow's column of text not in UTF-8
        row, value = next((row, value) for row, value in enumerate(column.to_pylist()) if not _utf8(value))
        raise UsageError(f"{flag} {path}: column {name} holds text that is not UTF-8, first on line {row + 2} "
                         f"({value[:40]!r}). Save the file as UTF-8 (a spreadsheet's \"CSV UTF-8\").")
    raise UsageError(f"{flag} {path}: column {name} is of the type {kind}, which kadapt cannot learn from (it takes "
                     "numbers, strings, true/false and dates). Flatten or drop the column.")


def _past_float(pa, column):
    """Whether an integer column holds a value that float64 cannot hold exactly (past 2**53)."""
    compute = require("pyarrow.compute", extra="tables")
    extremes = compute.min_max(column).as_py() if len(column) else {"min": None, "max": None}
    return any(value is not None and abs(value) > 2**53 for value in extremes.values())


def _marked_numbers(values, compact, marker=MARKER):
    """`(numbers, markers, marked rows)` of a string column whose values are numbers but for
    `marker`s (`MARKER`; float, NaN where marked or empty); `None` for any other column."""
    coded = coded_strings(values)
    if coded is None:
        return None
    distinct = [str(value) for value in coded.values.tolist()]
    given = [value for value in distinct if value != ""]
    markers = sorted(value for value in given if not is_number(value))
    if not markers or len(markers) == len(given) or not all(marker.fullmatch(value.strip()) for value in markers):
        return None
    table = np.array([np.nan if value == "" or value in markers else float(value) for value in distinct],
                     "float32" if compact else "float64")
    return coded.mapped(table), markers, int(np.isin(coded.values, markers)[coded.codes].sum())


def _utf8(value):
    try:
        value is None or value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _check_no_infinity(path, flag, name, values, first_row=0):
    if isinstance(values, np.ndarray) and values.dtype.kind == "f" and np.isinf(values).any():
        row = int(np.flatnonzero(np.isinf(values))[0])
        values, row = values[row:], row + first_row
        where = f"line {row + 2}" if table_suffix(path) in CSV_SUFFIXES else f"row {row} (counted from 0)"
        raise UsageError(f"{flag} {path}: {where}, column {name} holds {values[0]}, not a number a network can "
                         "learn from (an empty cell is a missing value). Fix the cell.")


def _iso_dates(pa, strings):
    """Whether every one of `strings` (a column's distinct given values) is an ISO 8601 date (and time)."""
    compute = require("pyarrow.compute", extra="tables")
    return len(strings) > 0 and compute.all(compute.match_substring_regex(strings, ISO_DATE)).as_py()


def as_kind(path, flag, name, values, kind):
    """A column read from a later file as the training file's kind says, or a `UsageError`."""
    if date_format(kind):
        return _local_dates(path, flag, name, values, date_format(kind))
    wanted = {NUMERIC: "f", STRING: "O", YES_NO: "O", WRITTEN_NUMBER: "O", WRITTEN_DECIMAL_COMMA: "O", DATE: "M",
              DATETIME: "M"}[kind]
    if kind in WRITTEN_KINDS and values.dtype.kind == "O":
        other = np.flatnonzero([value != "" and not WRITTEN_KINDS[kind].fullmatch(str(value).strip())
                                for value in values])
        if len(other):
            raise UsageError(f"{flag} {path}: column {name} holds {values[other[0]]!r} on line {other[0] + 2}; in "
                             "the training file it holds numbers (written as 1,234 or $12). Fix the cell.")
    if kind == YES_NO and values.dtype.kind == "O":
        other = np.flatnonzero((values != "") & ~is_yes_no_word(values))
        if len(other):
            raise UsageError(f"{flag} {path}: column {name} holds {values[other[0]]!r} on line {other[0] + 2}; in "
                             "the training file it holds the words yes and no. Fix the cell.")
    if values.dtype.kind == wanted or (values.dtype.kind == "f" and np.isnan(values).all()):
        return np.full(len(values), np.datetime64("NaT"), "datetime64[s]") if wanted == "M" and \
            values.dtype.kind == "f" else values
    if values.dtype.kind == "O":
        row = int(np.flatnonzero(values != "")[0])
        raise UsageError(f"{flag} {path}: column {name} holds {values[row]!r} on line {row + 2}; in the training "
                         f"file it holds {'numbers' if kind == NUMERIC else 'dates'}. Fix the cell.")
    raise UsageError(f"{flag} {path}: column {name} holds {'dates' if values.dtype.kind == 'M' else 'numbers'}; in "
                     f"the training file it holds {'numbers' if kind == NUMERIC else 'dates'}. Fix the column.")


def check_target(path: str, columns: dict, target: str | None, flag: str = "--data") -> None:
    """A `UsageError` unless `target` names a column of the table at `path` that holds values."""
    check_target_name(path, list(columns), target, flag)
    if missing(columns[target]).all():
        raise empty_target(path, target)


def empty_target(path, target):
    """The `UsageError` of a target column without a value."""
    return UsageError(f"--target {target}: column {target} of {path} is empty in every row: there is nothing to "
                      "learn. Pass the column that holds the values to predict.")


def check_target_name(path: str, columns: list, target: str | None, flag: str = "--data") -> None:
    """A `UsageError` unless `target` names one of the table's `columns`, beside others."""
    listed = ", ".join(columns)
    if target is None:
        raise UsageError(f"{flag} {path} is a table: add --target COLUMN, the column to predict "
                         f"(its columns: {listed}).")
    if target not in columns:
        raise UsageError(f"--target {target} is not a column of {path}; its columns: {listed}. "
                         f"{_target_advice(target, columns)} Received: --target={target}")
    if len(columns) < 2:
        raise UsageError(f"{flag} {path} holds only the --target column {target}: add the columns to learn from.")


def _target_advice(target, columns):
    """How to name the column to predict: the column `target` was likely meant as (another case,
    spaces, a typo), or, where the header holds numbers, the header line a file without one lacks."""
    import difflib

    folded = {name.strip().casefold(): name for name in columns}
    meant = folded.get(target.strip().casefold()) or next(iter(difflib.get_close_matches(target, columns, 1, 0.75)),
                                                            None)
    if meant is not None:
        return f"Did you mean --target {meant!r}?"
    numbers = [name for name in columns if is_number(name)]
    if numbers:
        return (f"Its first line holds numbers ({', '.join(numbers[:3])}) where a header holds names: if the file "
                "has no header line, add one naming its columns, then pass the one to predict.")
    return "Pass one of them."


def is_strings(values) -> bool:
    """Whether a column holds strings (categories), not numbers."""
    return isinstance(values, CodedStrings) or values.dtype.kind in "OUS"


def missing(values) -> np.ndarray:
    """Which cells of a column (as `read_table` gives it) are missing."""
    if isinstance(values, CodedStrings):
        return values.missing()
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind == "M":
        return np.isnat(values)
    if values.dtype.kind in "iub":
        return np.zeros(values.shape, bool)
    return values == ""


def input_name(column: str) -> str:
    """The name of a column's input in `model.keras`: Keras takes letters,
    digits and `_.-` in a name, so every other character becomes `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", column)


def check_input_names(path: str, columns, flag: str = "--data") -> None:
    """A `UsageError` where two columns would share an `input_name`."""
    seen = {}
    for name in columns:
        if input_name(name) in seen:
            raise UsageError(f"{flag} {path}: columns {seen[input_name(name)]!r} and {name!r} both become the model "
                             f"input {input_name(name)!r} (Keras takes letters, digits and _.- in a name). "
                             "Rename one of them.")
        seen[input_name(name)] = name


def column_plan(columns: dict, decimal_point: str = ".") -> ColumnPlan:
    """The `ColumnPlan` of a table's training feature columns, of a file that writes `decimal_point`."""
    kinds, dropped, advice = {}, {}, []
    written = written_kind(decimal_point)
    for name, values in columns.items():
        given = _given_strings(values) if is_strings(values) else []
        local = given and all(LOCAL_DATE.fullmatch(value.strip()) for value in given)  # 1/31/2023, 31.01.2023
        form = local_date_format(given) if local else month_name_format(given)
        written_number = written_numbers(values, written)
        reason = _index_reason(name, values) or numeric_id_reason(name, values) or \
            (None if written_number or form else _drop_reason(values))
        if reason:
            dropped[name] = reason
        elif form:
            kinds[name] = f"{DATETIME if '%H' in form else DATE} {form}"
            how = "with the month's name" if "%b" in form else f"{'day' if form.startswith('%d') else 'month'} first"
            advice.append(f"column {name}: dates written {how} ({given[0]!r}): read as dates "
                          f"({', '.join(_parts(kinds[name]))})")
        else:
            kinds[name] = written if written_number else _kind(values)
        if local and not form and name in kinds:
            advice.append(f"column {name}: dates written as {given[0]!r} are read as words: no value settles which "
                          "of its first two numbers is the day (neither passes 12 in every place); write them as "
                          "ISO dates (2023-01-31) to have them read as dates (year, month, day, weekday)")
    return ColumnPlan(kinds, dropped, tuple(advice))


def _given_strings(values):
    """The distinct given values of a string column, in the order first seen where not coded."""
    return [str(value) for value in (values.values if isinstance(values, CodedStrings) else
                                     dict.fromkeys(values.tolist())) if value != ""]


def local_date_format(distinct) -> str | None:
    """The `strptime` format of dates written as people write them (`LOCAL_DATE`), where the values
    `distinct` share one separator, one length of year and one time of day, and settle the order of
    day and month (a first number past 12 in some value and no second one: day first; the other way
    round: month first); `None` otherwise."""
    found = [LOCAL_DATE.fullmatch(value.strip()) for value in distinct]
    if not found or not all(found):
        return None
    separators, years = {match[2] for match in found}, {len(match[4]) for match in found}
    times = {(match[5], match[6] is not None) if match[5] else None for match in found}
    day_first, month_first = any(int(match[1]) > 12 for match in found), any(int(match[3]) > 12 for match in found)
    if len(separators) > 1 or len(years) > 1 or len(times) > 1 or day_first == month_first:
        return None
    separator, time = separators.pop(), times.pop()
    order = f"%d{separator}%m" if day_first else f"%m{separator}%d"
    clock = "" if time is None else f"{time[0]}%H:%M" + (":%S" if time[1] else "")
    return f"{order}{separator}{'%Y' if years.pop() == 4 else '%y'}{clock}"


def month_name_format(distinct) -> str | None:
    """The first of `MONTH_NAME_FORMS` that every one of `distinct` (a string column's given values)
    is written in and reads as a date in; `None` where there is none."""
    if not distinct:
        return None
    compute = require("pyarrow.compute", extra="tables")
    pa = require("pyarrow", extra="tables")
    for form in MONTH_NAME_FORMS:
        if all(_written_as(value.strip(), form) for value in distinct):
            parsed = compute.strptime(pa.array([value.strip() for value in distinct], pa.string()), format=form,
                                      unit="s", error_is_null=True)
            if parsed.null_count == 0:
                return form
    return None


def read_as_strings(kind) -> bool:
    """Whether a later file's column of the training file's `kind` is read as strings, which kadapt converts."""
    return kind in (STRING, YES_NO, *WRITTEN_KINDS) or date_format(kind) is not None


def _written_as(value, form):
    """Whether a date is written as `form` says, digit for digit (strptime's %Y also takes a year of two)."""
    return _form_pattern(form).fullmatch(value) is not None


@functools.lru_cache(maxsize=64)
def _form_pattern(form):
    return re.compile("".join(FORM_PARTS.get(token, re.escape(token)) for token in re.split(r"(%[a-zA-Z])", form)
                              if token))


def date_format(kind) -> str | None:
    """The format of a kind of dates written as people write them ("date %d.%m.%Y"), else `None`."""
    first, _, form = kind.partition(" ")
    return form if first in (DATE, DATETIME) and form else None


def _local_dates(path, flag, name, values, form):
    """A string column of dates written in the format `form` as datetime64[s] (NaT where empty); a
    `UsageError` naming the first cell written otherwise."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "f" and np.isnan(values).all():
        return np.full(len(values), np.datetime64("NaT"), "datetime64[s]")  # a later file's column empty everywhere
    coded = coded_strings(values)
    if coded is None:
        raise UsageError(f"{flag} {path}: column {name} holds {'dates' if values.dtype.kind == 'M' else 'numbers'}; "
                         f"in the training file it holds dates written as {form}. Fix the column.")
    compute = require("pyarrow.compute", extra="tables")
    pa = require("pyarrow", extra="tables")
    distinct = [value.strip() for value in coded.values.tolist()]
    parsed = compute.strptime(pa.array(distinct, pa.string()), format=form, unit="s", error_is_null=True)
    dates = parsed.to_numpy(zero_copy_only=False).astype("datetime64[s]")
    wrong = [i for i, value in enumerate(distinct) if value != "" and (np.isnat(dates[i]) or
                                                                       not _written_as(value, form))]
    if wrong:
        row = int(np.flatnonzero(coded.codes == wrong[0])[0])
        raise UsageError(f"{flag} {path}: column {name} holds {coded.values[wrong[0]]!r} on line {row + 2}; in the "
                         f"training file it holds dates written as {form}. Fix the cell.")
    return coded.mapped(dates)


def plan_notes(plan: ColumnPlan) -> list:
    """The lines a run prints of its `ColumnPlan`: each column dropped, each yes/no column made 1/0."""
    return [*(f"column {name or '(no name)'}: {reason}: dropped" for name, reason in plan.dropped.items()),
            *(f"column {name}: the words yes and no: one input, 1 for yes and 0 for no" for name, kind in
              plan.kinds.items() if kind == YES_NO),
            *(f"column {name}: numbers written with thousands separators or a currency sign: read as numbers"
              for name, kind in plan.kinds.items() if kind in WRITTEN_KINDS),
            *plan.advice]


def _kind(values):
    if isinstance(values, CodedStrings):
        return YES_NO if yes_no(values.counts()) else STRING
    if values.dtype.kind == "M":
        given = values[~np.isnat(values)].astype("datetime64[s]")
        return DATETIME if np.any(given != given.astype("datetime64[D]")) else DATE
    if values.dtype.kind == "f":
        return NUMERIC
    return YES_NO if yes_no(set(values.tolist())) else STRING


def written_kind(decimal_point: str) -> str:
    """The kind of numbers written for people in a file whose decimal point is `decimal_point`."""
    return WRITTEN_DECIMAL_COMMA if decimal_point == "," else WRITTEN_NUMBER


def written_numbers(values, kind=WRITTEN_NUMBER) -> bool:
    """Whether a string column's given values are all numbers written as `kind` says (`WRITTEN_KINDS`),
    some with a separator or a sign (or, of decimal commas, a comma)."""
    coded = coded_strings(values)
    distinct = [] if coded is None else [str(value) for value in coded.values.tolist() if value != ""]
    return bool(distinct) and all(WRITTEN_KINDS[kind].fullmatch(value.strip()) for value in distinct) and \
        any(not (is_number(value) if kind == WRITTEN_NUMBER else re.fullmatch(r"[-+]?\d+", value.strip()))
            for value in distinct)


def written_number_values(values, kind=WRITTEN_NUMBER):
    """A `written_numbers` column as float32: "$1,234.50" (or, of decimal commas, "1.234,50 €") as
    1234.5, NaN where missing."""
    coded = coded_strings(values)
    return coded.mapped(np.array([_written_number(value, kind) for value in coded.values.tolist()], "float32"))


def coded_strings(values):
    """A string column as `CodedStrings` (an object array coded by its sorted distinct values); `None`
    for a column of another kind."""
    if isinstance(values, CodedStrings):
        return values
    if isinstance(values, np.ndarray) and values.dtype.kind == "O":
        distinct, inverse = np.unique(values.astype(str), return_inverse=True)
        return CodedStrings(inverse.reshape(-1).astype("int32"), distinct.astype(object))
    return None


def _written_number(value, kind=WRITTEN_NUMBER):
    text = value.strip()
    if text == "":
        return np.nan
    if not WRITTEN_KINDS[kind].fullmatch(text):
        raise ValueError(value)
    sign = -1.0 if text.startswith("(") else 1.0  # "(1,234.50)": an amount owed, as accounts write it
    if kind == WRITTEN_DECIMAL_COMMA:
        text = re.sub(r"[.]", "", text).replace(",", ".")
    return sign * float(re.sub(r"[$€£¥,%\s()]", "", text))


def yes_no(distinct) -> bool:
    """Whether a string column's distinct values are the words yes and no (any case), and missing cells."""
    words = {str(value).lower() for value in distinct if value != ""}
    return bool(words) and words <= set(YES_NO_WORDS)


def is_yes_no_word(values):
    """Which cells of a string column are yes or no (any case)."""
    return np.isin(np.char.lower(values.astype(str)), list(YES_NO_WORDS))


def yes_no_numbers(values):
    """A yes/no column as float32: 1 for yes, 0 for no, NaN where missing."""
    if isinstance(values, CodedStrings):
        return values.mapped(yes_no_numbers(values.values))
    if values.dtype.kind == "f":  # a later file's column empty everywhere, read as numbers
        return values.astype("float32")
    lower = np.char.lower(values.astype(str))
    return np.where(lower == "yes", 1.0, np.where(lower == "no", 0.0, np.nan)).astype("float32")


def _index_reason(name, values):
    """Why a column is a row index written with the file (pandas' `to_csv` writes its index as a first
    column without a name, read back as "Unnamed: 0"): no name, and whole numbers that grow by one."""
    if name.strip() and not name.startswith("Unnamed: "):
        return None
    if not (isinstance(values, np.ndarray) and values.dtype.kind == "f" and len(values) >= ID_MIN_ROWS):
        return None
    steps = np.diff(values)
    if np.isnan(values).any() or not (np.all(steps >= 1) and np.all(values == np.round(values))):
        return None
    return f"no name and whole numbers from {values[0]:g} to {values[-1]:g} that only grow: a row index written " \
           "with the file"


def numeric_id_reason(name, values):
    """`ID_REASON` for a column of numbers named as an id (`ID_NAME`) whose every training row holds
    its own whole number (Kaggle's `Id`, `PassengerId`); else `None`."""
    if not (ID_NAME.search(name.strip()) and isinstance(values, np.ndarray) and values.dtype.kind == "f"
            and len(values) >= ID_MIN_ROWS):
        return None
    whole = not np.isnan(values).any() and np.all(values == np.round(values))
    return ID_REASON if whole and len(np.unique(values)) == len(values) else None


def _drop_reason(values):
    if missing(values).all():
        return "empty in every training row"
    distinct = len(values.counts()) if isinstance(values, CodedStrings) else \
        len(set(values.tolist())) if values.dtype.kind == "O" else 0
    if len(values) >= ID_MIN_ROWS and distinct == len(values):
        return ID_REASON
    return None


def id_columns(data: dict) -> list:
    """The names of the columns a run (its config `data`) dropped as ids."""
    return [name for name, reason in data.get("dropped_columns", {}).items() if reason == ID_REASON]


def row_ids(columns: dict, data: dict) -> dict:
    """The columns of a file's `columns` (`{name: (N,) array}`) that the run (its config `data`) dropped
    as ids: what names each row, which `kadapt predict` writes beside its predictions."""
    return {name: _id_text(columns[name]) for name in id_columns(data) if name in columns}


def _id_text(values):
    """Ids as written: whole numbers without a fractional part (a Parquet file's, read as numbers)."""
    if not (isinstance(values, np.ndarray) and values.dtype.kind == "f"):
        return values
    return np.array(["" if np.isnan(value) else f"{value:.0f}" if value == round(value) else f"{value:g}"
                     for value in values.tolist()], object)


def check_same_columns(path: str, columns: dict, plan: ColumnPlan, flag: str) -> None:
    """A `UsageError` unless `columns` hold the plan's kept columns and no
    others than its dropped ones, in any order."""
    missing_names = [name for name in plan.kinds if name not in columns]
    extra = [name for name in columns if name not in plan.kinds and name not in plan.dropped]
    if missing_names or extra:
        parts = ([f"lacks {', '.join(missing_names)}"] if missing_names else []) + \
                ([f"adds {', '.join(extra)}"] if extra else [])
        raise UsageError(f"{flag} {path} {' and '.join(parts)}: its columns must be the training file's "
                         f"({', '.join(plan.kinds)}).")


def model_inputs(kinds: dict) -> dict:
    """`{input name: "numeric" or "string"}` of the model columns of `kinds` (`model_columns`' names)."""
    inputs = {}
    for name, kind in kinds.items():
        if _is_date(kind):
            inputs.update({f"{input_name(name)}.{part}": NUMERIC for part in _parts(kind)})
        else:
            inputs[input_name(name)] = NUMERIC if kind in (YES_NO, *WRITTEN_KINDS) else kind
    return inputs


def _is_date(kind):
    return kind.partition(" ")[0] in (DATE, DATETIME)


def _parts(kind):
    return DATE_PARTS + (("hour",) if kind.partition(" ")[0] == DATETIME else ())


def model_columns(columns: dict, kinds: dict) -> dict:
    """`{input name: (N,) array}` the model takes: numbers as float32 (NaN
    where missing), strings as they are, each date as its parts (`date_parts`)."""
    inputs = {}
    for name, kind in kinds.items():
        if _is_date(kind):
            values = columns[name]  # a training file's dates written as people write them are still strings
            parts = date_parts(_local_dates("", "--data", name, values, date_format(kind)) if date_format(kind)
                               and not (isinstance(values, np.ndarray) and values.dtype.kind == "M") else values)
            inputs.update({f"{input_name(name)}.{part}": parts[part] for part in _parts(kind)})
        else:
            values = columns[name]
            inputs[input_name(name)] = values.astype("float32", copy=False) if kind == NUMERIC else \
                yes_no_numbers(values) if kind == YES_NO else \
                written_number_values(values, kind) if kind in WRITTEN_KINDS else values
    return inputs


def date_parts(values: np.ndarray) -> dict:
    """`{part: (N,) float32}` of datetime64 values, NaN where missing: year,
    month (1-12), day (1-31), weekday (Monday 0) and hour (0-23)."""
    seconds = values.astype("datetime64[s]")
    absent = np.isnat(seconds)
    days = seconds.astype("datetime64[D]")
    months = days.astype("datetime64[M]")
    parts = {"year": months.astype("datetime64[Y]").astype("int64") + 1970,
             "month": months.astype("int64") % 12 + 1,
             "day": (days - months).astype("int64") + 1,
             "weekday": (days.astype("int64") + 3) % 7,  # 1970-01-01 was a Thursday
             "hour": (seconds - days).astype("int64") // 3600}
    return {part: np.where(absent, np.nan, values).astype("float32") for part, values in parts.items()}


def label_array(path: str, name: str, values: np.ndarray, integer: bool, decimal_point: str = ".") -> np.ndarray:
    """Labels as `.npy` labels would come: int64 for a column stored as
    integers (`integer`) and complete, float64 for other numbers (NaN where
    missing), str class names for words (`""` where missing); numbers written
    for people as numbers, read with the file's `decimal_point`."""
    if values.dtype.kind == "M":
        raise UsageError(f"--target {name}: column {name} of {path} holds dates; kadapt predicts classes or "
                         "numbers. Pass another column.")
    if values.dtype.kind == "f":
        return values.astype("int64") if integer and not np.isnan(values).any() else values
    marked = label_markers(values)
    if marked:  # "?" marks an unknown label: missing, as an empty cell
        numbers = _marked_numbers(values, compact=False, marker=LABEL_MARKER)
        if numbers is not None:  # numbers, read as strings beside the "?"
            return numbers[0]
        values = np.where(np.isin(values, marked), "", values).astype(object)
    kind = written_kind(decimal_point)
    if written_numbers(values, kind):  # a price written "$1,234.50": values to predict, not class names
        return written_number_values(values, kind).astype("float64")
    return values.astype(str)


def check_label_words(path: str, name: str, values: np.ndarray, first_row: int = 0,
                      decimal_point: str = ".") -> None:
    """A `UsageError` for a label column of numbers mixed with words (read as strings)."""
    if values.dtype.kind != "O":
        return
    written = WRITTEN_KINDS[written_kind(decimal_point)]
    marked = label_markers(values)  # no label: left out, neither number nor word
    distinct = {value: is_number(value) or bool(written.fullmatch(str(value).strip()))
                for value in set(values.tolist()) if value != "" and value not in marked}
    if any(distinct.values()) and not all(distinct.values()):
        rows = np.flatnonzero(labelled(values))
        numbers = np.array([distinct[value] for value in values[rows]])
        number, word = rows[np.argmax(numbers)], rows[np.argmin(numbers)]
        raise UsageError(f"--target {name}: column {name} of {path} holds numbers ({values[number]!r} on line "
                         f"{number + first_row + 2}) and words ({values[word]!r} on line {word + first_row + 2}); a "
                         "label column holds numbers (classes or values) or words (class names), not both. Fix "
                         "the file.")


def is_number(value) -> bool:
    """Whether a string is a number as Python reads one."""
    try:
        float(value)
    except ValueError:
        return False
    return True


def labelled(labels: np.ndarray) -> np.ndarray:
    """Which rows have a label: not missing, nor a word that marks an unknown one (`label_markers`)."""
    known = ~missing(labels)
    marked = label_markers(labels)
    return known & ~np.isin(labels, marked) if marked else known


def unlabelled_text(markers) -> str:
    """How the rows without a label write it: an empty cell, or one of `markers` ("?")."""
    return "an empty cell" + "".join(f" or {marker!r}" for marker in markers)


def label_markers(labels: np.ndarray) -> list:
    """The words of a label column that mark an unknown label, not a class (`LABEL_MARKER`: "?", as
    UCI's files write one, and a spreadsheet's formula errors)."""
    if labels.dtype.kind not in "OU":
        return []
    return sorted(value for value in set(labels.tolist()) if LABEL_MARKER.fullmatch(str(value).strip()))


def _one_line(error):
    return " ".join(str(error).split())
