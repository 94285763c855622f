"""Collection spread over processes: tasks claimed through the store with leases, each
collected exactly once, a dead collector's task taken over, a rerun skipping finished
tasks. Against a real PostgreSQL server (conftest's throwaway cluster) and SQLite."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kadapt import cli
from kadapt.meta import CollectionConfig
from kadapt.meta import RecordStore
from kadapt.meta import collect
from kadapt.meta.records import tasks

TINY = CollectionConfig(total_epochs=4, horizon_epochs=1, explore=0.0)  # iris: 3 steps per epoch
LEASE = 1.5  # seconds; the checks that a claim is still held run within it, even on a loaded machine
CLAIM_WAIT_SECONDS = 120  # a collector process starts TensorFlow before it claims


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        return RecordStore(tmp_path / "records.sqlite")
    return RecordStore(request.getfixturevalue("url"))


def _keys(records, task_list=None):
    names = None if task_list is None else {task.name for task in task_list}
    return sorted((r.run_id, r.step, r.adjustment["action"]) for r in records if names is None or r.run_id in names)


def _iris_tasks(count):
    return [tasks.make_task("iris", seed) for seed in range(count)]


@pytest.fixture(scope="module")
def one_collector(tmp_path_factory):
    """`_iris_tasks(4)` collected by one collector in this process: the reference. A task's records
    depend only on its place in the list, so those of the first k tasks are a collection of k."""
    reference = RecordStore(tmp_path_factory.mktemp("one-collector") / "records.sqlite")
    collect(reference, _iris_tasks(4), TINY, progress=False)
    return list(reference)


def test_a_claim_is_held_until_its_lease_runs_out_then_taken_over(store):
    names = ["task-a", "task-b"]
    assert store.claim_task(names, "A", LEASE) == "task-a"
    assert store.claim_task(names, "B", LEASE) == "task-b"
    assert store.claim_task(names, "B", LEASE) == "task-b"  # its own claim, renewed
    assert store.claim_task(["task-a"], "B", LEASE) is None  # held by A
    time.sleep(2 * LEASE)
    assert store.claim_task(["task-a"], "B", LEASE) == "task-a"  # A stopped renewing
    assert store.claims() == {"task-a": ("B", False), "task-b": ("B", False)}


def test_renewal_keeps_a_claim_and_finishing_stores_a_task_exactly_once(store, one_collector):
    name = _iris_tasks(1)[0].name
    records = [record for record in one_collector if record.run_id == name]
    assert store.claim_task([name], "A", 3 * LEASE) == name
    for _ in range(3):
        time.sleep(LEASE)
        store.renew_claims("A", 3 * LEASE)
    assert store.claim_task([name], "B", LEASE) is None  # renewed past its first lease
    assert store.finish_task(name, "A", records) == len(records)
    assert store.finish_task(name, "B", records) == 0  # a late second collector stores nothing
    assert store.claim_task([name], "B", LEASE) is None and store.finished_tasks([name, "other"]) == {name}
    assert _keys(store) == _keys(records)


def test_two_collector_processes_collect_each_task_exactly_once(url, one_collector):
    task_list = _iris_tasks(4)
    names = [task.name for task in task_list]
    shared = RecordStore(url)
    appended = collect(shared, task_list, TINY, progress=False, workers=2)
    claims = shared.claims()
    assert set(claims) == set(names) and all(finished for _, finished in claims.values())
    assert len({owner for owner, _ in claims.values()}) == 2  # both processes took tasks
    assert appended == len(shared) == len(one_collector)
    assert _keys(shared) == _keys(one_collector)
    # A rerun skips finished tasks: the collectors' loop, the same in one process as in two.
    assert collect(shared, task_list, TINY, progress=False) == 0


_COLLECTOR = textwrap.dedent("""
    import sys
    from kadapt import environment
    environment.configure_tensorflow()
    from kadapt.meta import CollectionConfig, RecordStore, collect, tasks
    config = CollectionConfig(total_epochs=30, horizon_epochs=1, explore=0.0)  # long: killed mid-task
    collect(RecordStore(sys.argv[1]), [tasks.make_task("iris", 0)], config,
            progress=False, lease_seconds=float(sys.argv[2]))
""")


def test_a_killed_collectors_task_is_taken_over_after_its_lease(url, one_collector):
    shared = RecordStore(url)
    lease = 1.0
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen([sys.executable, "-c", _COLLECTOR, url, str(lease)], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + CLAIM_WAIT_SECONDS
        while not shared.claims() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        claims = shared.claims()
        assert claims, "the collector process claimed no task"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    ((killed_task, (dead_owner, finished)),) = shared.claims().items()
    assert not finished and len(shared) == 0
    task_list = _iris_tasks(1)
    started = time.monotonic()
    collect(shared, task_list, TINY, progress=False, lease_seconds=lease)
    assert time.monotonic() - started < 120
    owner, finished = shared.claims()[killed_task]
    assert finished and owner != dead_owner
    assert _keys(shared) == _keys(one_collector, task_list)


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers must be a positive int. Received: 0"),
    (["--lease", "-1"], "--lease must be a positive number of seconds. Received: -1.0"),
])
def test_collect_flags_out_of_range_end_in_one_line(argv, message, tmp_path):
    with pytest.raises(SystemExit) as raised:
        cli.main(["meta", "collect", "--store", str(tmp_path / "r.sqlite"), "--families", "iris", *argv])
    text = str(raised.value)
    assert text.startswith("kadapt: error: ") and "\n" not in text and message in text
    assert not (tmp_path / "r.sqlite").exists()  # refused before the store is opened


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0}, "Argument `workers` must be a positive int. Received: workers=0"),
    ({"lease_seconds": float("nan")}, "Argument `lease_seconds` must be a positive number"),
])
def test_collect_arguments_out_of_range_are_refused(kwargs, message, tmp_path):
    store = RecordStore(tmp_path / "r.sqlite")
    with pytest.raises(ValueError, match=message.replace("`", ".").replace("(", ".").replace(")", ".")):
        collect(store, _iris_tasks(1), TINY, progress=False, **kwargs)
    with pytest.raises(ValueError, match="distinct names"):
        collect(store, _iris_tasks(1) * 2, TINY, progress=False)
    assert len(store) == 0
