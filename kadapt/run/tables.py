"""A user's CSV table (`--data table.csv --target COLUMN`): its columns, their kinds, its labels.

Read with the standard library's `csv` module: a header line, then one row a
line. A column whose cells are all numbers in the training file is numeric
(an empty cell, NaN or inf in it is an error naming the line: nothing is
imputed); any other column holds categories (strings). The kinds come from
the training file and bind the test file and the rows `kadapt predict`
reads. Errors name the file, the line (counted as an editor does, the
header on line 1) and the column.
"""

import csv
import math
import re
from pathlib import Path

import numpy as np

from kadapt.run.errors import UsageError

NUMERIC = "numeric"
STRING = "string"


def is_csv_spec(spec) -> bool:
    """Whether `--data` names a CSV file."""
    return isinstance(spec, str) and spec.lower().endswith(".csv")


def read_csv(path: str, flag: str = "--data") -> dict:
    """`{column: (N,) array of str}` of a CSV file with a header, or a `UsageError`."""
    if not Path(path).is_file():
        raise UsageError(f"{flag} {path} does not exist.")
    try:
        with open(path, newline="", encoding="utf-8-sig") as file:
            lines = list(csv.reader(file))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UsageError(f"{flag} {path} is not a readable CSV file ({' '.join(str(error).split())}).") from None
    header, rows = (lines[0], lines[1:]) if lines else ([], [])
    rows = list(enumerate(rows, start=2))
    if not header or not rows:
        raise UsageError(f"{flag} {path} is empty: it needs a header line of column names and at least one "
                         "row of values.")
    for number, row in rows:
        if not row:
            raise UsageError(f"{flag} {path}: line {number} is empty. Remove it.")
        if len(row) != len(header):
            raise UsageError(f"{flag} {path}: line {number} has {len(row)} values; the header names "
                             f"{len(header)} columns. Fix the line.")
    cells = np.array([row for _, row in rows], dtype=str).reshape(len(rows), len(header))
    return {name: cells[:, i] for i, name in enumerate(header)}


def check_target(path: str, columns: dict, target: str | None, flag: str = "--data") -> None:
    """A `UsageError` unless `target` names a column of the table at `path`."""
    listed = ", ".join(columns)
    if target is None:
        raise UsageError(f"{flag} {path} is a table: add --target COLUMN, the column to predict "
                         f"(its columns: {listed}).")
    if target not in columns:
        raise UsageError(f"--target {target} is not a column of {path}; its columns: {listed}. "
                         f"Pass one of them. Received: --target={target}")
    if len(columns) < 2:
        raise UsageError(f"{flag} {path} holds only the --target column {target}: add the columns to learn from.")


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


def column_kinds(columns: dict) -> dict:
    """`{column: "numeric" or "string"}`: numeric where every cell that is not
    empty is a number (an empty one is then an error, not a category)."""
    return {name: NUMERIC if _numeric(cells) else STRING for name, cells in columns.items()}


def _numeric(cells):
    filled = [cell for cell in cells if cell.strip()]
    return bool(filled) and all(_is_number(cell) for cell in filled)


def check_same_columns(path: str, columns: dict, expected: list, flag: str) -> None:
    """A `UsageError` unless `columns` are `expected` (the training file's), in any order."""
    missing = [name for name in expected if name not in columns]
    extra = [name for name in columns if name not in expected]
    if missing or extra:
        parts = ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"adds {', '.join(extra)}"] if extra else [])
        raise UsageError(f"{flag} {path} {' and '.join(parts)}: its columns must be the training file's "
                         f"({', '.join(expected)}).")


def feature_arrays(path: str, columns: dict, kinds: dict, flag: str = "--data") -> dict:
    """`{column: (N,) float32 or str array}` of the feature columns `kinds`,
    numeric cells parsed and checked finite."""
    return {name: (_numbers(path, name, columns[name], flag) if kind == NUMERIC else columns[name])
            for name, kind in kinds.items()}


def label_array(path: str, name: str, cells: np.ndarray, flag: str = "--data") -> np.ndarray:
    """The label column as `.npy` labels would come: int64 classes where every
    cell is a whole number, float64 targets where every cell is a number, else
    str class names; numbers mixed with words are a `UsageError`."""
    numbers = [_is_number(cell) for cell in cells]
    if all(numbers):
        values = _numbers(path, name, cells, flag).astype("float64")
        whole = all(cell.strip().lstrip("+-").isdigit() for cell in cells)
        return values.astype("int64") if whole else values
    if any(numbers):
        number, word = numbers.index(True), numbers.index(False)
        raise UsageError(f"--target {name}: column {name} of {path} holds numbers ({str(cells[number])!r} on line "
                         f"{number + 2}) and words ({str(cells[word])!r} on line {word + 2}); a label column holds "
                         "numbers (classes or values) or words (class names), not both. Fix the file.")
    return cells


def _numbers(path, name, cells, flag):
    values = np.empty(len(cells), "float64")
    for row, cell in enumerate(cells):
        value = _number(cell)
        if value is None or not math.isfinite(value):
            what = "an empty cell" if not cell.strip() else repr(str(cell))
            raise UsageError(f"{flag} {path}: line {row + 2}, column {name} holds {what}, in a column of numbers; "
                             "kadapt imputes nothing. Fix or drop the row.")
        values[row] = value
    return values.astype("float32")


def _number(cell):
    try:
        return float(cell)
    except ValueError:
        return None


def _is_number(cell):
    return _number(cell) is not None
