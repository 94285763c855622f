"""`RecordStore`: adjustment records in an SQLite file (the embedded default) or on a PostgreSQL server."""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import pathlib
import sqlite3
import time
from collections.abc import Iterable, Iterator

import numpy as np

from kadapt.extras import require
from kadapt.meta.model.adjustment_record import AdjustmentRecord
from kadapt.meta.records import task_leases
from kadapt.meta.records.store_format import COLUMNS
from kadapt.meta.records.store_format import FORMAT  # noqa: F401  (still importable from here)
from kadapt.meta.records.store_format import RECORDS
from kadapt.meta.records.store_format import SCHEMA_VERSION  # noqa: F401  (still importable from here)
from kadapt.meta.records.store_format import RecordStoreError
from kadapt.meta.records.store_format import check_sqlite_file
from kadapt.meta.records.store_format import create_or_check
from kadapt.validation import checked_lease

sa = require("sqlalchemy", extra="store")
NullPool = require("sqlalchemy.pool", extra="store").NullPool

# Writers queue for SQLite's write lock; one commit takes milliseconds, so waiting 30 s
# only runs out when some writer is stuck.
BUSY_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 10  # a PostgreSQL server that does not answer in this is unreachable


class RecordStore:
    """`AdjustmentRecord`s in SQLite or PostgreSQL, safe for many writing processes.

    One code path for both engines (SQLAlchemy Core, bound parameters only):

    - a path, or `sqlite:///path`: an SQLite file in WAL mode — the embedded
      default, for one machine;
    - `postgresql://user[:password]@host:port/database`: a PostgreSQL server
      (driver psycopg 3), for collectors on many processes and hosts.

    Each append is one transaction, so parallel collectors append at once
    without losing records, and a writer killed mid-append loses only what it
    had not committed. Records are unique by (run_id, step, adjustment). A
    collector that appends each run's (or decision point's) records with one
    `append_many` resumes by skipping what `contains(run_id)` (or
    `contains(run_id, step)`) finds.

    The schema is created on first use. A file or database that is not a
    kadapt record store of schema version `SCHEMA_VERSION`, an unreachable
    server or a missing database raises `RecordStoreError` naming the
    location (password masked) and the fix; nothing is written then.

    No connection is held between calls (each call opens one and closes it),
    so the store may be passed to forked or spawned processes. Do not fork
    while iterating over it. `close()` marks the store closed; later calls
    raise `ValueError`.

    Args:
        location: str or path-like. A path, an `sqlite:///` URL or a
            `postgresql://` URL.

    Example:

    ```python
    record = AdjustmentRecord(
        run_id="run-0", task="digits/mlp/sgd/lr=0.5", family="digits", step=100,
        features=np.zeros((8, 4)), hyperparameters={"learning_rate": 0.5},
        adjustment={"learning_rate_multiplier": 0.3}, outcome={"diverged": False},
    )
    with RecordStore("records.sqlite") as store:   # or "postgresql://kadapt@db-host:5432/records"
        if not store.contains("run-0"):
            store.append_many([record])  # all records of the run at once
        print(len(store), store.families())  # 1 ['digits']
        store.export_jsonl("records.jsonl")
    ```
    """

    def __init__(self, location: str | os.PathLike) -> None:
        self.url, self.path = _parse_location(location)
        self._shown = self.url.set(drivername=self.url.get_backend_name())
        self._closed = False
        self._engine, self._engine_pid = None, None
        if self.path is not None:
            _prepare_sqlite_file(self.path)
        self._create_or_check()

    @property
    def location(self) -> str:
        """The path (SQLite) or the URL with its password masked (PostgreSQL)."""
        return str(self.path) if self.path is not None else self._shown.render_as_string(hide_password=True)

    def __repr__(self):
        return f"RecordStore({self.location!r})"

    def __getstate__(self):
        return {**self.__dict__, "_engine": None, "_engine_pid": None}

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Marks the store closed; the records stay as they are."""
        self._closed = True

    def append(self, record: AdjustmentRecord) -> None:
        """Appends one `AdjustmentRecord` in one transaction."""
        self._insert([("record", _to_row(_checked_record("record", record)))])

    def append_many(self, records: Iterable[AdjustmentRecord]) -> None:
        """Appends an iterable of `AdjustmentRecord`s in one transaction: all or none."""
        self._insert(
            [
                (f"records[{index}]", _to_row(_checked_record(f"records[{index}]", record)))
                for index, record in enumerate(records)
            ]
        )

    def contains(self, run_id: str, step: int | None = None) -> bool:
        """Returns whether a record of run `run_id` (at `step`, if given) is stored."""
        if not isinstance(run_id, str):
            raise TypeError(f"Argument `run_id` must be a str. Received: run_id={run_id!r}")
        query = sa.select(sa.literal(1)).select_from(RECORDS).where(RECORDS.c.run_id == run_id)
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise TypeError(f"Argument `step` must be an int or None. Received: step={step!r}")
            query = query.where(RECORDS.c.step == int(step))
        return bool(self._fetch_all(query.limit(1)))

    def count(self) -> int:
        """Returns the number of records."""
        return self._fetch_all(sa.select(sa.func.count()).select_from(RECORDS))[0][0]

    def __len__(self) -> int:
        return self.count()

    def __iter__(self) -> Iterator[AdjustmentRecord]:
        """Yields the records in the order they were appended."""
        query = sa.select(*(RECORDS.c[name] for name in COLUMNS[:-1])).order_by(RECORDS.c.id)
        with self._connect() as connection:
            for row in connection.execute(query):
                yield _from_row(row)

    def families(self) -> list[str]:
        """Returns the sorted list of distinct task families."""
        rows = self._fetch_all(sa.select(RECORDS.c.family).distinct().order_by(RECORDS.c.family))
        return [family for (family,) in rows]

    def export_jsonl(self, path: str | os.PathLike) -> int:
        """Writes one JSON line per record (see `AdjustmentRecord.to_dict`); returns the count."""
        count = 0
        with open(path, "w", encoding="utf-8") as file:
            for record in self:
                file.write(json.dumps(record.to_dict()) + "\n")
                count += 1
        return count

    def import_jsonl(self, path: str | os.PathLike) -> int:
        """Appends the records of a JSON-lines file, all or none; returns the count.

        Blank lines are skipped. A line that is not a record, or a record
        already stored, raises `ValueError` naming the file and line, and
        nothing of the file is imported.
        """
        rows = [(f"{path}, line {number}", _to_row(record)) for number, record in _read_jsonl(path)]
        self._insert(rows)
        return len(rows)

    def claim_task(self, tasks: Iterable[str], owner: str, lease_seconds: float) -> str | None:
        """Claims the first of `tasks` (names) that is neither finished nor held; returns it or `None`.

        One transaction, serialized with every other claim, so two collectors
        never hold one task. A claim is held for `lease_seconds` by the
        database's clock; `renew_claims` extends it while the task runs. When
        a collector dies, its lease runs out and the next claim takes the task
        over. A task counts as finished when `finish_task` stored it, or when
        records of its run are in the store (a store collected before claims).
        """
        names = task_leases.checked_names(tasks)
        lease = checked_lease(lease_seconds)
        with self._connect(write=True) as connection:
            return task_leases.claim(connection, names, owner, lease)

    def renew_claims(self, owner: str, lease_seconds: float) -> None:
        """Extends the leases of `owner`'s unfinished claims to `lease_seconds` from now."""
        lease = checked_lease(lease_seconds)
        with self._connect(write=True) as connection:
            task_leases.renew(connection, owner, lease)

    def finish_task(self, task: str, owner: str, records: Iterable[AdjustmentRecord]) -> int:
        """Stores a claimed task's records and marks it finished, in one transaction.

        Returns the number of records stored: 0 when another collector
        finished the task first (it took the task over after `owner`'s lease
        ran out), so each task's records are stored exactly once.
        """
        (name,) = task_leases.checked_names([task])
        rows = [(f"records[{index}]", _to_row(_checked_record(f"records[{index}]", record)))
                for index, record in enumerate(records)]
        with self._connect(write=True) as connection:
            if not task_leases.finish(connection, name, owner, lambda: self._insert_rows(connection, rows)):
                return 0
        return len(rows)

    def claims(self, tasks: Iterable[str] | None = None) -> dict[str, tuple[str, bool]]:
        """`{task: (owner, finished)}` of the claims (of `tasks`, if given)."""
        names = None if tasks is None else task_leases.checked_names(tasks)
        with self._connect() as connection:
            return task_leases.holders(connection, names)

    def finished_tasks(self, tasks: Iterable[str]) -> set[str]:
        """The set of `tasks` (names) whose records are stored."""
        names = task_leases.checked_names(tasks)
        with self._connect() as connection:
            return task_leases.finished(connection, names)

    def _engine_here(self):
        """This process's engine (an engine's state must not cross a fork)."""
        if self._engine is None or self._engine_pid != os.getpid():
            self._engine, self._engine_pid = _engine(self.url, self.path), os.getpid()
        return self._engine

    @contextlib.contextmanager
    def _connect(self, write=False):
        if self._closed:
            raise ValueError(f"{self!r} is closed.")
        try:
            with self._engine_here().connect() as connection:
                if not write:
                    yield connection
                    return
                with connection.execution_options(kadapt_write=True).begin():
                    yield connection
        except sa.exc.OperationalError as error:
            raise RecordStoreError(_unreachable_message(self.location, self.path, error)) from None

    def _fetch_all(self, query):
        with self._connect() as connection:
            return connection.execute(query).fetchall()

    def _insert(self, labelled_rows):
        with self._connect(write=True) as connection:
            self._insert_rows(connection, labelled_rows)

    def _insert_rows(self, connection, labelled_rows):
        for label, row in labelled_rows:
            try:
                connection.execute(RECORDS.insert(), [dict(zip(COLUMNS, row))])
            except sa.exc.IntegrityError as error:
                raise ValueError(
                    f"{label} is already in {self.location}: run_id={row[0]!r}, step={row[3]}, "
                    f"adjustment={row[8]}. A resumed collector skips stored runs with "
                    "`contains(run_id)` or decision points with `contains(run_id, step)`."
                ) from error

    def _create_or_check(self):
        """Creates the schema on first use, else checks that it is a store of this version."""
        with self._connect(write=True) as connection:
            create_or_check(connection, self.location)


def _parse_location(location):
    """`(SQLAlchemy URL, path or None)` of a path, an sqlite:/// URL or a postgresql:// URL."""
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(
            "Argument `location` must be a path, an sqlite:/// URL or a postgresql:// URL. "
            f"Received: location={location!r} (of type {type(location).__name__})"
        )
    if isinstance(location, os.PathLike) or "://" not in location:
        path = pathlib.Path(location).absolute()
        return sa.engine.URL.create("sqlite", database=str(path)), path
    try:
        url = sa.engine.make_url(location)
    except sa.exc.ArgumentError:
        raise ValueError(f"Argument `location` is not a database URL. Received: location={location!r}") from None
    backend = url.get_backend_name()
    if backend == "sqlite" and url.database:
        path = pathlib.Path(url.database).absolute()
        return url.set(database=str(path)), path
    if backend == "postgresql":
        require("psycopg", extra="postgres")
        return url.set(drivername="postgresql+psycopg"), None
    raise ValueError(
        "Argument `location` must be a path, an sqlite:///path URL or a postgresql:// URL. "
        f"Received: location={url.render_as_string(hide_password=True)!r}"
    )


def _engine(url, path):
    if path is None:
        return sa.create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS})
    # SQLite through the standard library: opened read-write, never created here (the
    # store created the file), in autocommit mode so that a write transaction can take
    # the write lock at BEGIN; reads run outside a transaction.
    engine = sa.create_engine("sqlite://", creator=lambda: _sqlite_connect(path, "rw"), poolclass=NullPool)
    sa.event.listen(engine, "begin", _begin_sqlite)
    return engine


def _sqlite_connect(path, mode):
    return sqlite3.connect(f"{path.as_uri()}?mode={mode}", uri=True, timeout=BUSY_TIMEOUT_SECONDS,
                           isolation_level=None, check_same_thread=False)


def _begin_sqlite(connection):
    # IMMEDIATE takes the write lock at BEGIN, where the busy timeout lets writers
    # queue; a deferred transaction that reads first fails at once when another
    # writer committed in between.
    if connection.get_execution_options().get("kadapt_write"):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _prepare_sqlite_file(path):
    """Checks an existing file without writing to it, then creates it if needed and puts
    it in WAL mode (a property of the file, set outside any transaction)."""
    if path.exists():
        check_sqlite_file(path)
    try:
        connection = _sqlite_connect(path, "rwc")
    except sqlite3.OperationalError as error:
        raise RecordStoreError(f"{path} cannot be opened ({error}).") from error
    with contextlib.closing(connection):
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        raise RecordStoreError(
            f"{path} could not be put in SQLite's WAL mode (it is in {mode!r} mode). "
            "Put the store on a local file system."
        )


def _unreachable_message(location, path, error):
    reason = " ".join(str(error.orig if getattr(error, "orig", None) else error).split())
    if path is not None:
        return f"{location} cannot be opened ({reason})."
    if "does not exist" in reason and "database" in reason:
        return (f"{location}: the database does not exist ({reason}). Create it first, e.g. "
                "`createdb -h HOST -p PORT -U USER NAME`, or name an existing one in the URL.")
    return (f"{location} cannot be reached ({reason}). Start the server, or fix the host, port, user "
            "or password in the URL.")


def _checked_record(name, record):
    if not isinstance(record, AdjustmentRecord):
        raise TypeError(
            f"Argument `{name}` must be an AdjustmentRecord. "
            f"Received: {name}={record!r} (of type {type(record).__name__})"
        )
    return record


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
        features=np.frombuffer(bytes(blob), dtype="<f4").reshape(rows, cols),
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
