"""One run, one directory, with real `kadapt train` processes: a second process on a run's
`--out` is refused and leaves the first's files as a lone run's; kill -9 at random moments
leaves every file whole (or absent), and `--resume` completes or says why not; a reader
polling the files while a run writes them never reads half of one.

The processes are forks of one that imported TensorFlow (tests/forked_train.py): each
costs its run, 3 to 4 s here, and not TensorFlow's import."""

import io
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_trained_alike
from kadapt.run.run_directory import TEMPORARY
from kadapt.run.run_lock import LOCK

TRIALS = 12  # moments drawn over a whole run: with 12, each third of it is hit about 4 times
EPOCHS, STEPS_PER_EPOCH = 3, 14  # 270 training rows of t.csv in batches of 16 (most of a run's time trains)
RUN_SECONDS = 120  # a run that takes longer is killed and fails the test
SERVER_SECONDS = 120  # TensorFlow's import, on a busy machine
COMMAND = ["train", "--data", "t.csv", "--target", "label", "--model", "mlp", "--epochs", str(EPOCHS), "--meta", "off",
           "--fit-verbose", "0", "--out", "run"]
PNG_SIGNATURE, PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"


class Forks:
    """The `kadapt` processes of tests/forked_train.py."""

    def __init__(self, server):
        self.server = server

    def start(self, folder, *flags, log="log.txt"):
        """Starts `kadapt train` (`COMMAND` and `flags`) in `folder`, its output into `folder / log`;
        returns its process id."""
        self._ask({"start": [*COMMAND, *flags], "cwd": str(folder), "log": str(folder / log)})
        return self._answer()["pid"]

    def wait(self, pid, kill_after=None, while_waiting=None):
        """`{"code": exit status (-9 killed), "seconds": ...}` of `pid`, killed with SIGKILL at
        `kill_after` seconds after it started; `while_waiting()` is called until it ends."""
        self._ask({"wait": pid, "kill_after": kill_after, "timeout": RUN_SECONDS})
        while while_waiting is not None and not select.select([self.server.stdout], [], [], 0)[0]:
            while_waiting()
        answer = self._answer()
        assert not answer.get("timed_out"), f"a run took over {RUN_SECONDS} s"
        return answer

    def run(self, folder, *flags, log="log.txt"):
        return self.wait(self.start(folder, *flags, log=log))

    def _ask(self, request):
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()

    def _answer(self):
        line = self.server.stdout.readline()
        assert line, "tests/forked_train.py ended"
        return json.loads(line)


@pytest.fixture(scope="module")
def forks():
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("forked_train.py"))], env=environment,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield Forks(server)
    finally:
        server.stdin.close()  # it kills what still runs
        try:
            server.wait(timeout=SERVER_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def write_table(folder):
    """`t.csv`: 300 rows of 4 numbers and a yes/no label."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).round(4)
    lines = ["a,b,c,d,label"] + [",".join(map(str, row)) + (",yes" if row[0] + row[1] > 0 else ",no") for row in x]
    (folder / "t.csv").write_text("\n".join(lines) + "\n")
    return folder


def read_whole(path):
    """What a reader gets of `path` (a file of a run directory), checked whole; `None` when it is absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if path.suffix == ".json":
        json.loads(data)
    elif path.suffix == ".jsonl":
        assert data.endswith(b"\n") or not data, f"{path} ends in half a line"
        [json.loads(line) for line in data.splitlines()]
    elif path.suffix == ".keras":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            assert archive.testzip() is None and "model.weights.h5" in archive.namelist()
    elif path.suffix == ".png":
        assert data.startswith(PNG_SIGNATURE) and data.endswith(PNG_END), f"{path} is half a PNG"
    return data


def assert_every_file_whole(run):
    """Every file a kill -9 could cut parses; the lock file, temporary files and Keras' folders aside."""
    if not run.is_dir():
        return
    for path in run.iterdir():
        if path.is_file() and path.name != LOCK and not path.name.startswith(TEMPORARY):
            try:
                read_whole(path)
            except (ValueError, zipfile.BadZipFile, AssertionError) as error:
                raise AssertionError(f"{path} is not whole after a kill: {error}") from None


@pytest.fixture(scope="module")
def lone(forks, tmp_path_factory):
    """The run alone, its `run.json` and `model.keras` read over and over while it writes them:
    `(folder, {name: whole reads}, [what was read of a file but not whole], seconds)`."""
    folder = write_table(tmp_path_factory.mktemp("lone"))
    reads, partial = {"run.json": 0, "model.keras": 0}, []

    def read():
        for name in reads:
            try:
                reads[name] += read_whole(folder / "run" / name) is not None
            except (ValueError, zipfile.BadZipFile, AssertionError) as error:
                partial.append(f"{name}: {error}")
        time.sleep(0.001)  # leaves the run the CPU it needs, so that its time is that of a lone run

    answer = forks.wait(forks.start(folder), while_waiting=read)
    assert answer["code"] == 0, (folder / "log.txt").read_text()[-3000:]
    read()
    return folder, reads, partial, answer["seconds"]


def test_a_reader_polling_a_run_never_reads_half_a_file(lone):
    _, reads, partial, _ = lone
    assert partial == []
    assert reads["run.json"] > 1 and reads["model.keras"] >= 1


def test_a_second_run_on_the_directory_is_refused_and_the_first_trains_as_a_lone_run(forks, lone, tmp_path):
    folder = write_table(tmp_path)
    run = folder / "run"
    first = forks.start(folder)
    _wait_for_owner(run, first)
    _stop(first)  # held still while the others try, so that its files do not change
    try:
        before = {path.name: path.stat().st_mtime_ns for path in run.iterdir()}
        for flags in ((), ("--overwrite",), ("--resume",)):
            assert forks.run(folder, *flags, log="second.txt")["code"] == 1
            assert (folder / "second.txt").read_text().splitlines() == [
                f"kadapt: error: --out run is in use: process {first} is training a run in it (it holds run/run.lock). "
                "Wait for it to end, or pick another --out."]
    finally:
        os.kill(first, signal.SIGCONT)
    assert before == {path.name: path.stat().st_mtime_ns for path in run.iterdir()}  # untouched

    assert forks.wait(first)["code"] == 0
    one = lone[0] / "run"
    assert sorted(path.name for path in run.iterdir()) == sorted(path.name for path in one.iterdir())
    steps = [(run / "steps.jsonl").read_text().splitlines(), (one / "steps.jsonl").read_text().splitlines()]
    assert [json.loads(line)["step"] for line in steps[0]] == list(range(EPOCHS * STEPS_PER_EPOCH))  # each once
    np.testing.assert_allclose(*[[json.loads(line)["loss"] for line in lines] for lines in steps], rtol=1e-5)
    assert_trained_alike(run, one, atol=1e-6)


def _wait_for_owner(run, pid):
    """Until process `pid` holds `run`: it records its id in the lock file once it holds it (read
    here, not locked: a reader's lock for an instant could keep the owner from its own)."""
    deadline = time.monotonic() + RUN_SECONDS
    while not (run / LOCK).is_file() or (run / LOCK).read_text().strip() != str(pid):
        assert time.monotonic() < deadline, f"process {pid} did not take {run}"
        time.sleep(0.01)


def _stop(pid):
    """Stops process `pid` (SIGSTOP) and waits until every thread of it has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + RUN_SECONDS
    while not all(state in "Tt" for state in _thread_states(pid)):
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)


def _thread_states(pid):
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            yield (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue  # a thread that ended meanwhile


def test_kill_9_at_random_moments_leaves_whole_files_and_a_run_that_resumes(forks, lone, tmp_path):
    folder = write_table(tmp_path)
    run, one = folder / "run", lone[0] / "run"
    moments = random.Random(67)
    window = lone[3]  # a whole run's time (a resumed run takes less)
    outcomes = []
    for _ in range(TRIALS):
        outcomes.append(_trial(forks, folder, kill_after=moments.uniform(0, window)))
        assert_every_file_whole(run)
        if outcomes[-1] == "completed":
            assert_trained_alike(run, one, atol=1e-6)
    assert _trial(forks, folder, kill_after=None) == "completed"  # resumed (afresh after a completed trial)
    assert_trained_alike(run, one, atol=1e-6)
    assert not list(run.glob(f"{TEMPORARY}*"))
    print(f"{TRIALS} trials: {', '.join(f'{outcomes.count(o)} {o}' for o in sorted(set(outcomes)))}")


def _trial(forks, folder, kill_after):
    """Starts the run in `folder` again (`--resume` where it holds one unfinished, `--overwrite`
    where it completed), kills it at `kill_after` seconds; returns what came of it."""
    record = _read_json(folder / "run" / "run.json")
    resumable = (folder / "run" / "config.json").is_file() and record.get("status") != "completed"
    flags = ("--resume",) if resumable else ("--overwrite",) if record else ()
    answer = forks.wait(forks.start(folder, *flags), kill_after=kill_after)
    if answer["code"] == -signal.SIGKILL:
        return "killed"
    log = (folder / "log.txt").read_text()
    if answer["code"] == 0:
        return "completed"
    assert "Traceback" not in log and log.splitlines()[-1].startswith("kadapt: error: "), log[-3000:]
    return "refused"  # said why not, in one line


def _read_json(path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
