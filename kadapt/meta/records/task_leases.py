"""The lease queue of a record store: which collector holds which task, until when, and which are done.

Collectors on many processes and hosts share one store (`kadapt.meta.collect`):
each claims a task, holds it for a lease by the database's clock (one clock
for the collectors of all hosts), renews the lease while the task runs, and
stores the task's records and marks it finished in one transaction. A
collector that dies stops renewing; its lease runs out and the next claim
takes the task over, so each task's records are stored exactly once. A task
also counts as finished when records of its run are stored (a store
collected before claims existed).

Each function runs in a transaction of a `RecordStore`
(`kadapt.meta.records.record_store`), whose methods `claim_task`, `renew_claims`,
`finish_task`, `claims` and `finished_tasks` are the API. A change to the
queue is serialized with every other: on SQLite by the store's write
transactions (`BEGIN IMMEDIATE`), on a server by an advisory lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from kadapt.extras import require
from kadapt.meta.records.store_format import CLAIMS
from kadapt.meta.records.store_format import RECORDS

sa = require("sqlalchemy", extra="store")

CLAIM_LOCK = 0x6B61646171  # serializes task claims on a server (SQLite's BEGIN IMMEDIATE does it there)


def claim(connection: sa.engine.Connection, names: list[str], owner: str, lease: float) -> str | None:
    """Claims the first of `names` that is neither finished nor held by another; returns it or `None`.

    Example:

    ```python
    with engine.connect() as connection, connection.begin():
        task = claim(connection, ["digits/mlp", "waves/gru"], owner="host-a:41", lease=600.0)
    ```
    """
    _lock(connection)
    now = _now(connection)
    held = {task: (holder, expires, finished) for task, holder, expires, finished in connection.execute(
        sa.select(CLAIMS.c.task, CLAIMS.c.owner, CLAIMS.c.expires, CLAIMS.c.finished)
        .where(CLAIMS.c.task.in_(names)))}
    stored = _stored_runs(connection, names)
    for name in names:
        holder, expires, finished = held.get(name, (None, -math.inf, False))
        if finished or name in stored or (expires > now and holder != owner):
            continue
        if name in held:
            connection.execute(CLAIMS.update().where(CLAIMS.c.task == name)
                               .values(owner=owner, expires=now + lease))
        else:
            connection.execute(CLAIMS.insert(), [{"task": name, "owner": owner,
                                                  "expires": now + lease, "finished": False}])
        return name
    return None


def renew(connection: sa.engine.Connection, owner: str, lease: float) -> None:
    """Extends the leases of `owner`'s unfinished claims to `lease` seconds from now."""
    _lock(connection)
    connection.execute(CLAIMS.update().where((CLAIMS.c.owner == owner) & ~CLAIMS.c.finished)
                       .values(expires=_now(connection) + lease))


def finish(connection: sa.engine.Connection, name: str, owner: str, store_records: Callable[[], None]) -> bool:
    """Calls `store_records()` and marks task `name` finished by `owner`, unless another collector
    finished it first (it took the task over after `owner`'s lease ran out): then `False`, and
    nothing is stored."""
    _lock(connection)
    finished = connection.execute(sa.select(CLAIMS.c.finished).where(CLAIMS.c.task == name)).scalar()
    if finished or _stored_runs(connection, [name]):
        return False
    store_records()
    values = {"owner": owner, "expires": _now(connection), "finished": True}
    if finished is None:
        connection.execute(CLAIMS.insert(), [{"task": name, **values}])
    else:
        connection.execute(CLAIMS.update().where(CLAIMS.c.task == name).values(**values))
    return True


def holders(connection: sa.engine.Connection, names: list[str] | None = None) -> dict[str, tuple[str, bool]]:
    """`{task: (owner, finished)}` of the claims (of `names`, if given)."""
    query = sa.select(CLAIMS.c.task, CLAIMS.c.owner, CLAIMS.c.finished)
    if names is not None:
        query = query.where(CLAIMS.c.task.in_(names))
    return {task: (owner, bool(finished)) for task, owner, finished in connection.execute(query).fetchall()}


def finished(connection: sa.engine.Connection, names: list[str]) -> set[str]:
    """The set of `names` whose records are stored."""
    done = {task for (task,) in connection.execute(
        sa.select(CLAIMS.c.task).where(CLAIMS.c.task.in_(names) & CLAIMS.c.finished))}
    return done | _stored_runs(connection, names)


def checked_names(tasks: Iterable[str]) -> list[str]:
    """`tasks` as a list of names; a `TypeError` for a single string or a name that is not one."""
    names = list(tasks) if not isinstance(tasks, str) else None
    if names is None or not all(isinstance(name, str) for name in names):
        raise TypeError(f"Argument `tasks` must be a list of task names (str). Received: tasks={tasks!r}")
    return names


def _lock(connection):
    if connection.dialect.name != "sqlite":
        connection.execute(sa.select(sa.func.pg_advisory_xact_lock(CLAIM_LOCK)))


def _now(connection):
    """The database's clock in seconds since the epoch: one clock for the collectors of all hosts."""
    if connection.dialect.name == "sqlite":
        now = sa.text("SELECT (julianday('now') - 2440587.5) * 86400.0")
    else:
        now = sa.text("SELECT extract(epoch FROM clock_timestamp())::float8")
    return float(connection.execute(now).scalar())


def _stored_runs(connection, names):
    """The names among `names` that have records (run ids)."""
    query = sa.select(RECORDS.c.run_id).distinct().where(RECORDS.c.run_id.in_(names))
    return {run_id for (run_id,) in connection.execute(query)}
