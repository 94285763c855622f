"""`RunLock`: one run owns its run directory.

`kadapt train` holds an exclusive `fcntl.flock` on `run.lock` inside the run
directory for its whole life. The kernel releases the lock when the process
ends, however it ends (kill -9 too), so a dead run never leaves a stale lock:
the next run takes it. The file holds the owner's process id, which a refused
process names.

A lock belongs to the open file, not to a process: the workers of one
`--workers` run inherit their launcher's open lock file (`inheritance`) and
share its lock, which lasts until the last of them ends.

Readers (`kadapt report`, `kadapt predict`) ask `holder`, which takes a shared
lock for an instant; `acquire` therefore waits up to `WAIT_SECONDS` before it
concludes that another run holds the directory.
"""

import fcntl
import os
import time
import weakref
from pathlib import Path

from kadapt.run.errors import UsageError

LOCK = "run.lock"
INHERITED = "KADAPT_RUN_LOCK_FD"  # in a worker: the launcher's open lock file (a file descriptor)
WAIT_SECONDS = 0.5  # a reader's shared lock lasts microseconds; an owner's lasts the run
RETRY_SECONDS = 0.01


class RunLock:
    """The exclusive lock this process holds on the run directory `directory`.

    Made by `acquire`. `release` gives it up; so does the end of the process.

    Args:
        directory: `Path`. The run directory.
        descriptor: Int. The open `run.lock`, locked.
        made: Tuple of `Path`. The directories `acquire` created, deepest first.
    """

    def __init__(self, directory, descriptor, made=()):
        self.directory, self.descriptor, self.made = Path(directory), descriptor, tuple(made)
        self._close = weakref.finalize(self, os.close, descriptor)  # an abandoned lock is released

    @classmethod
    def acquire(cls, directory, create=True):
        """Locks `directory`, made with its parents where missing; `None` when
        `create` is false and it holds no `run.lock`. Raises `UsageError` while
        another run holds it.

        In a worker of a `--workers` run, the launcher's inherited lock."""
        directory = Path(directory)
        inherited = _inherited(directory)
        if inherited is not None:
            return cls(directory, inherited)
        if not create and not (directory / LOCK).is_file():
            return None
        try:
            descriptor, made = _open_locked(directory)
        except OSError as error:
            raise UsageError(f"--out {directory} cannot be written: {error.strerror or error}.") from None
        _record_pid(descriptor, directory)
        return cls(directory, descriptor, made)

    @staticmethod
    def holder(directory):
        """The process id of the run that holds `directory` (0 when it has not
        recorded it yet), or `None` when no run does."""
        try:
            descriptor = os.open(Path(directory) / LOCK, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # closing the file below releases this shared lock
        except BlockingIOError:
            return _recorded_pid(descriptor) or 0
        finally:
            os.close(descriptor)

    def inheritance(self):
        """`(environment variables, file descriptors)` that give a child process this lock:
        pass both to `subprocess.Popen` (`env`, `pass_fds`)."""
        return {INHERITED: str(self.descriptor)}, (self.descriptor,)

    def release(self):
        """Gives the directory up. Where `acquire` made it and it holds nothing
        but the lock file (a run refused before it wrote anything), removes it."""
        if self._close.alive and self.made and _holds_only_the_lock(self.directory):
            (self.directory / LOCK).unlink()
            for directory in self.made:
                try:
                    directory.rmdir()
                except OSError:  # another run made something in it meanwhile
                    break
        self._close()


def _holds_only_the_lock(directory):
    try:
        return [path.name for path in directory.iterdir()] == [LOCK]
    except FileNotFoundError:
        return False


def _inherited(directory):
    """The lock file descriptor this worker inherited for `directory`, else `None`."""
    text = os.environ.get(INHERITED, "")
    if not text.isdigit():
        return None
    try:
        if not _same(os.fstat(int(text)), os.stat(directory / LOCK)):
            return None
        os.set_inheritable(int(text), False)  # this worker's own children hold no part of the run's lock
    except OSError:
        return None
    return int(text)


def _open_locked(directory):
    """`(descriptor, directories made)`: `run.lock` in `directory`, made where missing, locked.
    Raises `UsageError` while another run holds it."""
    while True:
        made = _make_directories(directory)
        try:
            descriptor = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # a refused run removed the directory it had made: make it again
            continue
        if not _lock(descriptor, fcntl.LOCK_EX):
            pid = _recorded_pid(descriptor)
            os.close(descriptor)
            raise UsageError(f"--out {directory} is in use: {_process(pid)} is training a run in it (it holds "
                             f"{directory / LOCK}). Wait for it to end, or pick another --out.")
        if _is_linked(descriptor, directory / LOCK):
            return descriptor, made
        os.close(descriptor)  # locked a file that a refused run unlinked meanwhile: lock the one there now


def _make_directories(directory):
    """Makes `directory` and its missing parents; returns those it made, deepest first."""
    missing = [path for path in (directory, *directory.parents) if not path.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    return tuple(missing)


def _lock(descriptor, operation):
    """Takes `operation` (a `fcntl.LOCK_*`) on `descriptor`; `False` if another holds it all `WAIT_SECONDS`."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(RETRY_SECONDS)


def _is_linked(descriptor, path):
    try:
        return _same(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False


def _same(one, other):
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _record_pid(descriptor, directory):
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    except OSError as error:
        os.close(descriptor)
        raise UsageError(f"--out {directory} cannot be written: {error.strerror or error}.") from None


def _recorded_pid(descriptor):
    """The process id in the lock file; the owner writes it just after it locks, so a
    moment is allowed for it. 0 when there is none."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        text = os.pread(descriptor, 32, 0).decode(errors="replace").strip()
        if text.isdigit() or time.monotonic() > deadline:
            return int(text) if text.isdigit() else 0
        time.sleep(RETRY_SECONDS)


def _process(pid):
    return f"process {pid}" if pid else "another process"
