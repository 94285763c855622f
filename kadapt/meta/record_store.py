"""`RecordStore`: the SQLite file of adjustment records that collectors append to."""

import contextlib
import json
import numbers
import os
import pathlib
import sqlite3
import time

import numpy as np

from kadapt.meta.adjustment_record import AdjustmentRecord

SCHEMA_VERSION = 1
FORMAT = "kadapt-records"
# Writers queue for the write lock; one commit takes milliseconds, so waiting 30 s
# only runs out when some writer is stuck.
BUSY_TIMEOUT_SECONDS = 30.0
_SQLITE_HEADER = b"SQLite format 3\x00"

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)",
    """CREATE TABLE records (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        task TEXT NOT NULL,
        family TEXT NOT NULL,
        step INTEGER NOT NULL,
        features BLOB NOT NULL,
        rows INTEGER NOT NULL,
        cols INTEGER NOT NULL,
        hyperparameters TEXT NOT NULL,
        adjustment TEXT NOT NULL,
        outcome TEXT NOT NULL,
        created REAL NOT NULL,
        UNIQUE (run_id, step, adjustment)
    )""",
    "CREATE INDEX records_run_task_step ON records (run_id, task, step)",
)
_INSERT = """INSERT INTO records (run_id, task, family, step, features, rows, cols,
    hyperparameters, adjustment, outcome, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
_SELECT = """SELECT run_id, task, family, step, features, rows, cols,
    hyperparameters, adjustment, outcome FROM records ORDER BY id"""


class RecordStoreError(ValueError):
    """A file that is not a kadapt record store of this schema version."""


class RecordStore:
    """The SQLite file of `AdjustmentRecord`s, safe for several writing processes.

    Each append is one transaction in SQLite's WAL mode, so parallel
    collectors (KerasTuner trials, `multiprocessing` workers) append at once
    without losing records, and a writer killed mid-append loses only what it
    had not committed. Records are unique by (run_id, step, adjustment). A
    collector that appends each run's (or decision point's) records with one
    `append_many` resumes by skipping what `contains(run_id)` (or
    `contains(run_id, step)`) finds.

    Opening a path that does not exist creates the store. A file that is not
    a kadapt record store of schema version `SCHEMA_VERSION` raises
    `RecordStoreError` and is left unchanged.

    Every call opens its own SQLite connection and closes it before
    returning: a connection open in a process that forks makes SQLite lose the
    child's commits, so the store holds none between calls and may be passed
    to forked or spawned processes. Do not fork while iterating over it.
    `close()` marks the store closed; later calls raise `ValueError`.

    Args:
        path: str or path-like. The store file.

    Example:

    ```python
    record = AdjustmentRecord(
        run_id="run-0", task="digits/mlp/sgd/lr=0.5", family="digits", step=100,
        features=np.zeros((8, 4)), hyperparameters={"learning_rate": 0.5},
        adjustment={"learning_rate_multiplier": 0.3}, outcome={"diverged": False},
    )
    with RecordStore("records.sqlite") as store:
        if not store.contains("run-0"):
            store.append_many([record])  # all records of the run at once
        print(len(store), store.families())  # 1 ['digits']
        store.export_jsonl("records.jsonl")
    ```
    """

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                "Argument `path` must be a str or path-like. "
                f"Received: path={path!r} (of type {type(path).__name__})"
            )
        self.path = pathlib.Path(path).absolute()
        self._closed = False
        _create_or_check(self.path)

    def __repr__(self):
        return f"RecordStore({str(self.path)!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        """Marks the store closed; the file stays as it is."""
        self._closed = True

    def append(self, record):
        """Appends one `AdjustmentRecord` in one transaction."""
        self._insert([("record", _to_row(_checked_record("record", record)))])

    def append_many(self, records):
        """Appends an iterable of `AdjustmentRecord`s in one transaction: all or none."""
        self._insert(
            [
                (f"records[{index}]", _to_row(_checked_record(f"records[{index}]", record)))
                for index, record in enumerate(records)
            ]
        )

    def contains(self, run_id, step=None):
        """Returns whether a record of run `run_id` (at `step`, if given) is stored."""
        if not isinstance(run_id, str):
            raise TypeError(f"Argument `run_id` must be a str. Received: run_id={run_id!r}")
        if step is None:
            query = "SELECT 1 FROM records WHERE run_id = ? LIMIT 1"
            return bool(self._fetch_all(query, (run_id,)))
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"Argument `step` must be an int or None. Received: step={step!r}")
        query = "SELECT 1 FROM records WHERE run_id = ? AND step = ? LIMIT 1"
        return bool(self._fetch_all(query, (run_id, int(step))))

    def count(self):
        """Returns the number of records."""
        return self._fetch_all("SELECT COUNT(*) FROM records")[0][0]

    def __len__(self):
        return self.count()

    def __iter__(self):
        """Yields the records in the order they were appended."""
        with self._connect() as connection:
            for row in connection.execute(_SELECT):
                yield _from_row(row)

    def families(self):
        """Returns the sorted list of distinct task families."""
        rows = self._fetch_all("SELECT DISTINCT family FROM records ORDER BY family")
        return [family for (family,) in rows]

    def export_jsonl(self, path):
        """Writes one JSON line per record (see `AdjustmentRecord.to_dict`); returns the count."""
        count = 0
        with open(path, "w", encoding="utf-8") as file:
            for record in self:
                file.write(json.dumps(record.to_dict()) + "\n")
                count += 1
        return count

    def import_jsonl(self, path):
        """Appends the records of a JSON-lines file, all or none; returns the count.

        Blank lines are skipped. A line that is not a record, or a record
        already stored, raises `ValueError` naming the file and line, and
        nothing of the file is imported.
        """
        rows = [(f"{path}, line {number}", _to_row(record)) for number, record in _read_jsonl(path)]
        self._insert(rows)
        return len(rows)

    @contextlib.contextmanager
    def _connect(self):
        if self._closed:
            raise ValueError(f"{self!r} is closed.")
        with contextlib.closing(_connect(self.path, "rw")) as connection:
            yield connection

    def _fetch_all(self, query, parameters=()):
        with self._connect() as connection:
            return connection.execute(query, parameters).fetchall()

    def _insert(self, labelled_rows):
        with self._connect() as connection, _write_transaction(connection):
            for label, row in labelled_rows:
                try:
                    connection.execute(_INSERT, row)
                except sqlite3.IntegrityError as error:
                    raise ValueError(
                        f"{label} is already in {self.path}: run_id={row[0]!r}, step={row[3]}, "
                        f"adjustment={row[8]}. A resumed collector skips stored runs with "
                        "`contains(run_id)` or decision points with `contains(run_id, step)`."
                    ) from error


def _checked_record(name, record):
    if not isinstance(record, AdjustmentRecord):
        raise TypeError(
            f"Argument `{name}` must be an AdjustmentRecord. "
            f"Received: {name}={record!r} (of type {type(record).__name__})"
        )
    return record


def _create_or_check(path):
    """Creates the store at `path` if the file does not exist, else checks it is one."""
    if path.exists():
        _check_existing(path)
    with contextlib.closing(_connect(path, "rwc")) as connection:
        _use_wal(connection, path)
        with _write_transaction(connection):
            if not _has_schema(connection, path):
                for statement in _SCHEMA:
                    connection.execute(statement)
                connection.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("format", FORMAT), ("schema_version", SCHEMA_VERSION)],
                )


def _connect(path, mode):
    try:
        return sqlite3.connect(
            f"{path.as_uri()}?mode={mode}",
            uri=True,
            timeout=BUSY_TIMEOUT_SECONDS,
            isolation_level=None,
        )
    except sqlite3.OperationalError as error:
        raise RecordStoreError(f"{path} cannot be opened ({error}).") from error


def _check_existing(path):
    """Raises unless `path` is empty or a store, reading it without any write."""
    with open(path, "rb") as file:
        header = file.read(len(_SQLITE_HEADER))
    if not header:
        return
    if header != _SQLITE_HEADER:
        raise RecordStoreError(f"{path} is not a kadapt record store: it is not an SQLite file.")
    try:
        with contextlib.closing(_connect(path, "ro")) as connection:
            _has_schema(connection, path)
    except sqlite3.DatabaseError as error:
        raise RecordStoreError(
            f"{path} is not a kadapt record store: SQLite cannot read it ({error})."
        ) from error


def _has_schema(connection, path):
    """Returns False for a database without tables, True for a store, else raises."""
    query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    tables = {name for (name,) in connection.execute(query)}
    if not tables:
        return False
    meta = _meta(connection) if "meta" in tables else {}
    if meta.get("format") != FORMAT:
        raise RecordStoreError(
            f"{path} is not a kadapt record store: it is an SQLite database without the "
            f"marker format={FORMAT!r}. Pass a new path or the path of a record store."
        )
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise RecordStoreError(
            f"{path} is a kadapt record store of schema version "
            f"{meta.get('schema_version')!r}; this kadapt reads version {SCHEMA_VERSION}. "
            "Export it with `RecordStore.export_jsonl` under the kadapt version that wrote "
            "it and import the file into a new store, or collect the records again."
        )
    return True


def _meta(connection):
    try:
        return dict(connection.execute("SELECT key, value FROM meta"))
    except sqlite3.OperationalError:
        return {}  # a foreign table named `meta`


def _use_wal(connection, path):
    mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        raise RecordStoreError(
            f"{path} could not be put in SQLite's WAL mode (it is in {mode!r} mode). "
            "Put the store on a local file system."
        )


@contextlib.contextmanager
def _write_transaction(connection):
    # IMMEDIATE takes the write lock at BEGIN, where the busy timeout lets
    # writers queue; a deferred transaction that reads first fails at once when
    # another writer committed in between.
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _to_row(record):
    features = record.features.astype("<f4")
    rows, cols = features.shape
    return (
        record.run_id,
        record.task,
        record.family,
        record.step,
        features.tobytes(),
        rows,
        cols,
        json.dumps(record.hyperparameters),
        # Sorted keys: the unique key compares adjustments as text.
        json.dumps(record.adjustment, sort_keys=True),
        json.dumps(record.outcome),
        time.time(),
    )


def _from_row(row):
    run_id, task, family, step, blob, rows, cols, hyperparameters, adjustment, outcome = row
    return AdjustmentRecord(
        run_id=run_id,
        task=task,
        family=family,
        step=step,
        features=np.frombuffer(blob, dtype="<f4").reshape(rows, cols),
        hyperparameters=json.loads(hyperparameters),
        adjustment=json.loads(adjustment),
        outcome=json.loads(outcome),
    )


def _read_jsonl(path):
    """Yields (line number, record) for the non-blank lines of `path`."""
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if line.strip():
                yield number, _parse_line(path, number, line)


def _parse_line(path, number, line):
    try:
        return AdjustmentRecord.from_dict(json.loads(line))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}, line {number} is not an adjustment record: {error}") from error
