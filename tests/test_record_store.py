import dataclasses
import hashlib
import json
import multiprocessing
import os
import pickle
import signal
import sqlite3
import time

import numpy as np
import pytest

from kadapt.meta.model.adjustment_record import AdjustmentRecord
from kadapt.meta.records.record_store import RecordStore
from kadapt.meta.records.record_store import RecordStoreError

# Fork, not spawn: a spawned child would import TensorFlow again through kadapt.
FORK = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Replaces conftest's per-test Keras reset, which these Keras-free tests do not need."""
    yield


def _record(run_id="run-0", step=0, family="digits", multiplier=0.3, features=None):
    return AdjustmentRecord(
        run_id=run_id,
        task=f"{family}/mlp/sgd/lr=0.5",
        family=family,
        step=step,
        features=np.full((4, 3), step, "float32") if features is None else features,
        hyperparameters={"learning_rate": 0.5, "momentum": 0.9},
        adjustment={"learning_rate_multiplier": multiplier, "momentum": None},
        outcome={"loss_before": 1.25, "loss_after": 0.75, "diverged": False},
    )


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_record_round_trips_through_dict_with_nan():
    record = _record(features=np.array([[1.0, np.nan], [2.0, 3.0]]))
    data = json.loads(json.dumps(record.to_dict()))
    assert data["features"] == [[1.0, None], [2.0, 3.0]]
    assert AdjustmentRecord.from_dict(data) == record


def test_record_holds_a_read_only_float32_copy_of_features():
    features = np.ones((2, 2))
    record = _record(features=features)
    features[0, 0] = 5.0
    assert record.features.dtype == np.float32 and record.features[0, 0] == 1.0
    assert not record.features.flags.writeable


def test_record_holds_plain_json_copies_of_dicts():
    outcome = {"betas": (np.float32(0.5), np.int64(2))}
    record = dataclasses.replace(_record(), outcome=outcome)
    assert record.outcome == {"betas": [0.5, 2]}
    assert type(record.outcome["betas"][1]) is int


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("run_id", 3, TypeError, "Argument `run_id` must be a str. Received: run_id=3"),
        ("task", "", ValueError, "Argument `task` must be a non-empty str"),
        ("step", -1, ValueError, "Argument `step` must be an int >= 0. Received: step=-1"),
        ("features", np.zeros(3), ValueError, r"features.shape=\(3,\)"),
        ("features", [["a"]], TypeError, "Argument `features` must be an array of real numbers"),
        ("features", [[1.0, np.inf]], ValueError, "Received: features with 1 infinite values"),
        ("hyperparameters", [("lr", 1)], TypeError, "Argument `hyperparameters` must be a dict"),
        ("adjustment", {"m": object()}, TypeError, "Argument `adjustment` must hold only JSON"),
        ("outcome", {1: 2.0}, TypeError, "Argument `outcome` must have str keys only"),
    ],
)
def test_bad_record_field_is_named(field, value, error, message):
    with pytest.raises(error, match=message):
        dataclasses.replace(_record(), **{field: value})


def test_from_dict_names_missing_keys():
    data = _record().to_dict()
    del data["outcome"]
    with pytest.raises(ValueError, match="Argument `data` must be a dict with exactly the keys"):
        AdjustmentRecord.from_dict(data)


def test_store_returns_records_in_order(tmp_path):
    records = [
        _record(step=2, features=np.array([[np.nan, 1.0]])),
        _record(step=1, family="wine"),
        _record(step=2, multiplier=3.0),
    ]
    with RecordStore(tmp_path / "records.sqlite") as store:
        store.append(records[0])
        store.append_many(records[1:])
        assert list(store) == records
        assert store.count() == len(store) == 3
        assert store.families() == ["digits", "wine"]


def test_nan_in_outcome_survives_the_store(tmp_path):
    record = dataclasses.replace(_record(), outcome={"loss_after": float("nan")})
    with RecordStore(tmp_path / "records.sqlite") as store:
        store.append(record)
        assert list(store) == [record]


def test_empty_store(tmp_path):
    with RecordStore(tmp_path / "records.sqlite") as store:
        assert (store.count(), list(store), store.families()) == (0, [], [])


def test_contains_finds_runs_and_decision_points(tmp_path):
    with RecordStore(tmp_path / "records.sqlite") as store:
        store.append(_record(run_id="run-1", step=10))
        assert store.contains("run-1") and store.contains("run-1", np.int64(10))
        assert not store.contains("run-1", 11)
        assert not store.contains("run-2") and not store.contains("run-2", 10)


def test_duplicate_fails_and_append_many_is_all_or_nothing(tmp_path):
    with RecordStore(tmp_path / "records.sqlite") as store:
        store.append(_record(step=0))
        with pytest.raises(ValueError, match=r"records\[1\] is already in .*step=0"):
            store.append_many([_record(step=1), _record(step=0)])
        assert list(store) == [_record(step=0)]


def test_append_rejects_a_dict(tmp_path):
    with RecordStore(tmp_path / "records.sqlite") as store:
        with pytest.raises(TypeError, match="Argument `record` must be an AdjustmentRecord"):
            store.append(_record().to_dict())


def test_store_file_is_wal_with_marker_and_version(tmp_path):
    RecordStore(tmp_path / "records.sqlite").close()
    connection = sqlite3.connect(tmp_path / "records.sqlite")
    assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    meta = dict(connection.execute("SELECT key, value FROM meta"))
    assert meta == {"format": "kadapt-records", "schema_version": "1"}  # text in every engine
    connection.close()


def test_closed_store_refuses_calls(tmp_path):
    with RecordStore(tmp_path / "records.sqlite") as store:
        pass
    with pytest.raises(ValueError, match=r"RecordStore\('.*records.sqlite'\) is closed"):
        store.count()


def test_store_survives_pickling(tmp_path):
    with RecordStore(tmp_path / "records.sqlite") as store:
        store.append(_record())
        assert list(pickle.loads(pickle.dumps(store))) == [_record()]


def test_jsonl_export_then_import_into_new_store_is_equal(tmp_path):
    records = [_record(step=1, features=np.array([[np.nan]])), _record(step=2, family="wine")]
    with RecordStore(tmp_path / "a.sqlite") as source, RecordStore(tmp_path / "b.sqlite") as copy:
        source.append_many(records)
        assert source.export_jsonl(tmp_path / "records.jsonl") == 2
        assert copy.import_jsonl(tmp_path / "records.jsonl") == 2
        assert list(copy) == records


@pytest.mark.parametrize("bad_line", ["{not json", '{"run_id": "run-9"}'])
def test_malformed_jsonl_line_is_named_and_nothing_imported(tmp_path, bad_line):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(_record().to_dict())
    path.write_text(f"{good}\n{bad_line}\n{json.dumps(_record(step=5).to_dict())}\n")
    with RecordStore(tmp_path / "records.sqlite") as store:
        with pytest.raises(ValueError, match=r"bad\.jsonl, line 2 is not an adjustment record"):
            store.import_jsonl(path)
        assert store.count() == 0


def _append_fifty(store, worker, start):
    start.wait(timeout=30)
    for step in range(50):
        store.append(_record(run_id=f"worker-{worker}", step=step))


def test_processes_appending_at_once_lose_nothing(tmp_path):
    store = RecordStore(tmp_path / "records.sqlite")
    start = FORK.Event()
    workers = [FORK.Process(target=_append_fifty, args=(store, i, start)) for i in range(4)]
    for worker in workers:
        worker.start()
    start.set()
    while any(worker.is_alive() for worker in workers):
        assert store.count() <= 200  # the parent reads while the children write
        time.sleep(0.01)
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    keys = {(record.run_id, record.step) for record in store}
    assert store.count() == 200
    assert keys == {(f"worker-{i}", step) for i in range(4) for step in range(50)}


def _append_around_the_parent_closing(store, appended, closed):
    store.append(_record(step=1))
    appended.set()
    closed.wait(timeout=30)
    store.append(_record(step=2))


def test_child_commits_survive_the_parent_closing_its_store(tmp_path):
    # A connection open in the parent at fork() would make SQLite delete the WAL
    # under the child when the parent closes it, losing the child's next commit.
    store = RecordStore(tmp_path / "records.sqlite")
    store.append(_record(step=0))
    appended, closed = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_append_around_the_parent_closing, args=(store, appended, closed))
    child.start()
    appended.wait(timeout=30)
    store.close()
    closed.set()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert RecordStore(tmp_path / "records.sqlite").count() == 3


def _die_inside_a_transaction(path):
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA cache_size = 1")  # spill the uncommitted pages into the WAL
    connection.execute("BEGIN IMMEDIATE")
    for offset in range(1, 50):
        connection.execute(
            "INSERT INTO records (run_id, task, family, step, features, rows, cols, "
            "hyperparameters, adjustment, outcome, created) SELECT run_id, task, family, "
            "step + ?, features, rows, cols, hyperparameters, adjustment, outcome, created "
            "FROM records WHERE step < 1000",
            (1000 * offset,),
        )
    os.kill(os.getpid(), signal.SIGKILL)


def test_writer_killed_mid_append_loses_only_its_own_records(tmp_path):
    committed = [_record(step=step, features=np.ones((64, 16))) for step in range(10)]
    path = tmp_path / "records.sqlite"
    store = RecordStore(path)
    store.append_many(committed)
    writer = FORK.Process(target=_die_inside_a_transaction, args=(path,))
    writer.start()
    writer.join(timeout=60)
    assert writer.exitcode == -signal.SIGKILL
    assert list(store) == committed
    store.append(_record(step=10))
    assert store.count() == 11
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.parametrize(
    "create",
    ["CREATE TABLE people (name TEXT)", "CREATE TABLE meta (key TEXT, value TEXT)"],
)
def test_foreign_sqlite_file_is_refused_and_unchanged(tmp_path, create):
    path = tmp_path / "other.sqlite"
    connection = sqlite3.connect(path)
    connection.execute(create)
    connection.commit()
    connection.close()
    digest = _sha256(path)
    with pytest.raises(RecordStoreError, match="other.sqlite is not a kadapt record store"):
        RecordStore(path)
    assert _sha256(path) == digest


@pytest.mark.parametrize(
    "content",
    [b"not a database\n" * 300, b"SQLite format 3\x00" + bytes(range(256)) * 16],
)
def test_non_sqlite_or_corrupt_file_is_refused_and_unchanged(tmp_path, content):
    path = tmp_path / "records.sqlite"
    path.write_bytes(content)
    with pytest.raises(RecordStoreError, match="records.sqlite is not a kadapt record store"):
        RecordStore(path)
    assert path.read_bytes() == content


def test_empty_file_becomes_a_store(tmp_path):
    (tmp_path / "records.sqlite").touch()
    with RecordStore(tmp_path / "records.sqlite") as store:
        assert store.count() == 0


def test_other_schema_version_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "records.sqlite"
    RecordStore(path).close()
    connection = sqlite3.connect(path)
    connection.execute("UPDATE meta SET value = 2 WHERE key = 'schema_version'")
    connection.commit()
    connection.close()
    digest = _sha256(path)
    with pytest.raises(
        RecordStoreError,
        match=r"schema version 2; this kadapt reads version 1\. Export it with "
        r"`RecordStore.export_jsonl` under the kadapt version that wrote it",
    ):
        RecordStore(path)
    assert _sha256(path) == digest


def test_a_store_from_before_claims_gets_the_claims_table_and_keeps_its_records(tmp_path):
    path = tmp_path / "records.sqlite"
    with RecordStore(path) as store:
        store.append_many([_record(step=step) for step in range(3)])
    with sqlite3.connect(path) as connection:
        connection.execute("DROP TABLE claims")  # as a store written before collection had claims
    with RecordStore(path) as store:
        assert len(store) == 3 and [r.step for r in store] == [0, 1, 2]
        assert store.finished_tasks(["run-0", "run-1"]) == {"run-0"}  # stored runs count as finished
        assert store.claim_task(["run-0", "run-1"], "A", 10.0) == "run-1"
