"""What a kadapt record store is: its tables, its marker and schema version, and the checks.

A store is an SQLite file or a PostgreSQL database with three tables: `meta`
(the marker: `format = "kadapt-records"` and the `schema_version`), `records`
(one row per `AdjustmentRecord`, `kadapt.meta.records.record_store`) and `claims` (the
lease queue, `kadapt.meta.records.task_leases`). A location is checked before anything
is written to it: an SQLite file by its header and marker, read-only, before
it is opened for writing; a database by its marker, in the transaction that
would create the schema. A foreign file or database, or a store of another
schema version, is a `RecordStoreError` naming the location and the fix.
"""

from __future__ import annotations

import contextlib
import pathlib
import sqlite3

from kadapt.extras import require

sa = require("sqlalchemy", extra="store")

SCHEMA_VERSION = 1
FORMAT = "kadapt-records"
SQLITE_HEADER = b"SQLite format 3\x00"
CREATION_LOCK = 0x6B61646170  # "kadap": serializes first-use schema creation on a server

METADATA = sa.MetaData()
META = sa.Table(
    "meta", METADATA,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
RECORDS = sa.Table(
    "records", METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("family", sa.Text, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("features", sa.LargeBinary, nullable=False),
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("cols", sa.Integer, nullable=False),
    sa.Column("hyperparameters", sa.Text, nullable=False),
    sa.Column("adjustment", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.UniqueConstraint("run_id", "step", "adjustment"),
    sa.Index("records_run_task_step", "run_id", "task", "step"),
)
# One row per task a collector has claimed: who holds it, until when (the database's
# clock, in seconds since the epoch), and whether its records are stored. Added to
# schema version 1 stores on first use (a new table; the records are untouched).
CLAIMS = sa.Table(
    "claims", METADATA,
    sa.Column("task", sa.Text, primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("expires", sa.Float, nullable=False),
    sa.Column("finished", sa.Boolean, nullable=False),
)
COLUMNS = ("run_id", "task", "family", "step", "features", "rows", "cols",
           "hyperparameters", "adjustment", "outcome", "created")


class RecordStoreError(ValueError):
    """A location that is not a kadapt record store of this schema version, or cannot be reached."""


def create_or_check(connection: sa.engine.Connection, location: str) -> None:
    """Creates the schema on first use, else checks that it is a store of this version.

    Call it inside a write transaction: on a server, creations by several
    processes at once are serialized there.

    Example:

    ```python
    with engine.connect() as connection, connection.begin():
        create_or_check(connection, "records.sqlite")
    ```
    """
    if connection.dialect.name != "sqlite":
        connection.execute(sa.select(sa.func.pg_advisory_xact_lock(CREATION_LOCK)))
    if not _has_schema(connection, location):
        METADATA.create_all(connection)
        connection.execute(META.insert(), [{"key": "format", "value": FORMAT},
                                           {"key": "schema_version", "value": str(SCHEMA_VERSION)}])
    elif "claims" not in sa.inspect(connection).get_table_names():
        CLAIMS.create(connection)


def check_sqlite_file(path: pathlib.Path) -> None:
    """Raises `RecordStoreError` unless `path` is empty or a store, reading it without any write.

    Example:

    ```python
    check_sqlite_file(pathlib.Path("records.sqlite"))  # before opening it for writing
    ```
    """
    with open(path, "rb") as file:
        header = file.read(len(SQLITE_HEADER))
    if not header:
        return
    if header != SQLITE_HEADER:
        raise RecordStoreError(f"{path} is not a kadapt record store: it is not an SQLite file.")
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as connection:
            tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            meta = _sqlite_meta(connection) if "meta" in tables else {}
    except sqlite3.DatabaseError as error:
        raise RecordStoreError(
            f"{path} is not a kadapt record store: SQLite cannot read it ({error})."
        ) from error
    if tables:
        _check_marker(meta, str(path), "an SQLite database")


def _sqlite_meta(connection):
    try:
        return {key: str(value) for key, value in connection.execute("SELECT key, value FROM meta")}
    except sqlite3.OperationalError:
        return {}  # a foreign table named `meta`


def _has_schema(connection, location):
    """Returns False for a database without tables, True for a store, else raises."""
    tables = sa.inspect(connection).get_table_names()
    if not tables:
        return False
    meta = {}
    if "meta" in tables:
        try:
            with connection.begin_nested():
                meta = {key: str(value) for key, value in connection.execute(sa.select(META.c.key, META.c.value))}
        except sa.exc.DBAPIError:
            meta = {}  # a foreign table named `meta`
    _check_marker(meta, location, "a database")
    return True


def _check_marker(meta, location, kind):
    if meta.get("format") != FORMAT:
        raise RecordStoreError(
            f"{location} is not a kadapt record store: it is {kind} without the "
            f"marker format={FORMAT!r}. Pass a new location or the location of a record store."
        )
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise RecordStoreError(
            f"{location} is a kadapt record store of schema version "
            f"{meta.get('schema_version')}; this kadapt reads version {SCHEMA_VERSION}. "
            "Export it with `RecordStore.export_jsonl` under the kadapt version that wrote "
            "it and import the file into a new store, or collect the records again."
        )
