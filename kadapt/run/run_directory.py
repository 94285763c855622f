"""`RunDirectory`: the files of one `kadapt train` run, and their rules.

Layout: `config.json` (the resolved config), `run.json` (status and results),
`history.json` (Keras History, per epoch), `steps.jsonl` (per optimizer step),
`meta_decisions.jsonl` (MetaAdjuster decisions), `probe.json` (the probe
table), `model.keras` (it takes raw rows), `classes.json` (string labels'
names), `training.png`, `probe.png`, `tensorboard/`,
`backup/` (Keras `BackupAndRestore`, while a run is unfinished) and
`run.lock` (`kadapt.run.run_lock`: the run that owns the directory).

`run.json`'s `status` goes probing -> training -> completed, or ends at
interrupted (Ctrl-C; `--resume` continues) or failed (with the `error`).

One run owns a directory (`claim`); it alone writes there. Every file but
the `.jsonl` logs is written whole (`whole_file`): a reader sees the last
version or the one before, never half of one, and a killed run leaves the
last whole version behind. The logs grow a whole line at a time.
"""

import contextlib
import json
import os
import shutil
from pathlib import Path

from kadapt.run.errors import UsageError
from kadapt.run.run_lock import LOCK
from kadapt.run.run_lock import RunLock

CONFIG = "config.json"
RUN = "run.json"
HISTORY = "history.json"
STEPS = "steps.jsonl"
META_DECISIONS = "meta_decisions.jsonl"  # kadapt.meta.live.decision_log.DECISIONS_FILE (that import loads Keras)
PROBE = "probe.json"
MODEL = "model.keras"
# The network as it trains, with kadapt's optimizer and its state: `kadapt.load_model(RUN, for_training=True)`.
TRAINING_MODEL = "training.keras"
CLASSES = "classes.json"  # the class names of string labels, index = the class the network outputs
TRAINING_PLOT = "training.png"
PROBE_PLOT = "probe.png"
TENSORBOARD = "tensorboard"
BACKUP = "backup"
TEMPORARY = ".kadapt-tmp."  # the prefix of a file being written (`whole_file`)
ACTIVE = ("probing", "training")  # `run.json`'s status while a run is at work


class RunDirectory:
    """A run directory at `path` (it need not exist yet).

    Args:
        path: String or `Path`.
    """

    def __init__(self, path):
        self.path = Path(path)

    def __truediv__(self, name):
        return self.path / name

    def claim(self, overwrite=False, resume=False):
        """Takes the directory for this process's run: returns `(RunLock, replace)`,
        `replace` as `check_new_run` returns it. Raises `UsageError`, having
        written nothing, while another run holds it or where no run may start.

        The lock is held until `RunLock.release` or the end of the process."""
        lock = RunLock.acquire(self.path, create=False)
        if lock is None:
            self.check_new_run(overwrite, resume)  # before the lock file is made: a refused folder stays as it was
            lock = RunLock.acquire(self.path)
        try:
            return lock, self.check_new_run(overwrite, resume)  # again under the lock, where no run can start meanwhile
        except BaseException:
            lock.release()
            raise

    def holder(self):
        """The process id of the run at work here (0 before it recorded it), or `None`."""
        return RunLock.holder(self.path)

    def check_new_run(self, overwrite=False, resume=False):
        """Raises `UsageError` unless a run may start (or resume) here; writes nothing.

        Returns whether the directory is to be emptied before the run starts:
        with `overwrite`, and for the run directory of a run that failed or
        was stopped before its first step (it holds nothing to resume, so a
        corrected command starts it afresh)."""
        if overwrite and resume:
            raise UsageError("--overwrite and --resume exclude each other: pick one.")
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--out {self.path} exists and is not a directory.")
        if resume:
            self._check_resumable()
            self._check_writable()
            return False
        if self.path.exists() and self._files():
            if (self / CONFIG).is_file() and not self.has_trained():
                return True
            if not overwrite:
                raise UsageError(
                    f"--out {self.path} already exists: pass --overwrite to replace it, "
                    "or --resume to continue it."
                )
            if not (self / CONFIG).is_file():
                raise UsageError(
                    f"--out {self.path} is not empty and holds no {CONFIG}: it is not a kadapt "
                    "run directory, so --overwrite will not delete it."
                )
        self._check_writable()
        return overwrite

    def has_trained(self):
        """Whether a step of the run finished here: a step logged, an epoch checkpointed or a model saved."""
        steps, backup = self / STEPS, self / BACKUP
        return ((steps.is_file() and steps.stat().st_size > 0) or (self / MODEL).exists()
                or (backup.is_dir() and any(backup.iterdir())))

    def create(self, overwrite=False):
        """Makes the directory, emptied first with `overwrite`, else of the
        temporary files a killed run left; the lock file stays."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for path in self.path.iterdir():
                if path.name == LOCK or not (overwrite or path.name.startswith(TEMPORARY)):
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        except OSError as error:
            raise UsageError(f"--out {self.path} cannot be written: {error.strerror or error}.") from None

    def _files(self):
        """What the directory holds but its lock file and the temporary files of a killed run."""
        return [path for path in self.path.iterdir() if path.name != LOCK and not path.name.startswith(TEMPORARY)]

    def read_json(self, name, default=None):
        path = self / name
        if not path.is_file():
            return default
        try:
            return json.loads(path.read_text())
        except ValueError:
            raise UsageError(f"{path} is not valid JSON.") from None

    def write_json(self, name, value):
        """Writes `name` whole (`whole_file`)."""
        with whole_file(self / name) as temporary:
            temporary.write_text(json.dumps(value, indent=1, default=_plain) + "\n")

    def update_run(self, **fields):
        """Merges `fields` into `run.json`."""
        self.write_json(RUN, {**self.read_json(RUN, {}), **fields})

    def read_jsonl(self, name):
        """The JSON objects of a `.jsonl` file, one a line (none when it is missing)."""
        path = self / name
        if not path.is_file():
            return []
        records = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                raise UsageError(f"{path} line {number} is not JSON.") from None
        return records

    def _check_resumable(self):
        if not (self / CONFIG).is_file():
            raise UsageError(f"--resume: {self.path} holds no {CONFIG}, so there is no run to resume.")
        status = self.read_json(RUN, {}).get("status")
        if status == "completed":
            raise UsageError(
                f"--resume: the run in {self.path} has completed; use --overwrite to train it again."
            )

    def _check_writable(self):
        ancestor = self.path.absolute()
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            raise UsageError(f"--out {self.path} cannot be created: {ancestor} is not a writable directory.")
        if os.statvfs(ancestor).f_flag & os.ST_RDONLY:
            raise UsageError(f"--out {self.path} cannot be written: {ancestor} is on a read-only file system. "
                             "Pick another --out.")

    def check_space(self, needed):
        """Raises `UsageError` where the directory's file system has less than `needed` bytes free."""
        free = shutil.disk_usage(self.path).free
        if free < needed:
            raise UsageError(f"--out {self.path} is on a file system with {free / 2**20:.1f} MiB free, and the run "
                             f"writes about {needed / 2**20:.1f} MiB (model.keras, checkpoints, logs): free some "
                             "space, or pick another --out.")


@contextlib.contextmanager
def whole_file(path):
    """Yields a temporary path beside `path` to write; renames it onto `path`
    (`os.replace`) once the block ends without error, else removes it.

    A reader of `path` opens the last whole version or the new one, never half
    of one; a process killed while writing leaves the last whole version (and
    a temporary file that `RunDirectory.create` clears). The temporary name
    keeps the suffix: Keras and matplotlib read the format from it.

    Example:

    ```python
    with whole_file(run / "model.keras") as temporary:
        model.save(temporary)
    ```
    """
    path = Path(path)
    temporary = path.with_name(f"{TEMPORARY}{os.getpid()}.{path.name}")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _plain(value):
    """JSON for NumPy scalars and arrays."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
