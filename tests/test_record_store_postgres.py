"""`RecordStore` on a real PostgreSQL server (a throwaway cluster on 127.0.0.1, see
postgres.py): one code path with SQLite, concurrent writers, a killed writer, and
every location that is not a store refused without a write."""

import multiprocessing
import os
import signal

import numpy as np
import psycopg
import pytest

import postgres
from kadapt.meta.model.adjustment_record import AdjustmentRecord
from kadapt.meta.records.record_store import RecordStore
from kadapt.meta.records.record_store import RecordStoreError

FORK = multiprocessing.get_context("fork")  # a spawned child would import TensorFlow again


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Replaces conftest's per-test Keras reset, which these Keras-free tests do not need."""
    yield


def _record(run_id="run-0", step=0, features=None):
    rng = np.random.default_rng(step)
    return AdjustmentRecord(
        run_id=run_id, task="digits/mlp/sgd/lr=0.5", family="digits", step=step,
        features=rng.normal(size=(8, 5)).astype("float32") if features is None else features,
        hyperparameters={"learning_rate": 0.5}, adjustment={"learning_rate_multiplier": 0.3},
        outcome={"loss_before": 1.25, "loss_after": float("nan"), "diverged": False},
    )


def _tables(url):
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return sorted(name for (name,) in rows)


def _same(a, b):
    return (a.to_dict().keys() == b.to_dict().keys() and a.run_id == b.run_id and a.step == b.step
            and a.features.tobytes() == b.features.tobytes() and a.adjustment == b.adjustment
            and a.hyperparameters == b.hyperparameters)


def test_the_store_round_trips_records_on_the_server(url):
    records = [_record(step=step) for step in range(5)]
    with RecordStore(url) as store:
        store.append(records[0])
        store.append_many(records[1:])
        assert store.count() == 5 and store.families() == ["digits"]
        assert store.contains("run-0") and store.contains("run-0", 4) and not store.contains("run-0", 5)
        back = list(store)
    assert all(_same(a, b) for a, b in zip(back, records, strict=True))  # features bit-exact
    assert np.isnan(back[0].outcome["loss_after"])
    assert _tables(url) == ["claims", "meta", "records"]
    assert RecordStore(url).count() == 5  # a second opening checks and reuses the schema


def test_a_duplicate_batch_is_refused_whole(url):
    store = RecordStore(url)
    store.append(_record(step=1))
    with pytest.raises(ValueError, match=r"records\[1\] is already in postgresql://"):
        store.append_many([_record(step=0), _record(step=1), _record(step=2)])
    assert [r.step for r in store] == [1]


def _append_150(store, worker, start):
    start.wait(timeout=60)
    for step in range(150):
        store.append(_record(run_id=f"worker-{worker}", step=step))


def test_four_processes_append_600_records_and_lose_nothing(url):
    store = RecordStore(url)
    start = FORK.Event()
    workers = [FORK.Process(target=_append_150, args=(store, i, start)) for i in range(4)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    back = list(store)
    assert len(back) == 600
    assert {(r.run_id, r.step) for r in back} == {(f"worker-{i}", s) for i in range(4) for s in range(150)}
    assert all(r.features.tobytes() == _record(r.run_id, r.step).features.tobytes() for r in back)


def _die_inside_a_transaction(url, started):
    connection = psycopg.connect(url)  # a transaction is open from the first statement
    connection.execute(
        "INSERT INTO records (run_id, task, family, step, features, rows, cols, hyperparameters, "
        "adjustment, outcome, created) SELECT run_id, task, family, step + %s, features, rows, cols, "
        "hyperparameters, adjustment, outcome, created FROM records", (1000,))
    started.set()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_writer_killed_mid_transaction_leaves_no_partial_batch(url):
    store = RecordStore(url)
    committed = [_record(step=step) for step in range(10)]
    store.append_many(committed)
    started = FORK.Event()
    writer = FORK.Process(target=_die_inside_a_transaction, args=(url, started))
    writer.start()
    writer.join(timeout=60)
    assert started.is_set() and writer.exitcode == -signal.SIGKILL
    assert all(_same(a, b) for a, b in zip(list(store), committed, strict=True))
    store.append(_record(step=10))
    assert store.count() == 11


def test_a_foreign_database_is_refused_and_left_unwritten(url):
    with psycopg.connect(url) as connection:
        connection.execute("CREATE TABLE people (name TEXT)")
    with pytest.raises(RecordStoreError, match=r"records_\d+_\d+ is not a kadapt record store: it is a "
                                               r"database without the marker"):
        RecordStore(url)
    assert _tables(url) == ["people"]


def test_another_schema_version_is_refused_with_the_fix(url):
    RecordStore(url).close()
    with psycopg.connect(url) as connection:
        connection.execute("UPDATE meta SET value = %s WHERE key = %s", ("2", "schema_version"))
    with pytest.raises(RecordStoreError, match=r"schema version 2; this kadapt reads version 1\. Export it"):
        RecordStore(url)


def test_an_unreachable_server_is_named_with_the_password_masked():
    url = f"postgresql://kadapt:secret@127.0.0.1:{postgres.free_port()}/records"
    with pytest.raises(RecordStoreError) as raised:
        RecordStore(url)
    message = str(raised.value)
    assert message.startswith("postgresql://kadapt:***@127.0.0.1:") and "secret" not in message
    assert "cannot be reached" in message and "Start the server" in message


def test_a_missing_database_is_named_with_the_fix(server):
    host, port, user = server
    with pytest.raises(RecordStoreError, match=r"/no_such_db: the database does not exist .* Create it first"):
        RecordStore(f"postgresql://{user}@{host}:{port}/no_such_db")


def test_an_sqlite_url_is_the_same_store_as_its_path(tmp_path):
    RecordStore(f"sqlite:///{tmp_path / 'records.sqlite'}").append(_record())
    assert [r.step for r in RecordStore(tmp_path / "records.sqlite")] == [0]


def test_a_location_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="must be a path, an sqlite:///path URL or a postgresql:// URL"):
        RecordStore("mysql://user@127.0.0.1/records")
    with pytest.raises(TypeError, match="Argument `location` must be a path"):
        RecordStore(42)
